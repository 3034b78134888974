"""Every setting of the config file, once: its key, type, default, check and meaning.

:data:`SETTINGS` lists the keys of the ``[daemon]``, ``[policy]``, ``[metrics]`` and
``[retention]`` sections; :data:`JOB_SETTINGS`, :data:`STORAGE_SETTINGS` and
:data:`DESTINATION_SETTINGS` the keys of each ``[jobs."PATTERN"]``,
``[storage."NAME"]`` and ``[destinations.NAME]`` table; :data:`FLEET_SETTINGS` those of
``[fleet]``, a section there only when the daemon is part of a fleet. A default that
is a fact of another part (the fleet's lease, a protocol's timeout) is that part's
constant, named here. Each :class:`Setting` says

- how a value in the file is checked and turned into the value the daemon uses
  (``parse``), with an error naming the dotted key, the value as TOML wrote it and
  what is allowed;
- its default when the file leaves it out (``default``, which may depend on the
  settings read before it: the database lives in the state directory);
- how the file writes the value back (``show``: a mode as ``"0660"``, the MTBF in
  hours), for ``adaptd serve --check-config``;
- the default and meaning shown in the table of ``docs/operations.md``, which is
  generated from here (``python -m adaptd.config.schema``) and checked by a test.

What a setting is (:class:`~adaptd.config.check.Setting`) and the walk that checks a
document against settings (:class:`~adaptd.config.check.Check`, which suggests a key for a
typo) are in :mod:`adaptd.config.check`; the kinds of value, each with its check and
message, in :mod:`adaptd.config.kinds`. :mod:`adaptd.config.loader` reads a file with
these and builds its :class:`~adaptd.config.loader.Config` from the result.
"""

from __future__ import annotations

import sys
from types import MappingProxyType

from adaptd.config.check import Setting
from adaptd.config.kinds import (
    DB_NAME,
    admin_beside,
    admin_socket,
    beside_local_tier,
    boolean,
    etcd_urls,
    existing_file,
    listen,
    local_tier,
    log_level,
    mode,
    name,
    number,
    options,
    path,
    policy_spec,
    replicate_to,
    shared_mounts,
    show_listen,
    show_mode,
    show_path,
    socket,
    staging,
    stall_cap,
    text,
    url,
)
from adaptd.core.estimators import PRIOR_GPU_MTBF_S
from adaptd.core.policy import DEFAULT_SPEC
from adaptd.fleet.config import SLOTS, this_host
from adaptd.fleet.keys import DEFAULT_PREFIX
from adaptd.fleet.session import CALL_TIMEOUT_S, LEASE_TTL_RANGE_S, LEASE_TTL_S
from adaptd.protocol import paths
from adaptd.protocol.job import LIVENESS_TIMEOUT_S

__all__ = [
    "DESTINATION_SETTINGS",
    "DRAIN_GRACE_S",
    "FLEET_SETTINGS",
    "JOB_SETTINGS",
    "LIVENESS_TIMEOUT_S",
    "MEMORY_TIER_SHARE",
    "METRICS_LISTEN",
    "OPTIONAL",
    "SCRAPE_INTERVAL_S",
    "SECTIONS",
    "SETTINGS",
    "STORAGE_SETTINGS",
    "TABLES",
    "docs_table",
]

#: How long the SIGTERM drain may take (``daemon.drain_grace_s``). (A rank silent for
#: the protocol's LIVENESS_TIMEOUT_S is lost; it is also the default of a daemon built
#: without a config, :class:`adaptd.daemon.options.DaemonOptions`.)
DRAIN_GRACE_S = 90.0
#: Default share of the host's available memory the memory tiers of all jobs may take
#: (``daemon.memory_tier_share``; the daemon splits it: :mod:`adaptd.daemon.jobs.memory_tier`).
MEMORY_TIER_SHARE = 0.25


# --------------------------------------------------------------------------- the schema

_HOURS = 3600.0
#: Defaults that other parts name too (the exporter's own defaults, ``serve``'s help).
METRICS_LISTEN = ("127.0.0.1", 9465)
SCRAPE_INTERVAL_S = 60.0

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
        Setting("memory_tier_share", number(0, maximum=1), MEMORY_TIER_SHARE,
                "the share of the host's available memory that the jobs' memory tiers may "
                "hold together, split evenly between them and sent to each on its plan "
                "([tiers.md](tiers.md))", f"{MEMORY_TIER_SHARE:g}"),
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
                'Prometheus endpoint; `"off"` disables it', f"`{show_listen(METRICS_LISTEN)}`",
                field_name="metrics_listen", show=show_listen),
        Setting("slow_save_s", number(0), 1.0,
                "a save that blocks the loop longer than this counts as slow", "1.0"),
        Setting("scrape_interval_s", number(0), SCRAPE_INTERVAL_S,
                "Prometheus' `scrape_interval` for this daemon (sets the grace below)",
                f"{SCRAPE_INTERVAL_S:g}"),
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
    Setting("local_tier", local_tier, None,
            "two tiers (see [tiers.md](tiers.md)): the absolute directory of the job's local "
            "tier, host memory on a tmpfs (`/dev/shm/adaptd/{job}/{rank}`) or a local disk; "
            "`{job}` and `{rank}` are replaced (`{job}` required in a glob entry). Sent to "
            "the job's hook when it starts, so the job saves there without a change to its "
            "script; the hook's own `local_tier` or `$ADAPTD_LOCAL_TIER` wins over it", "—"),
    Setting("local_tier_memory", beside_local_tier(number(0, maximum=1)), None,
            "the share (0-1] of the host's available memory the job's memory tier may hold "
            "(the hook's `local_tier_memory`); needs `local_tier` in the same entry",
            "the hook's"),
    Setting("local_tier_disk", beside_local_tier(local_tier), None,
            "the local-disk directory a full memory tier falls back to (`{job}`, `{rank}` "
            "replaced); needs `local_tier` in the same entry", "the hook's"),
    Setting("hang_detection", boolean, None,
            "whether the daemon frees a multi-worker job's survivors when no rank completes "
            "a step for longer than its step times make credible (see [multiworker.md]"
            "(multiworker.md#hangs-the-daemon-frees-the-survivors-in-seconds)); `false`: only "
            "the collective timeout bounds a hang", "true"),
    Setting("stall_floor_s", number(0), None,
            "the shortest silence (seconds without a step) the daemon takes for a hang of "
            "the job, whatever its step times", "7"),
    Setting("stall_cap_s", stall_cap, None,
            "the longest: past it the job is taken for hung however slow its steps were; "
            "at least `stall_floor_s`", "300"),
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


def _secret(v: str | None) -> str | None:
    return None if v is None else "***"


_LEASE_LOW, _LEASE_HIGH = LEASE_TTL_RANGE_S

#: ``[fleet]`` (docs/fleet.md): daemons on many hosts share write slots and failure
#: knowledge through etcd. Optional: without endpoints (here, ``serve --etcd`` or
#: ``$ADAPTD_ETCD``) there is no fleet. The fields are those of
#: :class:`adaptd.fleet.config.FleetConfig` (``settings.``: its etcd settings).
FLEET_SETTINGS: tuple[Setting, ...] = (
    Setting("etcd", etcd_urls, (),
            "the etcd cluster's endpoints (`http://HOST:PORT` or `https://HOST:PORT`); "
            "`serve --etcd URL` (repeatable) or `$ADAPTD_ETCD` (comma-separated) replace "
            "them. Without any there is no fleet: each daemon decides alone (needs "
            "`pip install 'adaptd[fleet]'`; see [fleet.md](fleet.md))",
            "none: no fleet", field_name="settings.endpoints", show=list),
    Setting("prefix", text, DEFAULT_PREFIX,
            "every key of this fleet lives under it (starts and ends with `/`)",
            f"`{DEFAULT_PREFIX}`", field_name="settings.prefix"),
    Setting("host", text, lambda ctx: ctx.get("hostname") or this_host(),
            "this host's name in the fleet (no `/`)", "the host name",
            field_name="settings.host"),
    Setting("user", text, None,
            "etcd user (a role per host, on its own keys: docs/fleet.md); with a password",
            "—", field_name="settings.user"),
    Setting("password", text, None,
            "the etcd user's password, or `password_file` instead; `--check-config` prints "
            "it as `***`", "—", show=_secret),
    Setting("password_file", text, None,
            "a file holding the etcd user's password (read at start)", "—"),
    Setting("ca_file", existing_file, None,
            "TLS: the CA certificate that etcd's certificate is checked against", "—",
            field_name="settings.ca_file"),
    Setting("cert_file", existing_file, None,
            "TLS: a client certificate, if etcd wants one (with `key_file`)", "—",
            field_name="settings.cert_file"),
    Setting("key_file", existing_file, None, "TLS: the client certificate's key", "—",
            field_name="settings.key_file"),
    Setting("lease_ttl_s", number(_LEASE_LOW, exclusive=False, integer=True,
                                  maximum=_LEASE_HIGH), LEASE_TTL_S,
            f"a dead daemon's write slots are free again within this ({_LEASE_LOW}-"
            f"{_LEASE_HIGH} s)", f"{LEASE_TTL_S}", field_name="settings.lease_ttl_s"),
    Setting("call_timeout_s", number(0), CALL_TIMEOUT_S,
            "one etcd request; a call over all endpoints gives up after 2.5 × this "
            "(at least 2.5 s)", f"{CALL_TIMEOUT_S}", field_name="settings.call_timeout_s"),
    Setting("slots", number(1, exclusive=False, integer=True), SLOTS,
            "saves at once, fleet-wide, on a shared target whose `[storage.\"NAME\"]` sets "
            "no `max_concurrent_saves`", f"{SLOTS}"),
    Setting("shared", shared_mounts, MappingProxyType({}),
            "`[fleet.shared]`: mount points the mount table cannot tell are shared (a FUSE "
            "bucket mount...), each with its fleet-wide name; only mount points (write "
            "slots are per mount)", "`{}`", show=dict),
)  # fmt: skip

#: The per-name tables: section -> (how its entries are named in messages, settings).
TABLES: dict[str, tuple[str, tuple[Setting, ...]]] = {
    "jobs": ('jobs."{}"', JOB_SETTINGS),
    "storage": ('storage."{}"', STORAGE_SETTINGS),
    "destinations": ("destinations.{}", DESTINATION_SETTINGS),
}
#: The sections that are there only when the file (or a flag) asks for them.
OPTIONAL: dict[str, tuple[Setting, ...]] = {"fleet": FLEET_SETTINGS}
#: Every section of the file.
SECTIONS = (*SETTINGS, *TABLES, *OPTIONAL)


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
    for section, settings in OPTIONAL.items():
        for s in settings:
            rows.append(f"| `{section}.{s.key}` | {s.default_text} | {s.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(docs_table())
