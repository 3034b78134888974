"""The one place a daemon is put together: :func:`build`.

A daemon is made from two things: its settings, one frozen and validated
:class:`~adaptd.daemon.options.DaemonOptions`, and the collaborators of the program that
embeds it, one :class:`Seams` (where snapshots come from, who hears its events, what
runs at each tick, the state database's history...). ``adaptd serve`` makes both from its
config (:class:`adaptd.daemon.service.Service`); the tests and the demo write them out;
all of them call :func:`build`, which wires every part with the others it needs, in
order, and hands the result to :class:`~adaptd.daemon.server.Daemon`. Nothing is set on
a part after it is built; the one thing added later is a sink on the event bus: the
drains, which need the planner that emits on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from adaptd import events as ev
from adaptd.core import policy as policy_mod
from adaptd.core.estimators import JobTracker
from adaptd.core.snapshot import Snapshot
from adaptd.daemon.admin.commands import OperatorCommands
from adaptd.daemon.admin.drains import Drains
from adaptd.daemon.admin.handler import AdminHandler, HistorySource, admin_gid
from adaptd.daemon.admin.status import ReplicationSource, StatusExtra, StatusView
from adaptd.daemon.jobs.delivery import Delivery
from adaptd.daemon.jobs.handler import JobHandler
from adaptd.daemon.jobs.job_config import JobConfigSource, nothing
from adaptd.daemon.jobs.memory_tier import MemoryTiers
from adaptd.daemon.jobs.ops import JobOps
from adaptd.daemon.jobs.planner import Planner, snapshot_now
from adaptd.daemon.jobs.policy_choice import PolicyChoice
from adaptd.daemon.jobs.registry import ProcProbe, Registry
from adaptd.daemon.jobs.rounds import Agreements, RoundMemory
from adaptd.daemon.jobs.settings import ConfiguredSettings, OperatorSettings
from adaptd.daemon.jobs.stall_watch import Limits, Peers, StallWatch, no_limits
from adaptd.daemon.jobs.table import JobTable
from adaptd.daemon.options import DaemonOptions
from adaptd.daemon.parts import DaemonParts, TickHook
from adaptd.daemon.refusals import Refusals
from adaptd.daemon.server import Daemon
from adaptd.daemon.transport import Transport
from adaptd.daemon.waker import Waker
from adaptd.protocol.job import Hello
from adaptd.telemetry.host import ProcessReads

__all__ = ["Seams", "assemble", "build"]


@dataclass(frozen=True, kw_only=True)
class Seams:
    """What the program around a daemon gives it; every seam has a working default.

    - ``snapshot_source``: the newest telemetry (must not block: it runs in the loop).
    - ``sinks``: called with every :mod:`adaptd.events` event, in the loop.
    - ``tick_hooks``: called every ``tick_interval_s`` in the loop with the time.
    - ``clock``: the loop's monotonic clock.
    - ``jobs``: the table the registry keeps its records in; pass one to read it (a
      :class:`~adaptd.daemon.jobs.table.RegistryView`) from seams made before the daemon.
    - ``tracker_factory``: a new job's tracker from its first hello (default: a fresh one).
    - ``config_settings``: the config's settings for a job met for the first time.
    - ``job_config``: the config's answer to a rank asking for its job's settings (its
      local tier; default: nothing configured).
    - ``status_extra``, ``replication_source``: more for ``adaptd status``.
    - ``history_source``: the saves ``adaptd history`` shows (``None``: refused).
    - ``stall_limits``: the config's hang detection limits for a job (None: defaults).
    - ``stall_peers``: the daemons of the jobs' other hosts, for the stall watch (the
      fleet's :class:`~adaptd.fleet.part.RankPeers`; None: no channel to them).
    - ``decide_again``: job ids to decide again at once, read after each tick's hooks
      (the fleet's jobs just granted a write slot).
    - ``round_memory``: where the agreement rounds of jobs without a runtime are
      recorded before their messages go, so that a restarted daemon can finish what
      the one before it said to some ranks only (``adaptd serve``: the state database;
      None: nowhere).
    - ``waker``: wakes the loop (signals, :meth:`~adaptd.daemon.waker.Waker.tick_soon`
      from other threads); pass one to give it to a part made before the daemon.
    """

    snapshot_source: Callable[[], Snapshot] = snapshot_now
    sinks: Sequence[ev.Sink] = ()
    tick_hooks: Sequence[TickHook] = ()
    clock: Callable[[], float] = time.monotonic
    jobs: JobTable = field(default_factory=JobTable)
    tracker_factory: Callable[[Hello], JobTracker] | None = None
    config_settings: ConfiguredSettings | None = None
    job_config: JobConfigSource = nothing
    status_extra: StatusExtra | None = None
    replication_source: ReplicationSource | None = None
    history_source: HistorySource | None = None
    decide_again: Callable[[], Iterable[str]] | None = None
    stall_limits: Limits = no_limits
    stall_peers: Peers | None = None
    round_memory: RoundMemory | None = None
    waker: Waker = field(default_factory=Waker)


def build(options: DaemonOptions, seams: Seams | None = None) -> Daemon:
    """A daemon, not yet serving (:meth:`Daemon.start` or :meth:`Daemon.serve`). It answers
    the operator commands of :data:`adaptd.daemon.admin.commands.OPERATOR_COMMANDS` as the
    table is now.

    Raises :class:`~adaptd.daemon.transport.DaemonError` for a socket that cannot be
    used (too long, TCP without CURVE) or an admin group this host lacks, and
    :class:`~adaptd.daemon.admin.commands.CommandError` for a table entry that cannot be
    an operator command."""
    return Daemon(assemble(options, seams if seams is not None else Seams()))


def assemble(options: DaemonOptions, seams: Seams) -> DaemonParts:
    """Every part of a daemon, each built with the parts it needs (see :func:`build`)."""
    clock = seams.clock
    events = ev.EventBus(seams.sinks)
    transport = Transport(options.socket, curve=options.curve, clock=clock, waker=seams.waker)
    stats = transport.stats
    processes = ProcessReads()  # one read of a rank's process a tick, for both watchers
    registry = Registry(
        seams.jobs,
        emit=events,
        probe=ProcProbe(process=processes),
        liveness_timeout_s=options.liveness_timeout_s,
        hostname=options.hostname,
        tracker_factory=seams.tracker_factory,
    )
    policies = policy_mod.PolicyCache()
    settings = OperatorSettings(
        policies=policies,
        emit=events,
        initial=options.job_settings,
        configured=seams.config_settings,
    )
    choice = PolicyChoice(
        default_policy=options.default_policy, policies=policies, settings=settings
    )
    delivery = Delivery(
        send=transport.send_rank,
        rounds=Agreements(send=transport.send_rank, stats=stats, memory=seams.round_memory),
        stats=stats,
        resend_after_s=options.resend_after_s,
    )
    planner = Planner(
        settings=settings,
        snapshot_source=seams.snapshot_source,
        delivery=delivery,
        emit=events,
        stats=stats,
        options=options.planner,
    )
    commands = OperatorCommands.from_table()
    ops = JobOps(
        planner=planner,
        choice=choice,
        settings=settings,
        jobs=registry.table,
        delivery=delivery,
        hostname=registry.hostname,
        relayed=commands.relayed,
        relay_key=options.relay_key,
    )
    stall = StallWatch(registry.table, send=transport.send, emit=events,
                       snapshot=seams.snapshot_source, paused=settings.paused,
                       limits=seams.stall_limits, peers=seams.stall_peers,
                       process=processes)  # fmt: skip
    status = StatusView(jobs=registry.table, hostname=registry.hostname, settings=settings,
                        stats=stats, events=events, transport=transport,
                        default_policy=options.default_policy, status_extra=seams.status_extra,
                        replication_source=seams.replication_source,
                        stall=stall.verdict)  # fmt: skip
    drains = Drains(jobs=registry.table, save_now=ops.save_now, reply=transport.send_admin)
    events.subscribe(drains.on_event)  # last: a save is recorded before it releases a drain
    refusals = Refusals(stats=stats, emit=events, clock=clock)
    admin = AdminHandler(
        transport=transport,
        stats=stats,
        refusals=refusals,
        clock=clock,
        registry=registry,
        ops=ops,
        drains=drains,
        choice=choice,
        settings=settings,
        status=status,
        commands=commands,
        admin_gid=admin_gid(options.admin_group),
        history=seams.history_source,
    )
    jobs = JobHandler(
        transport=transport,
        stats=stats,
        refusals=refusals,
        clock=clock,
        registry=registry,
        choice=choice,
        planner=planner,
        delivery=delivery,
        ops=ops,
        configured=seams.job_config,
        stall=stall,
    )
    memory = MemoryTiers(jobs=registry.table, snapshot=seams.snapshot_source,
                         delivery=delivery, share=options.memory_tier_share)  # fmt: skip
    return DaemonParts(
        transport=transport,
        events=events,
        stats=stats,
        clock=clock,
        registry=registry,
        settings=settings,
        choice=choice,
        planner=planner,
        delivery=delivery,
        drains=drains,
        status=status,
        jobs=jobs,
        admin=admin,
        # after the seams' hooks: the snapshot is sampled first
        tick_hooks=(*seams.tick_hooks, memory.tick, stall.tick),
        tick_interval_s=options.tick_interval_s,
        decide_again=seams.decide_again,
    )
