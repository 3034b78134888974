"""The daemon's configuration: one TOML file, validated completely at start.

A file is optional: every setting has a default that works on a single host
(sockets in the runtime directory, state in the state directory, metrics on
127.0.0.1:9465). A file overrides what it names; anything it names that adaptd does
not know is an error, with a did-you-mean, so a typo never silently does nothing.

Layout (see ``systemd/adaptd.toml`` for a commented example)::

    [daemon]      socket, admin_socket, socket_mode, admin_socket_mode, socket_group,
                  state_dir, db_path, log_level, sample_interval_s, liveness_timeout_s,
                  drain_grace_s, watchdog, admin_group, curve_secret_key, curve_client_keys
    [policy]      default, gpu_mtbf_hours
    [metrics]     listen, slow_save_s, scrape_interval_s, job_series_grace_s
    [retention]   days, rows
    [jobs."PATTERN"]   policy, paused, staging, replicate_to   (PATTERN: a job id or a
                       glob; an exact id's entry wins, matching globs fill the rest)
    [storage."NAME"]   path, max_concurrent_saves
    [destinations.NAME]  url, bandwidth_mib_s, max_concurrent, keep_last,
                         keep_every_hours, storage_options   (tiered storage: where
                         the daemon replicates jobs' checkpoints, see docs/tiers.md)

:func:`load` is what ``adaptd serve`` and ``adaptd serve --check-config`` call: it
returns a frozen :class:`Config` or raises :class:`ConfigError` whose message names
the dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from adaptd import paths
from adaptd.estimators import PRIOR_GPU_MTBF_S
from adaptd.policy import DEFAULT_SPEC, PolicyError, parse

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

#: Where ``adaptd serve`` looks for a config file when none is given.
DEFAULT_CONFIG_PATH = Path("/etc/adaptd/adaptd.toml")
#: Environment variable naming a config file (used when ``--config`` is absent).
CONFIG_ENV = "ADAPTD_CONFIG"
#: The metrics address when the file does not name one.
DEFAULT_METRICS_LISTEN = "127.0.0.1:9465"
ADMIN_SOCKET_NAME = "adaptd.admin.sock"
DB_NAME = "adaptd.sqlite3"

LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_OFF = ("", "off", "none", "disabled")


class ConfigError(ValueError):
    """The configuration cannot be used; the message says where, what and what is allowed.

    ``key`` is the dotted path of the offending setting (``""`` for the file itself).
    """

    def __init__(self, message: str, *, key: str = "", source: str = "") -> None:
        prefix = f"{source}: " if source else ""
        super().__init__(prefix + message)
        self.key = key
        self.source = source


@dataclass(frozen=True)
class JobOverride:
    """Settings for jobs whose id matches ``pattern`` (exact id or shell glob).

    ``staging`` is the local directory the job's hook saves to, with ``{job}`` standing
    for the job id; the daemon replicates checkpoints from there (and only from there)
    to each destination named in ``replicate_to``.
    """

    pattern: str
    policy: str | None = None  # a policy spec, validated with adaptd.policy.parse
    paused: bool | None = None  # start the job with non-urgent saves held
    staging: str | None = None  # absolute path template; "{job}" is replaced by the id
    replicate_to: tuple[str, ...] | None = None  # names of [destinations.NAME] sections

    def staging_dir(self, job: str) -> Path | None:
        """The job's staging directory (``None``: not configured)."""
        return None if self.staging is None else Path(self.staging.replace(JOB_PLACEHOLDER, job))


#: Stands for the job id in ``jobs."PATTERN".staging``.
JOB_PLACEHOLDER = "{job}"


@dataclass(frozen=True)
class StorageTarget:
    """A named storage location the daemon watches and schedules saves on.

    ``max_concurrent_saves`` staggers saves of different jobs onto one target
    (``None``: no limit).
    """

    name: str
    path: Path
    max_concurrent_saves: int | None = None


@dataclass(frozen=True)
class Destination:
    """A durable place the daemon replicates checkpoints to (``[destinations.NAME]``).

    Each job's checkpoints go to ``<url>/<job id>``. ``bandwidth_mib_s`` caps all
    uploads to it together (``None``: no cap); ``max_concurrent`` uploads run at once
    (the rest wait, oldest first, so jobs sharing it are staggered). Remote
    retention keeps the newest ``keep_last`` checkpoints, plus one per
    ``keep_every_hours`` window when set. ``storage_options`` go to fsspec as they are.
    """

    name: str
    url: str
    bandwidth_mib_s: float | None = None
    max_concurrent: int = 1
    keep_last: int = 3
    keep_every_hours: float | None = None
    storage_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def job_url(self, job: str) -> str:
        """Where ``job``'s checkpoints go: ``<url>/<job>``."""
        return f"{self.url.rstrip('/')}/{job}"

    @property
    def bandwidth_bytes_s(self) -> float | None:
        return None if self.bandwidth_mib_s is None else self.bandwidth_mib_s * 2**20


@dataclass(frozen=True)
class Config:
    """The daemon's validated settings. Paths are absolute and already resolved."""

    socket: str  # filesystem path of the job socket, or an ipc:// / tcp:// endpoint
    admin_socket: Path
    socket_mode: int = 0o660
    admin_socket_mode: int = 0o600
    socket_group: str | None = None  # chgrp the job socket to this group (None: leave it)
    admin_group: str | None = None  # besides root and the daemon's user, who may use admin
    curve_secret_key: Path | None = None  # server's *.key_secret (CURVE, for tcp:// only)
    curve_client_keys: Path | None = None  # directory of allowed clients' public *.key files
    state_dir: Path = field(default_factory=paths.state_dir)
    db_path: Path = field(default_factory=lambda: paths.state_dir() / DB_NAME)
    log_level: str = "info"
    sample_interval_s: float = 1.0
    liveness_timeout_s: float = 300.0  # matches `serve --silence-timeout`
    drain_grace_s: float = 90.0
    watchdog: bool = True
    default_policy: str = DEFAULT_SPEC
    gpu_mtbf_s: float = PRIOR_GPU_MTBF_S
    slow_save_s: float = 1.0  # a save blocking longer counts as slow (metrics, alerts)
    scrape_interval_s: float = 60.0  # Prometheus' scrape_interval for this daemon
    job_series_grace_s: float = 120.0  # an ended job's series stay this long (2 scrapes)
    metrics_listen: tuple[str, int] | None = ("127.0.0.1", 9465)
    retention_days: float = 30.0
    retention_rows: int = 200_000
    jobs: tuple[JobOverride, ...] = ()
    storage: Mapping[str, StorageTarget] = field(default_factory=lambda: MappingProxyType({}))
    destinations: Mapping[str, Destination] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""  # the file this came from ("" for built-in defaults)

    @property
    def log_level_number(self) -> int:
        """The :mod:`logging` level for :attr:`log_level`."""
        return LOG_LEVELS[self.log_level]

    @property
    def endpoint(self) -> str:
        """The ZeroMQ endpoint the daemon binds for jobs."""
        return paths.endpoint(self.socket)

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus scrapes (``None`` when metrics are off)."""
        if self.metrics_listen is None:
            return None
        host, port = self.metrics_listen
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/metrics"

    def job_override(self, job: str) -> JobOverride | None:
        """The settings for ``job``: an exact id's entry first, then each matching glob
        in file order fills what the entries before it left unset."""
        matching = [o for o in self.jobs if o.pattern == job]
        matching += [
            o for o in self.jobs if o.pattern != job and fnmatch.fnmatchcase(job, o.pattern)
        ]
        if not matching:
            return None
        policy = next((o.policy for o in matching if o.policy is not None), None)
        paused = next((o.paused for o in matching if o.paused is not None), None)
        staging = next((o.staging for o in matching if o.staging is not None), None)
        to = next((o.replicate_to for o in matching if o.replicate_to is not None), None)
        return JobOverride(
            pattern=matching[0].pattern,
            policy=policy,
            paused=paused,
            staging=staging,
            replicate_to=to,
        )

    def replication_for(self, job: str) -> tuple[Path, tuple[Destination, ...]] | None:
        """``job``'s staging directory and the destinations it is replicated to, or
        ``None`` when the config replicates nothing of it."""
        o = self.job_override(job)
        if o is None or not o.replicate_to or o.staging is None:
            return None
        staging = o.staging_dir(job)
        assert staging is not None
        return staging, tuple(self.destinations[n] for n in o.replicate_to)

    def policy_for(self, job: str) -> str:
        """The policy spec ``job`` gets from the config (its override or the default)."""
        o = self.job_override(job)
        return o.policy if o is not None and o.policy else self.default_policy

    def with_overrides(
        self,
        *,
        socket: str | None = None,
        policy: str | None = None,
        liveness_timeout_s: float | None = None,
        log_level: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        metrics_listen: str | None = None,
        drain_grace_s: float | None = None,
    ) -> Config:
        """This config with ``adaptd serve``'s command-line flags applied (``None``:
        keep the file's value). The admin socket follows ``socket``; ``state_dir``
        moves the database with it. Raises :class:`ConfigError` naming the flag."""
        data: dict[str, Any] = {}
        if socket is not None:
            sock = os.fspath(socket)
            if sock.startswith("ipc://"):
                sock = sock.removeprefix("ipc://")
            if not sock.startswith("tcp://"):
                sock = str(Path(sock).expanduser().absolute())
            data["socket"] = sock
            data["admin_socket"] = admin_path_for(sock)
        if policy is not None:
            try:
                parse(policy)
            except PolicyError as exc:
                raise ConfigError(f"--policy {policy!r}: {exc}", key="policy.default") from None
            data["default_policy"] = policy
        if liveness_timeout_s is not None:
            if not (math.isfinite(liveness_timeout_s) and liveness_timeout_s > 0):
                raise ConfigError(
                    f"--silence-timeout must be a number of seconds > 0, got "
                    f"{liveness_timeout_s!r}",
                    key="daemon.liveness_timeout_s",
                )
            data["liveness_timeout_s"] = float(liveness_timeout_s)
        if drain_grace_s is not None:
            if not (math.isfinite(drain_grace_s) and drain_grace_s >= 0):
                raise ConfigError(
                    f"--drain-grace must be a number of seconds >= 0 (0: stop without "
                    f"draining), got {drain_grace_s!r}",
                    key="daemon.drain_grace_s",
                )
            data["drain_grace_s"] = float(drain_grace_s)
        if log_level is not None:
            if log_level.lower() not in LOG_LEVELS:
                raise ConfigError(
                    f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}",
                    key="daemon.log_level",
                )
            data["log_level"] = log_level.lower()
        if state_dir is not None:
            d = Path(state_dir).expanduser().absolute()
            data["state_dir"] = d
            data["db_path"] = d / DB_NAME
        if metrics_listen is not None:
            data["metrics_listen"] = (
                None
                if metrics_listen.strip().lower() in _OFF
                else parse_listen(metrics_listen, key="--metrics-listen")
            )
        return replace(self, **data)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view, for ``serve --check-config`` and ``status``."""
        d: dict[str, Any] = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        d["socket_mode"] = oct(self.socket_mode)
        d["admin_socket_mode"] = oct(self.admin_socket_mode)
        d["metrics_url"] = self.metrics_url
        for dest in d["destinations"].values():
            dest["storage_options"] = _redacted(dest["storage_options"])
        return d


#: storage_options keys whose values ``as_dict`` hides (credentials).
_SECRET_WORDS = ("key", "secret", "token", "password", "credential")


def _redacted(v: Any) -> Any:
    """``storage_options`` for printing: credentials replaced by ``"***"``."""
    if isinstance(v, Mapping):
        return {
            k: "***"
            if any(w in str(k).lower() for w in _SECRET_WORDS) and not isinstance(x, Mapping)
            else _redacted(x)
            for k, x in v.items()
        }
    return v


def _plain(v: Any) -> Any:
    """Dataclasses, mappings and paths as JSON-ready values."""
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


# --------------------------------------------------------------------------- loading


def default_path(env: Mapping[str, str] | None = None) -> Path | None:
    """The file ``serve`` reads without ``--config``: ``$ADAPTD_CONFIG``, else
    ``/etc/adaptd/adaptd.toml`` if it exists, else none (built-in defaults)."""
    env = os.environ if env is None else env
    if explicit := env.get(CONFIG_ENV):
        return Path(explicit)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Read and validate the config: the daemon's start and ``serve --check-config``.

    ``path=None`` uses :func:`default_path` (and pure defaults when that is none).
    Raises :class:`ConfigError` when the file is missing, unreadable, not TOML, or
    any setting is unknown or invalid.
    """
    chosen = Path(path) if path is not None else default_path()
    if chosen is None:
        return from_mapping({})
    source = str(chosen)
    try:
        raw = chosen.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            "config file not found; create it (see systemd/adaptd.toml for an example) "
            "or leave --config out to run with defaults",
            source=source,
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", source=source) from None
    return loads(raw.decode("utf-8", errors="replace"), source=source)


def loads(text: str, *, source: str = "<config>") -> Config:
    """Validate TOML ``text``; raises :class:`ConfigError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=source) from None
    return from_mapping(data, source=source)


def from_mapping(data: Mapping[str, Any], *, source: str = "") -> Config:
    """Validate an already-parsed TOML document; raises :class:`ConfigError`."""
    return _Reader(source).config(data)


# --------------------------------------------------------------------------- validation

_SECTIONS = ("daemon", "policy", "metrics", "retention", "jobs", "storage", "destinations")
_DAEMON_KEYS = (
    "socket",
    "admin_socket",
    "socket_mode",
    "admin_socket_mode",
    "socket_group",
    "state_dir",
    "db_path",
    "log_level",
    "sample_interval_s",
    "liveness_timeout_s",
    "drain_grace_s",
    "watchdog",
    "admin_group",
    "curve_secret_key",
    "curve_client_keys",
)
_POLICY_KEYS = ("default", "gpu_mtbf_hours")
_METRICS_KEYS = ("listen", "slow_save_s", "scrape_interval_s", "job_series_grace_s")
_RETENTION_KEYS = ("days", "rows")
_JOB_KEYS = ("policy", "paused", "staging", "replicate_to")
_STORAGE_KEYS = ("path", "max_concurrent_saves")
_DESTINATION_KEYS = (
    "url",
    "bandwidth_mib_s",
    "max_concurrent",
    "keep_last",
    "keep_every_hours",
    "storage_options",
)


class _Reader:
    """Walks the document, checking each key against what is allowed."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{key}: {message}", key=key, source=self.source)

    def table(self, data: Any, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            raise self.fail(where, f"must be a table, got {_show(data)}")
        for key in data:
            if key not in allowed:
                dotted = f"{where}.{key}" if where else key
                near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                listed = ", ".join(allowed)
                what = "setting" if where else "section"
                raise self.fail(dotted, f"unknown {what}{hint} (allowed here: {listed})")
        return data

    # -- typed getters: each returns the default when the key is absent

    def number(
        self,
        t: Mapping[str, Any],
        where: str,
        key: str,
        default: float,
        *,
        minimum: float,
        exclusive: bool = True,
        integer: bool = False,
    ) -> Any:
        if key not in t:
            return default
        v = t[key]
        dotted = f"{where}.{key}"
        kind = "an integer" if integer else "a number"
        ok_type = isinstance(v, int) if integer else isinstance(v, int | float)
        if isinstance(v, bool) or not ok_type or (isinstance(v, float) and not math.isfinite(v)):
            raise self.fail(dotted, f"must be {kind}, got {_show(v)}")
        if (v <= minimum) if exclusive else (v < minimum):
            bound = f"> {minimum:g}" if exclusive else f">= {minimum:g}"
            raise self.fail(dotted, f"must be {bound}, got {_show(v)}")
        return v if integer else float(v)

    def boolean(self, t: Mapping[str, Any], where: str, key: str, default: Any) -> Any:
        if key not in t:
            return default
        v = t[key]
        if not isinstance(v, bool):
            raise self.fail(f"{where}.{key}", f"must be true or false, got {_show(v)}")
        return v

    def string(self, t: Mapping[str, Any], where: str, key: str, default: Any) -> Any:
        if key not in t:
            return default
        v = t[key]
        if not isinstance(v, str):
            raise self.fail(f"{where}.{key}", f"must be a string, got {_show(v)}")
        return v

    def path(self, t: Mapping[str, Any], where: str, key: str, default: Path) -> Path:
        v = self.string(t, where, key, None)
        if v is None:
            return default
        p = Path(v).expanduser()
        if not v.strip() or not p.is_absolute():
            raise self.fail(f"{where}.{key}", f"must be an absolute path, got {_show(v)}")
        return p

    def mode(self, t: Mapping[str, Any], where: str, key: str, default: int) -> int:
        if key not in t:
            return default
        v, dotted = t[key], f"{where}.{key}"
        if isinstance(v, str):
            try:
                v = int(v, 8)
            except ValueError:
                raise self.fail(dotted, f'must be an octal mode like "0660", got {v!r}') from None
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0o777:
            raise self.fail(dotted, f"must be a file mode 0000..0777 (e.g. 0o660), got {_show(v)}")
        if not v & 0o200:
            raise self.fail(dotted, f"{oct(v)} leaves the owner unable to connect; add u+w")
        return v

    def policy_spec(self, t: Mapping[str, Any], where: str, key: str, default: Any) -> Any:
        spec = self.string(t, where, key, None)
        if spec is None:
            return default
        try:
            parse(spec)
        except PolicyError as exc:
            raise self.fail(f"{where}.{key}", f"invalid policy spec {spec!r}: {exc}") from None
        return spec

    # -- sections

    def config(self, data: Mapping[str, Any]) -> Config:
        self.table(data, "", _SECTIONS)
        d = self.table(data.get("daemon", {}), "daemon", _DAEMON_KEYS)
        p = self.table(data.get("policy", {}), "policy", _POLICY_KEYS)
        m = self.table(data.get("metrics", {}), "metrics", _METRICS_KEYS)
        r = self.table(data.get("retention", {}), "retention", _RETENTION_KEYS)

        socket = self.socket(d)
        run_dir = paths.runtime_dir()
        state_dir = self.path(d, "daemon", "state_dir", paths.state_dir())
        group = self.string(d, "daemon", "socket_group", None)
        if group is not None and not group.strip():
            raise self.fail("daemon.socket_group", "must be a group name, got an empty string")
        level = self.string(d, "daemon", "log_level", "info").lower()
        if level not in LOG_LEVELS:
            raise self.fail(
                "daemon.log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}"
            )
        sample = self.number(d, "daemon", "sample_interval_s", 1.0, minimum=0)
        liveness = self.number(d, "daemon", "liveness_timeout_s", 300.0, minimum=0)
        if liveness < sample:
            raise self.fail(
                "daemon.liveness_timeout_s",
                f"must be at least daemon.sample_interval_s ({sample:g}), got {liveness:g}",
            )
        mtbf_h = self.number(p, "policy", "gpu_mtbf_hours", PRIOR_GPU_MTBF_S / 3600, minimum=0)
        scrape = self.number(m, "metrics", "scrape_interval_s", 60.0, minimum=0)
        # 0: remove an ended job's series at once (the behaviour before the grace period)
        grace = self.number(
            m, "metrics", "job_series_grace_s", 2 * scrape, minimum=0, exclusive=False
        )
        destinations = self.destinations(data.get("destinations", {}))
        admin_group = self.string(d, "daemon", "admin_group", None)
        curve_secret = self.path(d, "daemon", "curve_secret_key", None)  # type: ignore[arg-type]
        curve_clients = self.path(d, "daemon", "curve_client_keys", None)  # type: ignore[arg-type]
        if (curve_secret is None) != (curve_clients is None):
            missing = "curve_client_keys" if curve_clients is None else "curve_secret_key"
            raise self.fail(f"daemon.{missing}", "is required too: CURVE needs both keys")
        if socket.startswith("tcp://") and curve_secret is None:
            raise self.fail(
                "daemon.socket",
                f"{socket!r}: TCP is refused without CURVE; set daemon.curve_secret_key and "
                "daemon.curve_client_keys (see docs/daemon.md), or use an ipc path",
            )
        return Config(
            socket=socket,
            admin_socket=self.admin_socket(d, socket, run_dir),
            socket_mode=self.mode(d, "daemon", "socket_mode", 0o660),
            admin_socket_mode=self.mode(d, "daemon", "admin_socket_mode", 0o600),
            socket_group=group,
            admin_group=admin_group,
            curve_secret_key=curve_secret,
            curve_client_keys=curve_clients,
            state_dir=state_dir,
            db_path=self.path(d, "daemon", "db_path", state_dir / DB_NAME),
            log_level=level,
            sample_interval_s=sample,
            liveness_timeout_s=liveness,
            # 0: stop without draining, as `serve --drain-grace 0` allows
            drain_grace_s=self.number(
                d, "daemon", "drain_grace_s", 90.0, minimum=0, exclusive=False
            ),
            watchdog=self.boolean(d, "daemon", "watchdog", True),
            default_policy=self.policy_spec(p, "policy", "default", DEFAULT_SPEC),
            gpu_mtbf_s=mtbf_h * 3600.0,
            slow_save_s=self.number(m, "metrics", "slow_save_s", 1.0, minimum=0),
            metrics_listen=self.listen(m),
            scrape_interval_s=scrape,
            job_series_grace_s=grace,
            retention_days=self.number(r, "retention", "days", 30.0, minimum=0),
            retention_rows=self.number(r, "retention", "rows", 200_000, minimum=1, integer=True,
                                       exclusive=False),
            jobs=self.jobs(data.get("jobs", {}), destinations),
            storage=self.storage(data.get("storage", {})),
            destinations=destinations,
            source=self.source,
        )  # fmt: skip

    def socket(self, d: Mapping[str, Any]) -> str:
        v = self.string(d, "daemon", "socket", None)
        if v is None:
            return str(paths.socket_path())
        if v.startswith("ipc://"):
            rest = v.removeprefix("ipc://")
            if not Path(rest).is_absolute():
                raise self.fail("daemon.socket", f"ipc endpoint needs an absolute path, got {v!r}")
            return rest
        if v.startswith("tcp://"):
            host, sep, port = v.removeprefix("tcp://").rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise self.fail(
                    "daemon.socket", f"tcp endpoint must look like tcp://HOST:PORT, got {v!r}"
                )
            return v
        if "://" in v:
            raise self.fail(
                "daemon.socket", f"must be a path, ipc://PATH or tcp://HOST:PORT, got {v!r}"
            )
        p = Path(v).expanduser()
        if not p.is_absolute():
            raise self.fail("daemon.socket", f"must be an absolute path, got {v!r}")
        return str(p)

    def admin_socket(self, d: Mapping[str, Any], socket: str, run_dir: Path) -> Path:
        """The daemon always binds its admin socket beside the job socket
        (``adaptd.sock`` -> ``adaptd.admin.sock``, where ``adaptd status`` looks), so
        ``daemon.admin_socket`` may only name that path."""
        beside = admin_path_for(socket, run_dir)
        given = self.path(d, "daemon", "admin_socket", beside)
        if given != beside:
            raise self.fail(
                "daemon.admin_socket",
                f"must be {str(beside)!r}, beside the job socket (the daemon and "
                f"`adaptd status` derive it from daemon.socket), got {str(given)!r}; "
                "remove the setting or move daemon.socket",
            )
        return beside

    def listen(self, m: Mapping[str, Any]) -> tuple[str, int] | None:
        v = m.get("listen", DEFAULT_METRICS_LISTEN)
        if v is False:
            return None
        if not isinstance(v, str):
            raise self.fail("metrics.listen", f'must be "HOST:PORT" or "off", got {_show(v)}')
        if v.strip().lower() in _OFF:
            return None
        return parse_listen(v, key="metrics.listen", fail=self.fail)

    def jobs(self, data: Any, destinations: Mapping[str, Destination]) -> tuple[JobOverride, ...]:
        if not isinstance(data, Mapping):
            raise self.fail("jobs", f'must be a table of [jobs."ID"] sections, got {_show(data)}')
        out = []
        for pattern, body in data.items():
            where = f'jobs."{pattern}"'
            t = self.table(body, where, _JOB_KEYS)
            staging = self.staging(t, where, pattern)
            replicate_to = self.replicate_to(t, where, destinations)
            if replicate_to and staging is None:
                raise self.fail(
                    f"{where}.replicate_to",
                    f"needs {where}.staging too: the local directory the job saves to "
                    '(e.g. staging = "/local/nvme/ckpts/{job}"); the daemon replicates '
                    "only from there",
                )
            out.append(
                JobOverride(
                    pattern=pattern,
                    policy=self.policy_spec(t, where, "policy", None),
                    paused=self.boolean(t, where, "paused", None),
                    staging=staging,
                    replicate_to=replicate_to,
                )
            )
        return tuple(out)

    def staging(self, t: Mapping[str, Any], where: str, pattern: str) -> str | None:
        v = self.string(t, where, "staging", None)
        if v is None:
            return None
        dotted = f"{where}.staging"
        probe = v.replace(JOB_PLACEHOLDER, "job")
        if "{" in probe or "}" in probe:
            raise self.fail(
                dotted, f"the only placeholder allowed is {JOB_PLACEHOLDER} (the job id), got {v!r}"
            )
        if not v.strip() or not Path(probe).expanduser().is_absolute():
            raise self.fail(dotted, f"must be an absolute path, got {_show(v)}")
        if JOB_PLACEHOLDER not in v and any(c in pattern for c in "*?["):
            raise self.fail(
                dotted,
                f"{pattern!r} matches many jobs, so the path needs {JOB_PLACEHOLDER} for the "
                f"job id (each job saves to its own directory), got {v!r}",
            )
        return str(Path(v).expanduser())

    def replicate_to(
        self, t: Mapping[str, Any], where: str, destinations: Mapping[str, Destination]
    ) -> tuple[str, ...] | None:
        if "replicate_to" not in t:
            return None
        v, dotted = t["replicate_to"], f"{where}.replicate_to"
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(dotted, f"must be a list of destination names, got {_show(v)}")
        for name in v:
            if name not in destinations:
                lowered = {d.lower(): d for d in destinations}
                near = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
                hint = f"; did you mean {lowered[near[0]]!r}?" if near else ""
                known = ", ".join(destinations) or "none: add a [destinations.NAME] section"
                raise self.fail(dotted, f"unknown destination {name!r}{hint} (defined: {known})")
        if len(set(v)) != len(v):
            raise self.fail(dotted, f"names a destination twice: {v!r}")
        return tuple(v)

    def destinations(self, data: Any) -> Mapping[str, Destination]:
        if not isinstance(data, Mapping):
            raise self.fail(
                "destinations",
                f"must be a table of [destinations.NAME] sections, got {_show(data)}",
            )
        out: dict[str, Destination] = {}
        for name, body in data.items():
            where = f"destinations.{name}"
            if not name or not all(c.isalnum() or c in "_-." for c in name):
                raise self.fail(
                    where, "a destination name may hold only letters, digits, '_', '-', '.'"
                )
            t = self.table(body, where, _DESTINATION_KEYS)
            if "url" not in t:
                raise self.fail(
                    f"{where}.url",
                    'is required: where checkpoints go ("s3://bucket/prefix", "/mnt/nfs/ckpts" '
                    'or "file:///...")',
                )
            keep_every = None
            if "keep_every_hours" in t:
                keep_every = self.number(t, where, "keep_every_hours", 0, minimum=0)
            bandwidth = None
            if "bandwidth_mib_s" in t:
                bandwidth = self.number(t, where, "bandwidth_mib_s", 0, minimum=0)
            options = t.get("storage_options", {})
            if not isinstance(options, Mapping):
                raise self.fail(
                    f"{where}.storage_options",
                    f"must be a table of fsspec options (e.g. {{ endpoint_url = "
                    f'"http://127.0.0.1:9000" }}), got {_show(options)}',
                )
            out[name] = Destination(
                name=name,
                url=self.url(t["url"], f"{where}.url"),
                bandwidth_mib_s=bandwidth,
                max_concurrent=self.number(t, where, "max_concurrent", 1, minimum=1,
                                           integer=True, exclusive=False),
                keep_last=self.number(t, where, "keep_last", 3, minimum=1, integer=True,
                                      exclusive=False),
                keep_every_hours=keep_every,
                storage_options=MappingProxyType(dict(options)),
            )  # fmt: skip
        return MappingProxyType(out)

    def url(self, v: Any, dotted: str) -> str:
        """A destination URL: an absolute path, ``file://``, ``s3://bucket[/prefix]`` (with
        s3fs installed) or another protocol fsspec knows."""
        if not isinstance(v, str) or not v.strip():
            raise self.fail(dotted, f"must be a URL or an absolute path, got {_show(v)}")
        scheme, sep, rest = v.partition("://")
        if not sep:
            if not Path(v).expanduser().is_absolute():
                raise self.fail(dotted, f"a local destination must be an absolute path, got {v!r}")
            return str(Path(v).expanduser())
        if scheme == "file":
            if not rest.startswith("/"):
                raise self.fail(dotted, f"file:// needs an absolute path (file:///...), got {v!r}")
            return v
        import fsspec

        if scheme not in fsspec.available_protocols():
            raise self.fail(
                dotted, f"unknown protocol {scheme!r} in {v!r} (use s3://, file:// or a path)"
            )
        if scheme in ("s3", "s3a"):
            if not rest.split("/", 1)[0]:
                raise self.fail(dotted, f"needs a bucket: s3://BUCKET[/PREFIX], got {v!r}")
            import importlib.util

            if importlib.util.find_spec("s3fs") is None:
                raise self.fail(
                    dotted,
                    f"{v!r} needs s3fs, which is not installed; pip install 'adaptd[s3]'",
                )
        return v

    def storage(self, data: Any) -> Mapping[str, StorageTarget]:
        if not isinstance(data, Mapping):
            raise self.fail(
                "storage", f'must be a table of [storage."NAME"] sections, got {_show(data)}'
            )
        out: dict[str, StorageTarget] = {}
        for name, body in data.items():
            where = f'storage."{name}"'
            t = self.table(body, where, _STORAGE_KEYS)
            if "path" not in t:
                raise self.fail(f"{where}.path", "is required (the target's mount point)")
            limit = None
            if "max_concurrent_saves" in t:
                limit = self.number(t, where, "max_concurrent_saves", 0, minimum=1, integer=True,
                                    exclusive=False)  # fmt: skip
            out[name] = StorageTarget(
                name=name, path=self.path(t, where, "path", Path("/")), max_concurrent_saves=limit
            )
        return MappingProxyType(out)


def admin_path_for(socket: str, run_dir: Path | None = None) -> Path:
    """The admin socket the daemon binds for job socket ``socket`` (a path; for a
    ``tcp://`` endpoint, ``ADMIN_SOCKET_NAME`` in the runtime directory)."""
    if socket.startswith("tcp://"):
        return (run_dir or paths.runtime_dir()) / ADMIN_SOCKET_NAME
    from adaptd.admin import admin_path

    return admin_path(socket)


def parse_listen(
    text: str,
    *,
    key: str = "listen",
    fail: Callable[[str, str], Exception] | None = None,
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


def _show(v: Any) -> str:
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
