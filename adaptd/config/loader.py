"""The daemon's configuration: one TOML file, validated completely at start.

A file is optional: every setting has a default that works on a single host
(sockets in the runtime directory, state in the state directory, metrics on
127.0.0.1:9465). A file overrides what it names; anything it names that adaptd does
not know is an error, with a did-you-mean, so a typo never silently does nothing.

Every key, its type, default, check and meaning is declared once, in
:mod:`adaptd.config.schema`; this module reads a file with it into a frozen
:class:`Config`, applies ``adaptd serve``'s flags (:meth:`Config.with_overrides`) and
writes a config back the way the file writes it (:meth:`Config.as_dict`,
:meth:`Config.to_toml`: what ``serve --check-config`` prints). Layout (see
``systemd/adaptd.toml`` for a commented example, ``docs/operations.md`` for the
table)::

    [daemon] [policy] [metrics] [retention]   fixed sections of settings
    [jobs."PATTERN"]     per-job settings (PATTERN: a job id or a glob; an exact id's
                         entry wins, matching globs fill the rest)
    [storage."NAME"]     limits per storage target
    [destinations.NAME]  where the daemon replicates jobs' checkpoints (docs/tiers.md)
    [fleet]              daemons sharing write slots and failures through etcd
                         (docs/fleet.md; only with etcd endpoints)

:func:`load` is what ``adaptd serve`` and ``adaptd serve --check-config`` call: it
returns a :class:`Config` or raises :class:`ConfigError` whose message names the
dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from adaptd.config import toml
from adaptd.config.check import Check, ConfigError, Setting, did_you_mean, show
from adaptd.config.fleet import read_fleet
from adaptd.config.kinds import DB_NAME, JOB_PLACEHOLDER, LOG_LEVELS, OFF, parse_listen
from adaptd.config.schema import (
    DESTINATION_SETTINGS,
    FLEET_SETTINGS,
    JOB_SETTINGS,
    SECTIONS,
    SETTINGS,
    STORAGE_SETTINGS,
    TABLES,
)
from adaptd.core.policy import PolicyError, parse
from adaptd.fleet.config import FleetConfig, endpoints_from
from adaptd.protocol import paths

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG_PATH",
    "JOB_PLACEHOLDER",
    "LOG_LEVELS",
    "Config",
    "ConfigError",
    "Destination",
    "JobOverride",
    "StorageTarget",
    "admin_path_for",
    "default_path",
    "did_you_mean",
    "from_mapping",
    "load",
    "loads",
    "parse_listen",
]

#: Where ``adaptd serve`` looks for a config file when none is given.
DEFAULT_CONFIG_PATH = Path("/etc/adaptd/adaptd.toml")
#: Environment variable naming a config file (used when ``--config`` is absent).
CONFIG_ENV = "ADAPTD_CONFIG"


@dataclass(frozen=True)
class JobOverride:
    """Settings for jobs whose id matches ``pattern`` (exact id or shell glob).

    ``staging`` is the local directory the job's hook saves to, with ``{job}`` standing
    for the job id; the daemon replicates checkpoints from there (and only from there)
    to each destination named in ``replicate_to``. ``None``: not set by this entry.
    """

    pattern: str
    policy: str | None = None
    paused: bool | None = None
    staging: str | None = None
    replicate_to: tuple[str, ...] | None = None
    #: The job's local tier (two tiers), sent to its hook: ``{job}``/``{rank}`` kept.
    local_tier: str | None = None
    local_tier_memory: float | None = None
    local_tier_disk: str | None = None
    #: Hang detection (docs/multiworker.md): off, and the threshold's floor and cap.
    hang_detection: bool | None = None
    stall_floor_s: float | None = None
    stall_cap_s: float | None = None

    def staging_dir(self, job: str) -> Path | None:
        """The job's staging directory (``None``: not configured)."""
        return None if self.staging is None else Path(self.staging.replace(JOB_PLACEHOLDER, job))


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
    bandwidth_mib_s: float | None
    max_concurrent: int
    keep_last: int
    keep_every_hours: float | None
    storage_options: Mapping[str, Any]

    def job_url(self, job: str) -> str:
        """Where ``job``'s checkpoints go: ``<url>/<job>``."""
        return f"{self.url.rstrip('/')}/{job}"

    @property
    def bandwidth_bytes_s(self) -> float | None:
        return None if self.bandwidth_mib_s is None else self.bandwidth_mib_s * 2**20


@dataclass(frozen=True, kw_only=True)
class Config:
    """The daemon's validated settings. Paths are absolute and already resolved.

    Built only by :func:`from_mapping` (and :func:`load`, :func:`loads`): the defaults
    and checks are the schema's (:mod:`adaptd.config.schema`), whose fields these are.
    """

    socket: str  # filesystem path of the job socket, or a tcp:// endpoint
    curve_secret_key: Path | None
    curve_client_keys: Path | None
    admin_group: str | None
    relay_key_file: Path | None  # signs operator requests relayed to other hosts
    socket_mode: int
    socket_group: str | None
    admin_socket: Path
    admin_socket_mode: int
    state_dir: Path
    db_path: Path
    log_level: str
    sample_interval_s: float
    liveness_timeout_s: float  # matches `serve --silence-timeout`
    drain_grace_s: float
    watchdog: bool
    memory_tier_share: float  # of the host's available memory, for the jobs' memory tiers
    default_policy: str
    gpu_mtbf_s: float
    metrics_listen: tuple[str, int] | None
    slow_save_s: float
    scrape_interval_s: float  # Prometheus' scrape_interval for this daemon
    job_series_grace_s: float  # an ended job's series stay this long (2 scrapes)
    retention_days: float
    retention_rows: int
    jobs: tuple[JobOverride, ...]
    storage: Mapping[str, StorageTarget]
    destinations: Mapping[str, Destination]
    fleet: FleetConfig | None = None  # [fleet]; None: no fleet (adaptd.fleet)
    source: str  # the file this came from ("" for built-in defaults)
    #: The settings someone gave, as ``"section.key"``: in the file, or by a flag of
    #: ``adaptd serve`` (:meth:`with_overrides`); the others are the built-in defaults.
    chosen: frozenset[str] = frozenset()

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
        merged = {
            s.field: next((v for o in matching if (v := getattr(o, s.field)) is not None), None)
            for s in JOB_SETTINGS
        }
        return JobOverride(pattern=matching[0].pattern, **merged)

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
        given = {"daemon.socket": socket, "policy.default": policy,
                 "daemon.liveness_timeout_s": liveness_timeout_s, "daemon.log_level": log_level,
                 "daemon.state_dir": state_dir, "metrics.listen": metrics_listen,
                 "daemon.drain_grace_s": drain_grace_s}  # fmt: skip
        data["chosen"] = self.chosen | {key for key, value in given.items() if value is not None}
        if socket is not None:
            sock = os.fspath(socket).removeprefix("ipc://")
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
            data["liveness_timeout_s"] = _seconds_flag(
                "--silence-timeout", "daemon.liveness_timeout_s", liveness_timeout_s
            )
        if drain_grace_s is not None:
            data["drain_grace_s"] = _seconds_flag(
                "--drain-grace", "daemon.drain_grace_s", drain_grace_s, zero="stop without draining"
            )
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
                if metrics_listen.strip().lower() in OFF
                else parse_listen(metrics_listen, key="--metrics-listen")
            )
        return replace(self, **data)

    # ------------------------------------------------------------------ as the file says it

    def as_dict(self) -> dict[str, Any]:
        """The settings as the file names and writes them, JSON-ready: ``{section: {key:
        value}}`` (``None``: not set), and ``source``, the file read (``""``: none). Modes
        are ``"0660"``, the MTBF is in hours, credentials in ``storage_options`` are
        ``"***"``. ``serve --check-config --json`` prints it."""
        out: dict[str, Any] = {"source": self.source}
        for section, settings in SETTINGS.items():
            out[section] = _shown(settings, self)
        out["jobs"] = {o.pattern: _shown(JOB_SETTINGS, o) for o in self.jobs}
        out["storage"] = {n: _shown(STORAGE_SETTINGS, t) for n, t in self.storage.items()}
        out["destinations"] = {
            n: _shown(DESTINATION_SETTINGS, d) for n, d in self.destinations.items()
        }
        for dest in out["destinations"].values():
            dest["storage_options"] = _redacted(dest["storage_options"])
        if self.fleet is not None:
            out["fleet"] = _shown(FLEET_SETTINGS, self.fleet)
        return out

    def to_toml(self) -> str:
        """The settings as a config file (what ``serve --check-config`` prints): every
        key with its effective value; one that is not set is a comment. Read back, it
        gives the same settings (credentials excepted: they are ``"***"``)."""
        d = self.as_dict()
        head = f"from {self.source}" if self.source else "built-in defaults, no file"
        lines = [f"# adaptd's effective settings ({head})"]
        for section in SECTIONS:
            if section in TABLES:
                where = TABLES[section][0]
                for entry, values in d[section].items():
                    lines += ["", f"[{where.format(entry)}]", *_toml_keys(values)]
            elif section in d:  # an optional section is there only when set
                lines += ["", f"[{section}]", *_toml_keys(d[section])]
        return "\n".join(lines) + "\n"


def _seconds_flag(flag: str, key: str, value: float, *, zero: str = "") -> float:
    """A flag's number of seconds: > 0, or >= 0 when ``zero`` says what 0 means.
    Raises :class:`ConfigError` naming the flag (and ``key``, the setting it overrides)."""
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0)):
        allowed = f">= 0 (0: {zero})" if zero else "> 0"
        raise ConfigError(f"{flag} must be a number of seconds {allowed}, got {value!r}", key=key)
    return float(value)


def _shown(settings: tuple[Setting, ...], obj: Any) -> dict[str, Any]:
    return {s.key: _plain(s.shown(obj)) for s in settings}


def _toml_keys(values: Mapping[str, Any]) -> list[str]:
    return [
        f"# {k}: not set" if v is None else f"{k} = {_toml_value(v)}" for k, v in values.items()
    ]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, Mapping):
        inner = ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


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
    """Mappings, paths and tuples as JSON-ready values."""
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def admin_path_for(socket: str, run_dir: Path | None = None) -> Path:
    """The admin socket the daemon binds for job socket ``socket``
    (:func:`adaptd.protocol.paths.admin_socket_path`)."""
    return paths.admin_socket_path(socket, run_dir)


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
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=source) from None
    return from_mapping(data, source=source)


def from_mapping(data: Mapping[str, Any], *, source: str = "") -> Config:
    """Validate an already-parsed TOML document; raises :class:`ConfigError`."""
    check = Check(source)
    check.table(data, "", SECTIONS)
    values: dict[str, Any] = {}
    for section, settings in SETTINGS.items():
        table = check.table(data.get(section, {}), section, [s.key for s in settings])
        values |= check.read(settings, section, table, **values)
    _check_together(check, values)
    destinations = MappingProxyType(
        _entries(check, data, "destinations", lambda n, v: Destination(name=n, **v))
    )
    jobs = _entries(
        check, data, "jobs", lambda n, v: JobOverride(pattern=n, **v), destinations=destinations
    )
    storage = MappingProxyType(
        _entries(check, data, "storage", lambda n, v: StorageTarget(name=n, **v))
    )
    # ADAPTD_ETCD gives the endpoints without a file
    fleet = read_fleet(check, data.get("fleet"), endpoints_from(os.environ, None))
    return Config(
        **values,
        jobs=tuple(jobs.values()),
        storage=storage,
        destinations=destinations,
        fleet=fleet,
        source=source,
        chosen=frozenset(
            f"{section}.{key}" for section in SETTINGS for key in data.get(section, {})
        ),
    )


def _entries(
    check: Check, data: Mapping[str, Any], section: str, build: Any, **context: Any
) -> dict[str, Any]:
    """Each entry of a per-name table section, validated by its schema and built."""
    body = data.get(section, {})
    where, settings = TABLES[section]
    if not isinstance(body, Mapping):
        entries = where.format("ID" if section == "jobs" else "NAME")
        raise check.fail(section, f"must be a table of [{entries}] sections, got {show(body)}")
    out: dict[str, Any] = {}
    for entry, table in body.items():
        dotted = where.format(entry)
        if section == "destinations" and (
            not entry or not all(c.isalnum() or c in "_-." for c in entry)
        ):
            raise check.fail(
                dotted, "a destination name may hold only letters, digits, '_', '-', '.'"
            )
        t = check.table(table, dotted, [s.key for s in settings])
        out[entry] = build(entry, check.read(settings, dotted, t, pattern=entry, **context))
    return out


def _check_together(check: Check, v: Mapping[str, Any]) -> None:
    """The checks that involve two settings of the fixed sections."""
    if v["liveness_timeout_s"] < v["sample_interval_s"]:
        raise check.fail(
            "daemon.liveness_timeout_s",
            f"must be at least daemon.sample_interval_s ({v['sample_interval_s']:g}), "
            f"got {v['liveness_timeout_s']:g}",
        )
    if (v["curve_secret_key"] is None) != (v["curve_client_keys"] is None):
        missing = "curve_client_keys" if v["curve_client_keys"] is None else "curve_secret_key"
        raise check.fail(f"daemon.{missing}", "is required too: CURVE needs both keys")
    if v["socket"].startswith("tcp://") and v["curve_secret_key"] is None:
        raise check.fail(
            "daemon.socket",
            f"{v['socket']!r}: TCP is refused without CURVE; set daemon.curve_secret_key and "
            "daemon.curve_client_keys (see docs/daemon.md), or use an ipc path",
        )
