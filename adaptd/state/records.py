"""The records of what happened: a save, a decision, a failure; and the one function
that makes them from the daemon's events.

The store keeps these rows (:mod:`adaptd.state.store`), the metrics observe the same ones
(:mod:`adaptd.metrics.exporter`), and ``adaptd report`` reads them back: :func:`record_of` is
the one place where an event becomes a record, so what is stored and what is
exported cannot drift apart. Times in records are wall-clock seconds since the epoch.

A record made from another one takes the fields they share by name (:func:`copy_fields`,
the one piece of code that does, also for the admin protocol's views of a save or a plan).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from adaptd import events
from adaptd.core.snapshot import Decision
from adaptd.protocol.job import SaveReport

__all__ = [
    "STALL_POLICY",
    "DecisionRecord",
    "FailureRecord",
    "JobSettings",
    "JobSummary",
    "Record",
    "SaveRecord",
    "copy_fields",
    "record_of",
    "stall_decision",
]

_T = TypeVar("_T")


def copy_fields(cls: type[_T], src: object, **given: Any) -> _T:
    """A ``cls`` (a dataclass or a msgspec Struct) whose fields are ``given``, and for the
    others the same-named attributes of ``src`` (a field ``src`` lacks keeps its default)."""
    values = {n: getattr(src, n) for n in _names(cls) if n not in given and hasattr(src, n)}
    return cls(**values, **given)


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return tuple(f.name for f in msgspec.structs.fields(cls))


@dataclass(frozen=True, slots=True)
class SaveRecord:
    """One save by one rank. Times are wall-clock seconds since the epoch."""

    job: str
    rank: int
    step: int
    started: float
    ended: float
    blocking_s: float
    durable_s: float
    bytes: int
    ok: bool = True
    error: str = ""
    path: str = ""
    extra_step_s: float = 0.0
    reason: str = ""
    tier: str = ""  # "local": saved to the job's local tier only, not made durable

    @classmethod
    def from_report(cls, msg: SaveReport, *, received: float) -> SaveRecord:
        """The record for a :class:`~adaptd.protocol.job.SaveReport` received at wall time
        ``received``: the save started ``durable_s`` before it became durable."""
        return copy_fields(cls, msg, started=received - msg.durable_s, ended=received)


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A plan sent to a job, and why. ``step`` is the job's step when it was decided."""

    job: str
    time: float
    step: int
    next_step: int | None
    every_steps: int | None = None
    urgent: bool = False
    policy: str = ""
    reason: str = ""
    interval_s: float | None = None
    waste: float | None = None
    step_time_s: float | None = None
    durable_every: int | None = None  # two tiers: every k-th save durable (None: one tier)

    @classmethod
    def from_decision(
        cls,
        job: str,
        decision: Decision,
        *,
        time: float,
        step: int,
        step_time_s: float | None = None,
    ) -> DecisionRecord:
        """The record for ``decision`` taken for ``job`` at wall time ``time``."""
        return copy_fields(cls, decision, job=job, time=time, step=step, step_time_s=step_time_s)


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """A job vanished without a goodbye and came back resuming from an older step."""

    job: str
    time: float  # wall time the failure was recognised
    lost_at_step: int  # the newest step reported before it vanished
    resumed_step: int | None = None  # the step the new incarnation resumed from
    restart_s: float | None = None  # from vanishing to the first step of the new run


@dataclass(frozen=True, slots=True)
class JobSettings:
    """What an operator set for a job at run time; survives daemon restarts."""

    job: str
    policy: str | None = None  # a policy spec overriding the config's choice
    paused: bool = False
    updated: float = 0.0


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job's footprint in the history, for ``status`` and ``report``."""

    job: str
    saves: int
    failed_saves: int
    last_save: float | None
    decisions: int
    failures: int


#: The ``policy`` of the decision a fired stall makes (:func:`stall_decision`): the
#: report tells hang aborts from other urgent saves by it.
STALL_POLICY = "hang-detection"


def stall_decision(ev: events.JobStalled) -> DecisionRecord:
    """A fired stall as the decision it was: an urgent just-in-time save of the job's
    last completed step by the survivors, with the threshold and the culprit in its
    reason (no new table: the decisions table holds every urgent save's why)."""
    culprit = "unknown" if ev.culprit is None else f"rank {ev.culprit}"
    return DecisionRecord(
        ev.job,
        ev.wall,
        ev.step,
        None,
        urgent=True,
        policy=STALL_POLICY,
        reason=(
            f"stalled {ev.silent_s:.1f} s > threshold {ev.threshold_s:.1f} s, culprit "
            f"{culprit}: {ev.reason}"
        ),
    )


#: What :func:`record_of` makes.
Record = SaveRecord | DecisionRecord | FailureRecord


def record_of(ev: events.Event) -> Record | None:
    """The record an event makes, or ``None`` for an event that makes none.

    Every rank's save report is a save; a plan change and an urgent save request are
    decisions (with the job's step time then, as the event carries it); a confirmed
    failure (:class:`~adaptd.events.JobResumed`) is a failure dated when the lost run
    stopped (``restart_s`` before the new run's first step); a fired stall
    (:class:`~adaptd.events.JobStalled`) an urgent decision (:func:`stall_decision`).
    """
    if isinstance(ev, events.SaveReported):
        return SaveRecord.from_report(ev.report, received=ev.wall)
    if isinstance(ev, events.PlanChanged):
        return DecisionRecord.from_decision(
            ev.job, ev.decision, time=ev.wall, step=ev.step, step_time_s=ev.step_time_s
        )
    if isinstance(ev, events.SaveRequested):
        return DecisionRecord(
            ev.job,
            ev.wall,
            ev.step,
            None,
            urgent=True,
            reason=ev.reason,
            step_time_s=ev.step_time_s,
        )
    if isinstance(ev, events.JobStalled):
        return stall_decision(ev)
    if isinstance(ev, events.JobResumed):
        return FailureRecord(
            job=ev.job,
            time=ev.wall - ev.restart_s,
            lost_at_step=ev.last_step,
            resumed_step=ev.resumed_from,
            restart_s=ev.restart_s,
        )
    return None
