"""The daemon's parts, built once and handed to its loop.

:class:`DaemonParts` is everything :class:`adaptd.daemon.server.Daemon` runs: the
transport, the event bus, the registry, the operator settings, the planner, the
drains, the job and admin handlers and the status view, each given the others it
needs when it is built. :func:`parts` wires them from values that are already
valid: ``adaptd serve`` passes what its :class:`~adaptd.config.loader.Config` validated
(through :class:`adaptd.daemon.service.Service`); ``Daemon(socket, policy=..., ...)`` (tests,
the demo) checks its keyword arguments first and raises
:class:`~adaptd.daemon.transport.DaemonError` naming the option.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from adaptd.core import policy as policy_mod
from adaptd.core.snapshot import Snapshot
from adaptd.daemon import events as ev
from adaptd.daemon.admin.drains import Drains
from adaptd.daemon.admin.handler import AdminHandler, HistorySource
from adaptd.daemon.admin.status import ReplicationSource, StatusExtra, StatusView
from adaptd.daemon.jobs.handler import RESEND_AFTER_S, JobHandler
from adaptd.daemon.jobs.ops import JobOps
from adaptd.daemon.jobs.planner import REPLAN_TOLERANCE, Planner
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.rounds import Agreements
from adaptd.daemon.jobs.settings import ConfiguredSettings, OperatorSettings
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import Transport
from adaptd.protocol.admin import JobSettings
from adaptd.protocol.relay_auth import RelayKey

__all__ = [
    "TICK_INTERVAL_S",
    "DaemonParts",
    "TickHook",
    "parts",
    "snapshot_now",
]

#: Liveness checks and tick hooks run this often.
TICK_INTERVAL_S = 1.0

#: Called about once a second in the daemon's loop with the monotonic time; must not block.
TickHook = Callable[[float], None]


def snapshot_now() -> Snapshot:
    """An empty snapshot (no telemetry) at the current time: the default snapshot source."""
    return Snapshot(time=time.monotonic())


@dataclass(frozen=True)
class DaemonParts:
    """The collaborators of one daemon, wired to each other."""

    transport: Transport
    events: ev.EventBus
    registry: Registry
    settings: OperatorSettings
    planner: Planner
    drains: Drains
    jobs: JobHandler
    admin: AdminHandler
    status: StatusView
    stats: DaemonStats
    agreements: Agreements
    tick_hooks: tuple[TickHook, ...] = ()
    tick_interval_s: float = TICK_INTERVAL_S
    clock: Callable[[], float] = time.monotonic


def parts(
    transport: Transport,
    *,
    events: ev.EventBus,
    registry: Registry,
    default_spec: str,
    snapshot_source: Callable[[], Snapshot] = snapshot_now,
    tick_hooks: Iterable[TickHook] = (),
    job_settings: Mapping[str, JobSettings] | None = None,
    config_settings: ConfiguredSettings | None = None,
    status_extra: StatusExtra | None = None,
    replication_source: ReplicationSource | None = None,
    admin_group_id: int | None = None,
    history_source: HistorySource | None = None,
    relay_key: RelayKey | None = None,
    resend_after_s: float = RESEND_AFTER_S,
    tick_interval_s: float = TICK_INTERVAL_S,
    replan_tolerance: float = REPLAN_TOLERANCE,
    clock: Callable[[], float] = time.monotonic,
) -> DaemonParts:
    """Wire the daemon's parts from values that are already valid.

    ``registry`` must emit through ``events`` (``Registry(emit=events)``), so the
    sinks see the registry's events and the daemon's own in one order.
    ``default_spec`` is parsed here (:class:`~adaptd.core.policy.PolicyError` if a plugin
    went missing since it was validated). ``history_source``: the saves ``adaptd
    history`` shows (``None``: a daemon without a state database refuses it).
    """
    stats = transport.stats
    policies = policy_mod.PolicyCache()
    settings = OperatorSettings(
        policies=policies, emit=events, initial=job_settings, configured=config_settings
    )
    agreements = Agreements(send=transport.send_rank, stats=stats)
    planner = Planner(
        default_policy=policies.get(default_spec),
        default_spec=default_spec,
        policies=policies,
        settings=settings,
        snapshot_source=snapshot_source,
        send=transport.send_rank,
        emit=events,
        stats=stats,
        replan_tolerance=replan_tolerance,
        agreements=agreements,
    )
    ops = JobOps(planner=planner, registry=registry, relay_key=relay_key)
    drains = Drains(registry=registry, save_now=planner.save_now, reply=transport.send_admin)
    status = StatusView(
        registry=registry,
        settings=settings,
        stats=stats,
        events=events,
        transport=transport,
        default_spec=default_spec,
        status_extra=status_extra,
        replication_source=replication_source,
    )
    return DaemonParts(
        transport=transport,
        events=events,
        registry=registry,
        settings=settings,
        planner=planner,
        drains=drains,
        jobs=JobHandler(
            registry=registry,
            planner=planner,
            settings=settings,
            drains=drains,
            transport=transport,
            stats=stats,
            emit=events,
            clock=clock,
            resend_after_s=resend_after_s,
            agreements=agreements,
            ops=ops,
        ),
        admin=AdminHandler(
            registry=registry,
            planner=planner,
            drains=drains,
            status=status,
            transport=transport,
            stats=stats,
            emit=events,
            clock=clock,
            admin_gid=admin_group_id,
            ops=ops,
            history=history_source,
        ),
        status=status,
        stats=stats,
        agreements=agreements,
        tick_hooks=tuple(tick_hooks),
        tick_interval_s=tick_interval_s,
        clock=clock,
    )
