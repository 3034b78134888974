"""Every part ``adaptd serve`` runs, built once from one :class:`Config`, in order.

:func:`build_service` is the one place the service is put together; each part is given
the parts it works with when it is built, and the daemon itself is made by
:func:`adaptd.daemon.assembly.build` from :func:`daemon_options` and the service's seams.
In order:

1. the state database (:class:`adaptd.state.store.Store`) and the host's failure-rate
   posterior restored from it (:func:`adaptd.state.learned.restore_failure_rate`);
2. the telemetry :class:`~adaptd.telemetry.sampler.Sampler` and the daemon's job table
   (:class:`~adaptd.daemon.jobs.table.JobTable`, read through a
   :class:`~adaptd.daemon.jobs.table.RegistryView` by the parts below);
3. with a ``[fleet]``, the :class:`~adaptd.fleet.part.FleetPart` (docs/fleet.md): its
   pooled posterior is the one every tracker shares, the daemon's events go to it, its
   slot wishes go out at each tick, a granted slot wakes the daemon
   (:class:`~adaptd.daemon.waker.Waker`) and its jobs are decided again at once;
4. the :class:`~adaptd.state.learned.Learned` parameters (each new job's tracker);
5. when the config replicates checkpoints (``[destinations.NAME]`` and a job's
   ``replicate_to``), the :class:`~adaptd.tiers.replicator.Replicator`, filling the
   metrics' upload-time histogram;
6. the metrics (:class:`adaptd.metrics.exporter.Metrics`), the snapshot source
   (:class:`~adaptd.daemon.host_snapshot.HostSnapshot`) and the
   :class:`~adaptd.daemon.upkeep.Upkeep` (a sink and a tick hook);
7. the :class:`adaptd.daemon.server.Daemon`, its sinks being the store, the metrics,
   the upkeep, the replicator and the fleet.

A problem is a :class:`ServiceError` naming the setting; what was opened before it is
closed again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adaptd.config.loader import Config
from adaptd.core.stall import StallLimits
from adaptd.daemon import assembly
from adaptd.daemon.host_snapshot import HostSnapshot
from adaptd.daemon.jobs import job_config
from adaptd.daemon.jobs.rounds import StoredRounds
from adaptd.daemon.jobs.table import JobTable, RegistryView
from adaptd.daemon.options import DaemonOptions
from adaptd.daemon.sdnotify import Notifier
from adaptd.daemon.server import Daemon
from adaptd.daemon.transport import CurveKeys, DaemonError
from adaptd.daemon.upkeep import Upkeep
from adaptd.daemon.waker import Waker
from adaptd.fleet.part import FleetPart
from adaptd.logfmt import logfmt
from adaptd.metrics.exporter import Metrics, upload_histogram
from adaptd.protocol import admin
from adaptd.protocol.relay_auth import RelayKey
from adaptd.state.learned import Learned, restore_failure_rate
from adaptd.state.store import Store, StoreError

log = logging.getLogger("adaptd.server")

if TYPE_CHECKING:
    from adaptd.telemetry.sampler import Sampler
    from adaptd.tiers.replicator import Replicator

__all__ = [
    "ServiceError",
    "ServiceParts",
    "build_service",
    "configured_settings",
    "daemon_options",
    "initial_settings",
]


class ServiceError(Exception):
    """The daemon cannot start; the message names the setting and what to do."""


@dataclass(frozen=True)
class ServiceParts:
    """What :func:`build_service` made; :class:`adaptd.daemon.service.Service` runs it."""

    store: Store
    learned: Learned
    sampler: Sampler
    fleet: FleetPart | None
    replicator: Replicator | None
    metrics: Metrics
    jobs: RegistryView
    snapshot: HostSnapshot
    upkeep: Upkeep
    daemon: Daemon


def build_service(
    cfg: Config,
    *,
    notifier: Notifier,
    stopping: threading.Event,
    sampler: Sampler | None = None,
    clock: Callable[[], float],
) -> ServiceParts:
    """Every part, in order (see the module docstring); raises :class:`ServiceError`.
    ``sampler``: the telemetry sampler (default :meth:`Sampler.default` at the configured
    interval); ``stopping``: set once the service begins to shut down."""
    try:
        store = Store.open(
            cfg.db_path,
            retention_days=cfg.retention_days,
            retention_rows=cfg.retention_rows,
            owner=f"socket {cfg.socket}",  # which daemon holds it, for the one refused
        )
    except StoreError as exc:
        raise ServiceError(f"daemon.db_path: {exc}") from None
    if sampler is None:
        from adaptd.telemetry.sampler import Sampler

        sampler = Sampler.default(interval=cfg.sample_interval_s)
    try:
        return _around(cfg, store, sampler, notifier=notifier, stopping=stopping, clock=clock)
    except BaseException:
        with contextlib.suppress(Exception):
            sampler.close()
        store.close()
        raise


def _around(
    cfg: Config,
    store: Store,
    sampler: Sampler,
    *,
    notifier: Notifier,
    stopping: threading.Event,
    clock: Callable[[], float],
) -> ServiceParts:
    """The parts around the store and the sampler, and the daemon."""
    table, waker = JobTable(), Waker()
    jobs = RegistryView(table)
    rate = restore_failure_rate(store, cfg.gpu_mtbf_s)
    fleet = None
    if cfg.fleet is not None:
        fleet = FleetPart(
            cfg.fleet, failure_rate=rate, store=store, jobs=table, clock=clock,
            on_grant=waker.tick_soon,
        )  # fmt: skip
        rate = fleet.failure_rate
    learned = Learned(
        store,
        failure_rate=rate,
        gpu_mtbf_s=cfg.gpu_mtbf_s,
        host_gpus=lambda: len(sampler.latest().gpus) or None,
        bind_classes=fleet.link.knowledge.classes.bind if fleet is not None else None,
    )
    uploads = upload_histogram()
    replicator = None
    if any(o.replicate_to for o in cfg.jobs):
        from adaptd.tiers.replicator import Replicator

        replicator = Replicator(
            cfg,
            on_upload=lambda destination, job, result: uploads.labels(destination).observe(
                result.seconds
            ),
            slot_gate=fleet.link.upload_slot if fleet is not None else None,
        )
    metrics = Metrics(
        slow_save_s=cfg.slow_save_s,
        job_series_grace_s=cfg.job_series_grace_s,
        replication=None
        if replicator is None
        else lambda: (replicator.status(), replicator.throughput()),
        upload_seconds=uploads,
        collectors=[fleet.collector()] if fleet is not None else [],
    )
    snapshot = HostSnapshot(sampler=sampler, jobs=jobs, storage=cfg.storage.values(), fleet=fleet)
    upkeep = Upkeep(
        store=store, learned=learned, metrics=metrics, jobs=jobs, snapshot=snapshot,
        notifier=notifier, stopping=stopping, watchdog=cfg.watchdog, fleet=fleet,
    )  # fmt: skip
    sinks: list[Any] = [store.on_event, metrics.on_event, upkeep.on_event]
    if replicator is not None:
        sinks.append(replicator.on_event)
    if fleet is not None:
        sinks.append(fleet.link.on_event)
    seams = assembly.Seams(
        snapshot_source=snapshot,
        sinks=sinks,
        tick_hooks=[snapshot.sample, upkeep.tick],
        jobs=table,
        tracker_factory=learned.tracker_for,
        config_settings=lambda job: configured_settings(cfg, job),
        stall_limits=lambda job: stall_limits(cfg, job),
        stall_peers=fleet.peers if fleet is not None else None,
        job_config=job_config.from_overrides(cfg.job_override),
        status_extra=lambda: status_extra(snapshot(), fleet),
        replication_source=replicator.status if replicator is not None else None,
        # ``adaptd history``: queued rows are flushed first, so a save reported a
        # moment ago is there
        history_source=lambda job, since, limit: store.saves(job, since=since, limit=limit),
        decide_again=fleet.decide_again if fleet is not None else None,
        round_memory=StoredRounds(store),
        waker=waker,
    )
    try:
        daemon = assembly.build(daemon_options(cfg, store), seams)
    except DaemonError as exc:
        raise ServiceError(str(exc)) from None
    return ServiceParts(
        store=store, learned=learned, sampler=sampler, fleet=fleet, replicator=replicator,
        metrics=metrics, jobs=jobs, snapshot=snapshot, upkeep=upkeep, daemon=daemon,
    )  # fmt: skip


def daemon_options(cfg: Config, store: Store | None = None) -> DaemonOptions:
    """The daemon's options from the config's validated values, as they are (and the
    operators' settings ``store`` kept: :func:`initial_settings`). Raises
    :class:`ServiceError` for a relay key file that cannot be used."""
    curve = None
    if cfg.curve_secret_key and cfg.curve_client_keys:
        curve = CurveKeys(cfg.curve_secret_key, cfg.curve_client_keys)
    try:
        return DaemonOptions(
            socket=cfg.socket,
            default_policy=cfg.default_policy,
            liveness_timeout_s=cfg.liveness_timeout_s,
            job_settings=initial_settings(cfg, store),
            admin_group=cfg.admin_group,
            curve=curve,
            relay_key=_relay_key(cfg),
            memory_tier_share=cfg.memory_tier_share,
        )
    except DaemonError as exc:
        raise ServiceError(str(exc)) from None


def _relay_key(cfg: Config) -> RelayKey | None:
    """The key of ``daemon.relay_key_file`` (None when unset); raises :class:`ServiceError`."""
    if cfg.relay_key_file is None:
        return None
    try:
        return RelayKey.load(cfg.relay_key_file)
    except ValueError as exc:
        raise ServiceError(f"daemon.relay_key_file: {exc}") from None


def initial_settings(cfg: Config, store: Store | None) -> dict[str, admin.JobSettings]:
    """Exact-id ``[jobs."ID"]`` entries of the config (merged with the globs that match
    them), overridden by what operators set at run time (the store), as the daemon's
    ``job_settings``. Jobs matched only by a glob get theirs at hello."""
    out: dict[str, admin.JobSettings] = {}
    for o in cfg.jobs:
        if not any(c in o.pattern for c in "*?["):
            configured = configured_settings(cfg, o.pattern)
            if configured is not None:
                out[o.pattern] = configured
    if store is not None:
        for job, s in store.job_settings().items():
            out[job] = admin.JobSettings(policy=s.policy, paused=s.paused)
    return out


def configured_settings(cfg: Config, job: str) -> admin.JobSettings | None:
    """The config's settings for a job that has none yet when it first says hello:
    its exact ``[jobs."ID"]`` entry and the matching glob entries, merged by
    :meth:`Config.job_override` (what an operator sets later still wins)."""
    o = cfg.job_override(job)
    if o is None or (o.policy is None and not o.paused):
        return None
    return admin.JobSettings(policy=o.policy, paused=bool(o.paused))


def stall_limits(cfg: Config, job: str) -> StallLimits | None:
    """The job's hang detection limits from its ``[jobs."ID"]`` entries (None: the
    defaults). Entries merged from several globs whose floor and cap do not go together
    keep the defaults, with a warning (each entry alone was checked at load)."""
    o = cfg.job_override(job)
    if o is None or (o.hang_detection, o.stall_floor_s, o.stall_cap_s) == (None, None, None):
        return None
    d = StallLimits()
    try:
        return StallLimits(
            floor_s=o.stall_floor_s if o.stall_floor_s is not None else d.floor_s,
            cap_s=o.stall_cap_s if o.stall_cap_s is not None else d.cap_s,
            enabled=o.hang_detection is not False,
        )
    except ValueError as exc:
        log.warning(logfmt("stall_limits_ignored", job=job, error=str(exc)))
        return None


def status_extra(snapshot: Any, fleet: FleetPart | None) -> dict[str, Any]:
    """What ``adaptd status`` shows besides the jobs: telemetry, and the fleet."""
    from adaptd.telemetry import report

    out = report.to_dict(snapshot)
    if fleet is not None:
        out["fleet"] = fleet.status()
    return out
