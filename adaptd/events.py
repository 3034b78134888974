"""What the daemon tells its subscribers: job lifecycle, save reports and plan changes.

The daemon's loop emits one frozen event per fact it learns. Subscribers (the
SQLite store, the Prometheus metrics, the interval model learning failure rates)
are plain callables ``sink(event) -> None`` passed to
:class:`adaptd.daemon.server.Daemon`. They are called synchronously in the loop, so a
sink must be quick: one that does I/O queues the event for its own thread. A sink
that raises is counted and logged; it never stops the loop.

Times are monotonic clock readings (``time.monotonic()``), the same clock as
:attr:`adaptd.core.snapshot.Snapshot.time`; ``wall`` is the matching ``time.time()``
for stores that need a calendar date.

A failure, for the interval model, is a :class:`JobLost` (the job's ranks all
vanished without a goodbye). The matching :class:`JobResumed` confirms it and
carries the restart time R; a :class:`JobRevived` retracts it (the job was only
silent, and spoke again from the same processes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from adaptd.core.snapshot import Decision
from adaptd.logfmt import Throttle, logfmt
from adaptd.protocol.job import SaveReport

__all__ = [
    "Event",
    "EventBus",
    "JobEvent",
    "JobFinished",
    "JobForgotten",
    "JobLost",
    "JobRegistered",
    "JobResumed",
    "JobRevived",
    "JobSettingsChanged",
    "JobStalled",
    "MessageRejected",
    "PlanChanged",
    "SaveInFlight",
    "SaveReported",
    "SaveRequested",
    "Sink",
]

log = logging.getLogger("adaptd.server")


@dataclass(frozen=True, slots=True)
class JobEvent:
    """What most events are: a fact about ``job`` learned at ``time`` (monotonic), whose
    calendar date is ``wall``."""

    time: float
    wall: float
    job: str


@dataclass(frozen=True, slots=True)
class JobRegistered(JobEvent):
    """A rank said hello. ``incarnation`` counts the job's runs (1 for the first)."""

    rank: int
    world_size: int
    pid: int
    hostname: str
    checkpoint_dir: str
    resumed_from: int
    incarnation: int
    restore_fallback: str = ""  # the rank skipped a damaged newest checkpoint: which, why
    jobs_active: int | None = None  # active jobs in the registry after this event
    # how the hello was understood (registry.HelloKind) and what it said of the tiers:
    # the fleet tells a job that moved hosts by them (adaptd.fleet.classes)
    hello_kind: str = ""
    local_tier: str = ""
    resumed_tier: str = ""
    local_intact: bool = False


@dataclass(frozen=True, slots=True)
class JobLost(JobEvent):
    """Every rank of the job is gone without a goodbye: a failure candidate.

    ``step`` is the newest step any rank reported, ``last_durable_step`` the newest
    save known durable (``None``: none yet), so ``step - last_durable_step`` is the
    work at risk. ``last_seen`` is the time of the job's last message; ``time``
    is when the loss was detected. ``reason`` says how (``"pid 123 gone"``,
    ``"silent for 300s"``, ``"rank 0 restarted as pid 456"``).
    """

    step: int
    last_durable_step: int | None
    last_seen: float
    reason: str
    gpus: int
    world_size: int
    jobs_active: int | None = None  # active jobs in the registry after this event


@dataclass(frozen=True, slots=True)
class JobStalled(JobEvent):
    """No rank of the job completed a step for ``silent_s`` > ``threshold_s``: the daemon
    told its ranks to abort their collectives and save just in time (docs/multiworker.md).
    ``culprit``: the rank taken for the cause (None: unknown); ``reason``: why, with the
    threshold's derivation."""

    step: int
    silent_s: float
    threshold_s: float
    culprit: int | None
    reason: str
    gpus: int = 1


@dataclass(frozen=True, slots=True)
class JobRevived(JobEvent):
    """A job marked lost spoke again from the same processes: retract that loss."""

    lost_at: float
    jobs_active: int | None = None  # active jobs in the registry after this event


@dataclass(frozen=True, slots=True)
class JobResumed(JobEvent):
    """A lost job came back and reported its first step: the restart is over.

    This confirms the :class:`JobLost` as a failure. ``lost_at`` is when the loss was
    detected; ``last_seen`` the lost run's last message, the best bound on when it
    died (detection lags by up to the silence timeout). ``restart_s`` = first step
    report - ``last_seen``: the restart-and-restore time R fed to the job's tracker.
    ``lost_steps`` = ``last_step - resumed_from``, the work redone.
    """

    lost_at: float
    last_step: int
    resumed_from: int
    restart_s: float
    last_seen: float | None = None

    @property
    def lost_steps(self) -> int:
        return max(0, self.last_step - self.resumed_from)


@dataclass(frozen=True, slots=True)
class JobFinished(JobEvent):
    """Every rank said goodbye: a clean end, not a failure."""

    step: int
    reason: str
    jobs_active: int | None = None  # active jobs in the registry after this event


@dataclass(frozen=True, slots=True)
class JobForgotten:
    """The registry dropped a finished or lost job to stay within its cap: whatever a
    sink keeps per job (metric series, telemetry) can go too."""

    time: float
    job: str
    jobs_active: int | None = None  # active jobs in the registry after this event


@dataclass(frozen=True, slots=True)
class SaveReported(JobEvent):
    """A rank reported a save (``report.ok`` False: it failed). ``counted`` is False
    for a duplicate report of a step another rank already reported."""

    report: SaveReport
    counted: bool


@dataclass(frozen=True, slots=True)
class PlanChanged(JobEvent):
    """The job's plan changed and was pushed to its ranks as plan ``seq``.

    ``step_time_s`` is the job's mean step time when it was decided (``None``: not
    measured yet), so a sink can turn a plan in steps into seconds without asking
    the registry.
    """

    seq: int
    step: int
    decision: Decision
    ranks: int
    step_time_s: float | None = None


@dataclass(frozen=True, slots=True)
class SaveRequested(JobEvent):
    """An urgent save was sent to the job's ranks (operator or urgent policy)."""

    step: int
    reason: str
    ranks: int
    step_time_s: float | None = None  # the job's mean step time then, as on PlanChanged


@dataclass(frozen=True, slots=True)
class JobSettingsChanged:
    """An operator changed a job's settings (``adaptd set-policy``, ``pause``, ``resume``).

    Carries the job's whole setting after the change, so a store can upsert it and
    hand it back as ``Daemon(job_settings=...)`` at the next start.
    """

    time: float
    job: str
    policy: str | None
    paused: bool


@dataclass(frozen=True, slots=True)
class MessageRejected:
    """The daemon refused a message (job or admin socket); ``code`` is the error code
    it counted (``invalid``, ``unknown_peer``, ``admin_unknown_job``, ...)."""

    time: float
    code: str


@dataclass(frozen=True, slots=True)
class SaveInFlight:
    """A job started (``writing=True``) or finished writing a save, as its ranks' step
    reports and save reports tell (or its run ended while writing: ``False``). The
    registry emits it when the flag flips; the Replicator yields the disk to it."""

    time: float
    job: str
    writing: bool


Event = (
    JobRegistered
    | JobLost
    | JobRevived
    | JobResumed
    | JobFinished
    | JobForgotten
    | SaveReported
    | PlanChanged
    | SaveRequested
    | JobSettingsChanged
    | MessageRejected
    | SaveInFlight
)

#: A subscriber: called in the daemon's loop with each event; must not block.
Sink = Callable[[Event], None]


class EventBus:
    """Hands each event to every sink, in order, in the daemon's loop.

    A sink that raises is counted in :attr:`errors` and logged (throttled); the
    other sinks still get the event and nothing reaches the caller. Job lifecycle
    events are also logged here, once, whoever emitted them (the registry or the
    daemon's planner).
    """

    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks: tuple[Sink, ...] = tuple(sinks)
        #: sinks that raised (``sink_errors`` in ``adaptd status``)
        self.errors = 0
        self._throttle = Throttle()

    def __call__(self, event: Event) -> None:
        self.emit(event)

    def subscribe(self, sink: Sink) -> None:
        """Add ``sink``, heard after every sink before it. For a part of the daemon that
        is built after the bus because it needs a part that emits on it (the drains ask
        the planner, which emits, to save): it hears its events as every other sink does."""
        self.sinks = (*self.sinks, sink)

    def emit(self, event: Event) -> None:
        """Hand ``event`` to every sink; a failing sink is counted and logged, never raised."""
        _log_lifecycle(event)
        for sink in self.sinks:
            try:
                sink(event)
            except Exception:
                self.errors += 1
                if self._throttle(f"sink:{sink!r}"):
                    log.exception(logfmt("sink_failed", sink=sink, event=type(event).__name__))


#: The job lifecycle events logged as they are emitted: level, event name, fields.
LIFECYCLE_LOG: dict[type, tuple[int, str, tuple[str, ...]]] = {
    JobLost: (logging.WARNING, "job_lost", ("job", "step", "last_durable_step", "reason")),
    JobResumed: (logging.INFO, "job_resumed",
                 ("job", "resumed_from", "last_step", "lost_steps", "restart_s")),
    JobRevived: (logging.INFO, "job_revived", ("job",)),
    JobFinished: (logging.INFO, "job_finished", ("job", "step", "reason")),
}  # fmt: skip


def _log_lifecycle(event: Event) -> None:
    how = LIFECYCLE_LOG.get(type(event))
    if how is not None:
        level, name, fields = how
        log.log(level, logfmt(name, **{f: getattr(event, f) for f in fields}))
