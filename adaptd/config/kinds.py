"""The kinds of value a config setting may hold, each with its check and its message.

A kind is a function ``(check, value, dotted key, context) -> value``: it takes the
value as TOML gave it, raises :class:`ConfigError` through ``check.fail`` (naming
the key, the value as TOML writes it and what is allowed), and returns the value the
daemon uses. :mod:`adaptd.config.schema` says which setting has which kind;
:class:`~adaptd.config.check.Check` walks a document with it (a typo gets a
did-you-mean).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from adaptd.config.check import Check, ConfigError, Parse, did_you_mean, show
from adaptd.core.policy import PolicyError, parse
from adaptd.fleet.targets import not_a_mount_point, read_mounts
from adaptd.protocol import paths
from adaptd.tiers import urls

__all__ = [
    "DB_NAME",
    "JOB_PLACEHOLDER",
    "LOG_LEVELS",
    "OFF",
    "RANK_PLACEHOLDER",
    "parse_listen",
]

DB_NAME = "adaptd.sqlite3"
#: Stands for the job id in ``jobs."PATTERN".staging`` and ``.local_tier``.
JOB_PLACEHOLDER = "{job}"
#: Stands for the rank in ``jobs."PATTERN".local_tier`` (each rank its own directory).
RANK_PLACEHOLDER = "{rank}"
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
#: What ``metrics.listen`` (or ``--metrics-listen``) may say to switch metrics off.
OFF = ("", "off", "none", "disabled")


def number(
    minimum: float,
    *,
    exclusive: bool = True,
    integer: bool = False,
    maximum: float = math.inf,
    then: Callable = float,
) -> Parse:
    """A number above ``minimum`` (``exclusive``) or at least it, and at most ``maximum``;
    ``integer``: whole."""

    def parse(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> Any:
        kind = "an integer" if integer else "a number"
        ok_type = isinstance(v, int) if integer else isinstance(v, int | float)
        if isinstance(v, bool) or not ok_type or (isinstance(v, float) and not math.isfinite(v)):
            raise check.fail(dotted, f"must be {kind}, got {show(v)}")
        if (v <= minimum) if exclusive else (v < minimum):
            bound = f"> {minimum:g}" if exclusive else f">= {minimum:g}"
            raise check.fail(dotted, f"must be {bound}, got {show(v)}")
        if v > maximum:
            raise check.fail(dotted, f"must be <= {maximum:g}, got {show(v)}")
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


def text(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    """A non-empty string."""
    if not isinstance(v, str) or not v:
        raise check.fail(dotted, f"must be a non-empty string, got {show(v)}")
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
    beside = admin_beside(ctx)
    given = path(check, v, dotted, ctx)
    if given != beside:
        raise check.fail(
            dotted,
            f"must be {str(beside)!r}, beside the job socket (the daemon and "
            f"`adaptd status` derive it from daemon.socket), got {str(given)!r}; "
            "remove the setting or move daemon.socket",
        )
    return beside


def admin_beside(ctx: Mapping[str, Any]) -> Path:
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


def _job_directory(
    check: Check, v: Any, dotted: str, ctx: Mapping[str, Any], placeholders: tuple[str, ...]
) -> str:
    """An absolute directory template whose only placeholders are ``placeholders``;
    an entry whose pattern is a glob must name the job (``{job}``): each job its own."""
    v = string(check, v, dotted, ctx)
    probe = v
    for placeholder in placeholders:
        probe = probe.replace(placeholder, "x")
    if "{" in probe or "}" in probe:
        allowed = (
            f"the only placeholder allowed is {placeholders[0]} (the job id)"
            if len(placeholders) == 1
            else f"the only placeholders allowed are {' and '.join(placeholders)}"
        )
        raise check.fail(dotted, f"{allowed}, got {v!r}")
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


def staging(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    return _job_directory(check, v, dotted, ctx, (JOB_PLACEHOLDER,))


def local_tier(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    """The job's local tier (docs/tiers.md): ``{job}`` and ``{rank}`` are replaced by
    the hook, which gets it from its daemon."""
    return _job_directory(check, v, dotted, ctx, (JOB_PLACEHOLDER, RANK_PLACEHOLDER))


def beside_local_tier(parse: Parse) -> Parse:
    """A setting of the local tier (its memory share, its fallback directory): only in
    an entry that sets ``local_tier`` too."""

    def checked(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> Any:
        value = parse(check, v, dotted, ctx)
        if ctx.get("local_tier") is None:
            where = dotted.rsplit(".", 1)[0]
            raise check.fail(
                dotted,
                f"needs {where}.local_tier too: the directory of the job's local tier "
                '(e.g. local_tier = "/dev/shm/adaptd/{job}/{rank}"), which this setting is of',
            )
        return value

    return checked


def stall_cap(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> float:
    """The cap of a job's hang detection threshold: a positive duration, not below the
    entry's ``stall_floor_s`` (or the default floor)."""
    from adaptd.core.stall import DEFAULT_FLOOR_S

    value = number(0)(check, v, dotted, ctx)
    floor = ctx.get("stall_floor_s")
    floor = DEFAULT_FLOOR_S if floor is None else floor
    if value < floor:
        where = dotted.rsplit(".", 1)[0]
        raise check.fail(
            dotted,
            f"must be at least {where}.stall_floor_s ({floor:g} s: the cap of the hang "
            f"detection threshold cannot be below its floor), got {show(v)}",
        )
    return value


def replicate_to(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> tuple[str, ...]:
    destinations: Mapping[str, Any] = ctx["destinations"]
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise check.fail(dotted, f"must be a list of destination names, got {show(v)}")
    for n in v:
        if n not in destinations:
            hint = did_you_mean(n, destinations, ignore_case=True)
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
    """A destination URL (:mod:`adaptd.tiers.urls` says which are accepted): a missing
    filesystem package is found by ``--check-config``, not at the first upload."""
    if not isinstance(v, str) or not v.strip():
        raise check.fail(dotted, f"must be a URL or an absolute path, got {show(v)}")
    try:
        urls.check(v)
    except urls.UrlError as exc:
        raise check.fail(dotted, str(exc)) from None
    return v if urls.scheme_of(v) else str(Path(v).expanduser())


def options(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise check.fail(
            dotted,
            f"must be a table of fsspec options (e.g. {{ endpoint_url = "
            f'"http://127.0.0.1:9000" }}), got {show(v)}',
        )
    return MappingProxyType(dict(v))


# --------------------------------------------------------------------------- [fleet]


def etcd_urls(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> tuple[str, ...]:
    """etcd's endpoints: a URL or a list of them (their form is the fleet settings' check,
    :class:`~adaptd.fleet.session.FleetSettings`)."""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise check.fail(dotted, f"must be a list of URLs, got {show(v)}")
    return tuple(v)


def existing_file(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> str:
    """The path of a file that exists (a certificate, a key)."""
    v = text(check, v, dotted, ctx)
    if not os.path.isfile(v):
        raise check.fail(dotted, f"{v!r} is not a file")
    return v


def shared_mounts(check: Check, v: Any, dotted: str, ctx: Mapping[str, Any]) -> Mapping[str, str]:
    """``[fleet.shared]``: mount points (absolute paths) -> fleet-wide names. Each must be
    a mount point of ``ctx["mounts"]`` (default: this host's mount table, symlinks
    followed): write slots are per mount."""
    if not isinstance(v, Mapping) or not all(
        isinstance(k, str) and os.path.isabs(k) and isinstance(x, str) and x for k, x in v.items()
    ):
        raise check.fail(
            dotted,
            f'must map absolute paths to names, e.g. "/mnt/bucket" = "gcs://b", got {show(v)}',
        )
    given = ctx.get("mounts")
    mounts = read_mounts() if v and given is None else given or []
    for where in v:
        why = not_a_mount_point(where, mounts, resolve=given is None)
        if why is not None:
            raise check.fail(dotted, why)
    return MappingProxyType(dict(v))
