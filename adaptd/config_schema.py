"""Every setting of the config file, once: its key, type, default, check and meaning.

:data:`SETTINGS` lists the keys of the ``[daemon]``, ``[policy]``, ``[metrics]`` and
``[retention]`` sections; :data:`JOB_SETTINGS`, :data:`STORAGE_SETTINGS` and
:data:`DESTINATION_SETTINGS` the keys of each ``[jobs."PATTERN"]``,
``[storage."NAME"]`` and ``[destinations.NAME]`` table. Each :class:`Setting` says

- how a value in the file is checked and turned into the value the daemon uses
  (``parse``), with an error naming the dotted key, the value as TOML wrote it and
  what is allowed;
- its default when the file leaves it out (``default``, which may depend on the
  settings read before it: the database lives in the state directory);
- how the file writes the value back (``show``: a mode as ``"0660"``, the MTBF in
  hours), for ``adaptd serve --check-config``;
- the default and meaning shown in the table of ``docs/operations.md``, which is
  generated from here (``python -m adaptd.config_schema``) and checked by a test.

:mod:`adaptd.config` reads a file with these (:class:`Check` walks it and suggests a
key for a typo) and builds its :class:`~adaptd.config.Config` from the result.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from adaptd import paths
from adaptd.estimators import PRIOR_GPU_MTBF_S
from adaptd.policy import DEFAULT_SPEC, PolicyError, parse

__all__ = [
    "DB_NAME",
    "DESTINATION_SETTINGS",
    "JOB_PLACEHOLDER",
    "JOB_SETTINGS",
    "LOG_LEVELS",
    "OFF",
    "SECTIONS",
    "SETTINGS",
    "STORAGE_SETTINGS",
    "TABLES",
    "Check",
    "ConfigError",
    "Setting",
    "docs_table",
    "parse_listen",
    "show",
]

DB_NAME = "adaptd.sqlite3"
#: Stands for the job id in ``jobs."PATTERN".staging``.
JOB_PLACEHOLDER = "{job}"
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
#: What ``metrics.listen`` (or ``--metrics-listen``) may say to switch metrics off.
OFF = ("", "off", "none", "disabled")


class ConfigError(ValueError):
    """The configuration cannot be used; the message says where, what and what is allowed.

    ``key`` is the dotted path of the offending setting (``""`` for the file itself).
    """

    def __init__(self, message: str, *, key: str = "", source: str = "") -> None:
        prefix = f"{source}: " if source else ""
        super().__init__(prefix + message)
        self.key = key
        self.source = source


def show(v: Any) -> str:
    """A value as TOML writes it, with its TOML type: ``true (boolean)``, ``"x" (string)``."""
    kinds = {bool: "boolean", int: "integer", float: "float", str: "string"}
    kind = next((n for t, n in kinds.items() if type(v) is t), None)
    if kind is None:
        return (
            "a table"
            if isinstance(v, Mapping)
            else "an array"
            if isinstance(v, list)
            else "a value"
        )
    return f"{json.dumps(v)} ({kind})"


class Check:
    """Walks a document: each error names the file (``source``), the dotted key and the
    value; an unknown key gets a did-you-mean."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{key}: {message}", key=key, source=self.source)

    def table(self, data: Any, where: str, allowed: Sequence[str]) -> Mapping[str, Any]:
        """``data`` as a table whose keys are all ``allowed`` (``where``: its dotted name,
        ``""`` for the top level)."""
        if not isinstance(data, Mapping):
            raise self.fail(where, f"must be a table, got {show(data)}")
        for key in data:
            if key not in allowed:
                dotted = f"{where}.{key}" if where else key
                near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                listed = ", ".join(allowed)
                what = "setting" if where else "section"
                raise self.fail(dotted, f"unknown {what}{hint} (allowed here: {listed})")
        return data

    def read(
        self, settings: Sequence[Setting], where: str, data: Mapping[str, Any], **context: Any
    ) -> dict[str, Any]:
        """The settings' values from table ``data`` (dotted name ``where``), by field:
        parsed where the table has the key, the default where it has not. ``context``
        is handed to parsers and defaults beside the values read so far."""
        values: dict[str, Any] = {}
        for s in settings:
            ctx = {**context, **values}
            if s.key in data:
                values[s.field] = s.parse(self, data[s.key], f"{where}.{s.key}", ctx)
            elif s.required:
                raise self.fail(f"{where}.{s.key}", f"is required{s.required}")
            else:
                values[s.field] = s.default(ctx) if callable(s.default) else s.default
        return values


#: ``parse(check, value, dotted key, context) -> value``: check one value of the file.
Parse = Callable[[Check, Any, str, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Setting:
    """One key of a section or table. ``field``: the attribute of the config it sets
    (default: the key). ``required``: a key that must be there (the text says what it
    is: ``" (the target's mount point)"``)."""

    key: str
    parse: Parse
    default: Any
    meaning: str
    default_text: str
    field_name: str = ""
    show: Callable[[Any], Any] = lambda v: v
    required: str = ""

    @property
    def field(self) -> str:
        return self.field_name or self.key


# --------------------------------------------------------------------------- value kinds


def number(
    minimum: float, *, exclusive: bool = True, integer: bool = False, then: Callable = float
) -> Parse:
    """A number above ``minimum`` (``exclusive``) or at least it; ``integer``: whole."""

    def parse(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> Any:
        kind = "an integer" if integer else "a number"
        ok_type = isinstance(v, int) if integer else isinstance(v, int | float)
        if isinstance(v, bool) or not ok_type or (isinstance(v, float) and not math.isfinite(v)):
            raise check.fail(dotted, f"must be {kind}, got {show(v)}")
        if (v <= minimum) if exclusive else (v < minimum):
            bound = f"> {minimum:g}" if exclusive else f">= {minimum:g}"
            raise check.fail(dotted, f"must be {bound}, got {show(v)}")
        return v if integer else then(v)

    return parse


def boolean(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> bool:
    if not isinstance(v, bool):
        raise check.fail(dotted, f"must be true or false, got {show(v)}")
    return v


def string(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    if not isinstance(v, str):
        raise check.fail(dotted, f"must be a string, got {show(v)}")
    return v


def name(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    """A group's name: a non-empty string."""
    v = string(check, v, dotted, ctx)
    if not v.strip():
        raise check.fail(dotted, "must be a group name, got an empty string")
    return v


def path(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> Path:
    """An absolute path (``~`` expanded)."""
    v = string(check, v, dotted, ctx)
    p = Path(v).expanduser()
    if not v.strip() or not p.is_absolute():
        raise check.fail(dotted, f"must be an absolute path, got {show(v)}")
    return p


def mode(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> int:
    """A file mode: ``"0660"`` or ``0o660``; the owner must keep write access."""
    if isinstance(v, str):
        try:
            v = int(v, 8)
        except ValueError:
            raise check.fail(dotted, f'must be an octal mode like "0660", got {v!r}') from None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0o777:
        raise check.fail(dotted, f"must be a file mode 0000..0777 (e.g. 0o660), got {show(v)}")
    if not v & 0o200:
        raise check.fail(dotted, f"{oct(v)} leaves the owner unable to connect; add u+w")
    return v


def policy_spec(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    spec = string(check, v, dotted, ctx)
    try:
        parse(spec)
    except PolicyError as exc:
        raise check.fail(dotted, f"invalid policy spec {spec!r}: {exc}") from None
    return spec


def log_level(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    level = string(check, v, dotted, ctx).lower()
    if level not in LOG_LEVELS:
        raise check.fail(dotted, f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    return level


def socket(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    """The job socket: an absolute path, ``ipc://PATH`` or ``tcp://HOST:PORT``."""
    v = string(check, v, dotted, ctx)
    if v.startswith("ipc://"):
        rest = v.removeprefix("ipc://")
        if not Path(rest).is_absolute():
            raise check.fail(dotted, f"ipc endpoint needs an absolute path, got {v!r}")
        return rest
    if v.startswith("tcp://"):
        host, sep, port = v.removeprefix("tcp://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise check.fail(dotted, f"tcp endpoint must look like tcp://HOST:PORT, got {v!r}")
        return v
    if "://" in v:
        raise check.fail(dotted, f"must be a path, ipc://PATH or tcp://HOST:PORT, got {v!r}")
    p = Path(v).expanduser()
    if not p.is_absolute():
        raise check.fail(dotted, f"must be an absolute path, got {v!r}")
    return str(p)


def admin_socket(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> Path:
    """The daemon always binds its admin socket beside the job socket (where ``adaptd
    status`` looks), so the setting may only name that path."""
    beside = _admin_beside(ctx)
    given = path(check, v, dotted, ctx)
    if given != beside:
        raise check.fail(
            dotted,
            f"must be {str(beside)!r}, beside the job socket (the daemon and "
            f"`adaptd status` derive it from daemon.socket), got {str(given)!r}; "
            "remove the setting or move daemon.socket",
        )
    return beside


def _admin_beside(ctx: Mapping[str, Any]) -> Path:
    return paths.admin_socket_path(ctx["socket"], ctx.get("run_dir"))


def parse_listen(
    text: str, *, key: str = "listen", fail: Callable[[str, str], Exception] | None = None
) -> tuple[str, int]:
    """``"HOST:PORT"`` or ``"[V6]:PORT"`` -> ``(host, port)``; port 0 picks a free one.

    Raises :class:`ConfigError` (or what ``fail`` builds) naming ``key``.
    """
    fail = fail or (lambda k, msg: ConfigError(f"{k}: {msg}", key=k))
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise fail(key, f'must be "HOST:PORT" (e.g. "127.0.0.1:9465") or "off", got {text!r}')
    return host, int(port)


def listen(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> tuple[str, int] | None:
    if v is False:
        return None
    if not isinstance(v, str):
        raise check.fail(dotted, f'must be "HOST:PORT" or "off", got {show(v)}')
    if v.strip().lower() in OFF:
        return None
    return parse_listen(v, key=dotted, fail=check.fail)


def show_listen(v: tuple[str, int] | None) -> str:
    if v is None:
        return "off"
    host, port = v
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def show_mode(v: int) -> str:
    return f"{v:04o}"


def show_path(v: Path | None) -> str | None:
    return None if v is None else str(v)


# --------------------------------------------------------------------------- [jobs."PATTERN"]


def staging(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    v = string(check, v, dotted, ctx)
    probe = v.replace(JOB_PLACEHOLDER, "job")
    if "{" in probe or "}" in probe:
        raise check.fail(
            dotted, f"the only placeholder allowed is {JOB_PLACEHOLDER} (the job id), got {v!r}"
        )
    if not v.strip() or not Path(probe).expanduser().is_absolute():
        raise check.fail(dotted, f"must be an absolute path, got {show(v)}")
    pattern = ctx["pattern"]
    if JOB_PLACEHOLDER not in v and any(c in pattern for c in "*?["):
        raise check.fail(
            dotted,
            f"{pattern!r} matches many jobs, so the path needs {JOB_PLACEHOLDER} for the "
            f"job id (each job saves to its own directory), got {v!r}",
        )
    return str(Path(v).expanduser())


def replicate_to(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> tuple[str, ...]:
    destinations: Mapping[str, Any] = ctx["destinations"]
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise check.fail(dotted, f"must be a list of destination names, got {show(v)}")
    for n in v:
        if n not in destinations:
            lowered = {d.lower(): d for d in destinations}
            near = difflib.get_close_matches(n.lower(), list(lowered), n=1, cutoff=0.6)
            hint = f"; did you mean {lowered[near[0]]!r}?" if near else ""
            known = ", ".join(destinations) or "none: add a [destinations.NAME] section"
            raise check.fail(dotted, f"unknown destination {n!r}{hint} (defined: {known})")
    if len(set(v)) != len(v):
        raise check.fail(dotted, f"names a destination twice: {v!r}")
    if v and ctx.get("staging") is None:
        where = dotted.rsplit(".", 1)[0]
        raise check.fail(
            dotted,
            f"needs {where}.staging too: the local directory the job saves to "
            '(e.g. staging = "/local/nvme/ckpts/{job}"); the daemon replicates '
            "only from there",
        )
    return tuple(v)


# --------------------------------------------------------------------------- [destinations.NAME]


def url(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    """A destination URL: an absolute path, ``file://``, ``s3://bucket[/prefix]`` (with
    s3fs installed) or another protocol fsspec knows."""
    if not isinstance(v, str) or not v.strip():
        raise check.fail(dotted, f"must be a URL or an absolute path, got {show(v)}")
    scheme, sep, rest = v.partition("://")
    if not sep:
        if not Path(v).expanduser().is_absolute():
            raise check.fail(dotted, f"a local destination must be an absolute path, got {v!r}")
        return str(Path(v).expanduser())
    if scheme == "file":
        if not rest.startswith("/"):
            raise check.fail(dotted, f"file:// needs an absolute path (file:///...), got {v!r}")
        return v
    import fsspec

    if scheme not in fsspec.available_protocols():
        raise check.fail(
            dotted, f"unknown protocol {scheme!r} in {v!r} (use s3://, file:// or a path)"
        )
    if scheme in ("s3", "s3a"):
        if not rest.split("/", 1)[0]:
            raise check.fail(dotted, f"needs a bucket: s3://BUCKET[/PREFIX], got {v!r}")
        if importlib.util.find_spec("s3fs") is None:
            raise check.fail(
                dotted, f"{v!r} needs s3fs, which is not installed; pip install 'adaptd[s3]'"
            )
    return v


def options(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise check.fail(
            dotted,
            f"must be a table of fsspec options (e.g. {{ endpoint_url = "
            f'"http://127.0.0.1:9000" }}), got {show(v)}',
        )
    return MappingProxyType(dict(v))


# --------------------------------------------------------------------------- the schema

_HOURS = 3600.0

#: ``section -> settings`` of the fixed sections, in the order they are read (a default
#: may use the settings before it).
SETTINGS: dict[str, tuple[Setting, ...]] = {
    "daemon": (
        Setting("socket", socket, lambda ctx: str(paths.socket_path()),
                "job socket: an absolute path or `ipc://PATH`, or `tcp://HOST:PORT` with both "
                "CURVE keys below (without them it is an error)",
                "`/run/adaptd/adaptd.sock` under systemd, else "
                "`$XDG_RUNTIME_DIR/adaptd/adaptd.sock`"),
        Setting("curve_secret_key", path, None,
                "CURVE for a `tcp://` socket: the server's `*.key_secret` certificate "
                "(`zmq.auth.create_certificates`; see docs/daemon.md, \"TCP with CURVE\"). "
                "Both CURVE keys or neither", "—", show=show_path),
        Setting("curve_client_keys", path, None,
                "CURVE for a `tcp://` socket: a directory of the allowed clients' public "
                "`*.key` files", "—", show=show_path),
        Setting("admin_group", name, None,
                "a group whose members may use the admin socket besides root and the "
                "daemon's user (checked per request from the caller's credentials); the "
                "admin socket is given this group, so set `admin_socket_mode = \"0660\"` too",
                "—"),
        Setting("socket_mode", mode, 0o660, "who may connect a job", '`"0660"`',
                show=show_mode),
        Setting("socket_group", name, None,
                "the job socket's group; a group that does not exist is a start-up error",
                "the daemon's group"),
        Setting("admin_socket", admin_socket, _admin_beside,
                "operator commands. The daemon and `adaptd status` always derive the path "
                "from the job socket, so this may only name that path (anything else is an "
                "error)",
                "`adaptd.admin.sock` beside the job socket (`X.sock` → `X.admin.sock`)",
                show=show_path),
        Setting("admin_socket_mode", mode, 0o600, "who may use operator commands", '`"0600"`',
                show=show_mode),
        Setting("state_dir", path, lambda ctx: paths.state_dir(), "SQLite state",
                "`$STATE_DIRECTORY` (`/var/lib/adaptd`) or `~/.local/state/adaptd`",
                show=show_path),
        Setting("db_path", path, lambda ctx: ctx["state_dir"] / DB_NAME,
                "the state database", f"`{DB_NAME}` in `state_dir`", show=show_path),
        Setting("log_level", log_level, "info", "`debug`, `info`, `warning`, `error`",
                "`info`"),
        Setting("sample_interval_s", number(0), 1.0,
                "how often GPUs, disks and host memory are sampled", "1.0"),
        Setting("liveness_timeout_s", number(0), 300.0,
                "a job silent this long is treated as gone (at least `sample_interval_s`)",
                "300"),
        # 0: stop without draining, as `serve --drain-grace 0` allows
        Setting("drain_grace_s", number(0, exclusive=False), 90.0,
                "how long the SIGTERM drain may take; 0: no drain", "90"),
        Setting("watchdog", boolean, True, "send `WATCHDOG=1` when systemd asks for it", "true"),
    ),
    "policy": (
        Setting("default", policy_spec, DEFAULT_SPEC,
                "policy spec for jobs that name none (`adaptd policies` lists them)",
                "`default`", field_name="default_policy"),
        Setting("gpu_mtbf_hours", number(0, then=lambda h: float(h) * _HOURS), PRIOR_GPU_MTBF_S,
                "prior MTBF of one GPU (Llama 3: 419 interruptions, 16,384 GPUs, 54 days)",
                f"≈ {PRIOR_GPU_MTBF_S / _HOURS:,.0f}", field_name="gpu_mtbf_s",
                show=lambda s: round(s / _HOURS, 6)),
    ),
    "metrics": (
        Setting("listen", listen, ("127.0.0.1", 9465),
                'Prometheus endpoint; `"off"` disables it', "`127.0.0.1:9465`",
                field_name="metrics_listen", show=show_listen),
        Setting("slow_save_s", number(0), 1.0,
                "a save that blocks the loop longer than this counts as slow", "1.0"),
    ),
    "retention": (
        Setting("days", number(0), 30.0, "history kept, by age", "30",
                field_name="retention_days"),
        Setting("rows", number(1, exclusive=False, integer=True), 200_000,
                "history kept, by rows per table", "200,000", field_name="retention_rows"),
    ),
}  # fmt: skip

JOB_SETTINGS: tuple[Setting, ...] = (
    Setting("policy", policy_spec, None,
            "the policy for jobs whose id matches PATTERN (a job id or a shell glob; an exact "
            "id's entry wins, and matching globs, in file order, fill what it leaves unset). "
            "A job's starting settings: exact ids from the daemon's start, globs when the "
            "daemon first sees a matching job (each new job, not each rank or reconnect). What "
            "an operator sets with "
            "`set-policy`/`pause`/`resume` (kept in the database) wins over them", "—"),
    Setting("paused", boolean, None,
            "start the job with its non-urgent saves held (as `adaptd pause`)", "—"),
    Setting("staging", staging, None,
            "tiered storage (see [tiers.md](tiers.md)): the absolute local directory the job "
            "saves to, `{job}` standing for the job id (required in a glob entry). The daemon "
            "reads only from here, never from a path a job sends", "—"),
    Setting("replicate_to", replicate_to, None,
            "the `[destinations.NAME]` sections the daemon copies each finished checkpoint "
            "to; needs `staging` in the same entry; an unknown destination is an error with "
            "a did-you-mean", "—", show=lambda v: None if v is None else list(v)),
)  # fmt: skip

STORAGE_SETTINGS: tuple[Setting, ...] = (
    Setting("path", path, None, "a path on the storage this entry limits", "required",
            show=show_path, required=" (the target's mount point)"),
    Setting("max_concurrent_saves", number(1, exclusive=False, integer=True), None,
            "how many jobs may save at once to the storage that `path` lives on (its mount, "
            "as the telemetry samples it). The `io_aware` policy (in the default stack) "
            "defers a job's due save while that many other jobs write there; this limit wins "
            "over the policy's own `max_writers` for that mount. Several entries on one "
            "mount: the smallest limit. `adaptd status --json` shows it as the target's "
            "`max_writers`", "no limit"),
)  # fmt: skip

DESTINATION_SETTINGS: tuple[Setting, ...] = (
    Setting("url", url, None,
            "where checkpoints go: an absolute path (NFS mount), `file:///...`, "
            "`s3://BUCKET/PREFIX` (needs `pip install 'adaptd[s3]'`; without s3fs the config "
            "is refused) or another fsspec protocol. Job J's checkpoints go to `<url>/J`",
            "required",
            required=': where checkpoints go ("s3://bucket/prefix", "/mnt/nfs/ckpts" or '
            '"file:///...")'),
    Setting("bandwidth_mib_s", number(0), None,
            "MiB/s shared by all uploads to it", "no cap"),
    Setting("max_concurrent", number(1, exclusive=False, integer=True), 1,
            "uploads at once (the others wait: the job waiting longest goes first, so jobs "
            "sharing a destination take turns)", "1"),
    Setting("keep_last", number(1, exclusive=False, integer=True), 3,
            "remote retention after each upload: the newest `keep_last` steps", "3"),
    Setting("keep_every_hours", number(0), None,
            "remote retention: also keep the first step of each window of this many hours",
            "off"),
    Setting("storage_options", options, MappingProxyType({}),
            "passed to fsspec as is (`endpoint_url` for an S3-compatible server...). "
            "Credentials normally come from the environment; `--check-config` prints values "
            "of keys named like key/secret/token/password as `***`", "`{}`",
            show=lambda v: dict(v)),
)  # fmt: skip

#: The per-name tables: section -> (how its entries are named in messages, settings).
TABLES: dict[str, tuple[str, tuple[Setting, ...]]] = {
    "jobs": ('jobs."{}"', JOB_SETTINGS),
    "storage": ('storage."{}"', STORAGE_SETTINGS),
    "destinations": ("destinations.{}", DESTINATION_SETTINGS),
}
#: Every section of the file.
SECTIONS = (*SETTINGS, *TABLES)


def docs_table() -> str:
    """The settings table of docs/operations.md, generated from the schema."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for section, settings in SETTINGS.items():
        for s in settings:
            rows.append(f"| `{section}.{s.key}` | {s.default_text} | {s.meaning} |")
    for where, settings in TABLES.values():
        head = "[" + where.format("PATTERN" if where.startswith("jobs") else "NAME") + "]"
        for s in settings:
            rows.append(f"| `{head}` `{s.key}` | {s.default_text} | {s.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(docs_table())
