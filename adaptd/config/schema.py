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
  generated from here (``python -m adaptd.config.schema``) and checked by a test.

The kinds of value, each with its check and message, are in :mod:`adaptd.config.kinds`;
:mod:`adaptd.config.loader` reads a file with these (:class:`Check` walks it and suggests a
key for a typo) and builds its :class:`~adaptd.config.loader.Config` from the result.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from adaptd.config.kinds import (
    DB_NAME,
    JOB_PLACEHOLDER,
    LOG_LEVELS,
    OFF,
    Check,
    ConfigError,
    Parse,
    admin_beside,
    admin_socket,
    boolean,
    listen,
    log_level,
    mode,
    name,
    number,
    options,
    parse_listen,
    path,
    policy_spec,
    replicate_to,
    show,
    show_listen,
    show_mode,
    show_path,
    socket,
    staging,
    url,
)
from adaptd.core.estimators import PRIOR_GPU_MTBF_S
from adaptd.core.policy import DEFAULT_SPEC
from adaptd.protocol import paths

__all__ = [
    "DB_NAME",
    "DESTINATION_SETTINGS",
    "DRAIN_GRACE_S",
    "JOB_PLACEHOLDER",
    "JOB_SETTINGS",
    "LIVENESS_TIMEOUT_S",
    "LOG_LEVELS",
    "METRICS_LISTEN",
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

#: A rank silent this long is lost (``daemon.liveness_timeout_s``); also the default of
#: a daemon built without a config (:class:`adaptd.daemon.options.DaemonOptions`).
LIVENESS_TIMEOUT_S = 300.0
#: How long the SIGTERM drain may take (``daemon.drain_grace_s``).
DRAIN_GRACE_S = 90.0
#: Where the Prometheus endpoint listens unless ``metrics.listen`` says otherwise.
METRICS_LISTEN = ("127.0.0.1", 9465)


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
        Setting("relay_key_file", path, None,
                "a secret file, the same on every host (`head -c 32 /dev/urandom`, mode 0600): "
                "`set-policy`, `pause` and `resume` typed on a host that does not decide a "
                "multi-host job are relayed to the deciding host signed with it; without it "
                "they must be typed on that host (docs/multiworker.md)", "—", show=show_path),
        Setting("socket_mode", mode, 0o660, "who may connect a job", '`"0660"`',
                show=show_mode),
        Setting("socket_group", name, None,
                "the job socket's group; a group that does not exist is a start-up error",
                "the daemon's group"),
        Setting("admin_socket", admin_socket, admin_beside,
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
        Setting("liveness_timeout_s", number(0), LIVENESS_TIMEOUT_S,
                "a job silent this long is treated as gone (at least `sample_interval_s`)",
                f"{LIVENESS_TIMEOUT_S:g}"),
        # 0: stop without draining, as `serve --drain-grace 0` allows
        Setting("drain_grace_s", number(0, exclusive=False), DRAIN_GRACE_S,
                "how long the SIGTERM drain may take; 0: no drain", f"{DRAIN_GRACE_S:g}"),
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
        Setting("listen", listen, METRICS_LISTEN,
                'Prometheus endpoint; `"off"` disables it', "`{}:{}`".format(*METRICS_LISTEN),
                field_name="metrics_listen", show=show_listen),
        Setting("slow_save_s", number(0), 1.0,
                "a save that blocks the loop longer than this counts as slow", "1.0"),
        Setting("scrape_interval_s", number(0), 60.0,
                "Prometheus' `scrape_interval` for this daemon (sets the grace below)", "60"),
        # 0: remove an ended job's series at once (the behaviour before the grace period)
        Setting("job_series_grace_s", number(0, exclusive=False),
                lambda ctx: 2 * ctx["scrape_interval_s"],
                "how long a finished (or forgotten) job's series stay, so its last saves are "
                "scraped; 0: removed at once",
                "2 × `scrape_interval_s`"),
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
            "is refused) or another fsspec protocol whose filesystem is installed (`gs://` "
            "needs gcsfs: without it the config is refused). Job J's checkpoints go to "
            "`<url>/J`",
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
