"""The hook's save side: which step is saved, and who hears of it.

:class:`Saver` saves the step its :class:`~adaptd.client.save.schedule.SaveSchedule`
names (or the one it is asked for), through :class:`~adaptd.client.save.saves.Saves`
(one asynchronous save at a time, measured and reported), and hands every report and
every started save to a :class:`SaveListener` (the daemon session, which tells the
daemon and the job's chief). Everything here runs on the training thread, at
slow-path boundaries and at the end of the run.

What the end of a run saves is :func:`final_reason`: the step a SIGTERM interrupted,
or with ``save_on_close`` the last step when the run advanced since its last save;
never the state of a step that raised. A just-in-time save (a peer failed, the failed
step's counters put back: docs/architecture.md) is one more reason there.
"""

from __future__ import annotations

from time import perf_counter
from typing import Protocol

from adaptd.client.save.costs import Baseline, StepClock
from adaptd.client.save.saves import Saves
from adaptd.client.save.schedule import SaveSchedule
from adaptd.client.save.sigterm import SIGTERM_REASON
from adaptd.client.save.targets import Durable
from adaptd.core.estimators import JobTracker
from adaptd.protocol import job as protocol

__all__ = ["FINAL_SAVE_REASON", "SaveListener", "Saver", "final_reason"]

#: The reason of the save :meth:`~adaptd.client.checkpointer.AdaptiveCheckpointer.close`
#: makes of the last step.
FINAL_SAVE_REASON = "end of run"


class SaveListener(Protocol):
    """Who hears of the saves (:class:`~adaptd.client.daemon.session.DaemonSession`)."""

    def saved(self, report: protocol.SaveReport, now: float) -> None: ...

    def save_started(self, step: int, blocking_s: float, *, ok: bool = True) -> None: ...


def final_reason(
    step: int, last_saved: int | None, *, signaled: bool, save_on_close: bool
) -> str | None:
    """Why the run's end saves ``step`` (None: it does not). ``last_saved``: the newest
    step saved (None: none since the start); ``signaled``: a SIGTERM ends the run;
    ``save_on_close``: a clean end saves a step the run advanced to."""
    if signaled:
        return SIGTERM_REASON if last_saved != step else None
    if save_on_close and step != (last_saved or 0):
        return FINAL_SAVE_REASON
    return None


class Saver:
    """One hook's saves, as the schedule plans them.

    Args:
        schedule: the rank's save schedule (when; told of every save started).
        saves: the saves themselves (how: one in flight at a time, measured).
        durable: the job's checkpoint directory and its ``CheckpointManager``.
        listener: who hears of each save.
    """

    def __init__(
        self, schedule: SaveSchedule, saves: Saves, durable: Durable, listener: SaveListener
    ) -> None:
        self.schedule = schedule
        self.saves = saves
        self.durable = durable
        self.listener = listener
        self._tracker: JobTracker | None = None
        #: The newest save went to the local tier only (two tiers).
        self.newest_local = False
        #: This run made a save to the local tier (two tiers).
        self.local_started = False

    def start(self, tracker: JobTracker, clock: StepClock, baseline: Baseline) -> None:
        """The run starts: measure from here (``tracker`` gives the step time the
        writer's priority weighs the plan's interval by)."""
        self._tracker = tracker
        self.saves.start(tracker, clock, baseline)

    def save(self, step: int, reason: str, planned: bool = False) -> None:
        """Save ``step`` now (asynchronously); the previous save's report, if it had to
        be waited for, and this save's start go to the listener. ``planned``: the
        plan's save (with two tiers it may go to the local tier only, see
        :meth:`durable_save`); any other save (urgent, requested, the run's last) is made
        durable."""
        assert self._tracker is not None
        durable = not planned or self.durable_save(step)
        self.schedule.saved(step)
        interval = self.schedule.interval_s(self._tracker.step_time_s)
        prev = self.saves.save(step, reason, interval, durable=durable)
        self.newest_local = not durable and self.saves.local is not None
        self.local_started = self.local_started or self.newest_local
        if prev is not None:
            self.listener.saved(prev, perf_counter())
        started = self.saves.pending
        if started is not None and started.step == step:
            self.listener.save_started(step, started.blocking_s, ok=not started.error)

    def save_if_due(self, step: int) -> None:
        """Save ``step`` if the schedule has a save due by it."""
        schedule = self.schedule
        if step >= schedule.due:
            self.save(step, schedule.due_reason, planned=not schedule.due_urgent)

    def durable_save(self, step: int) -> bool:
        """Whether the plan's save at ``step`` is made durable: always with one tier;
        with two, every ``durable_every``-th (:meth:`~adaptd.core.snapshot.Decision.
        durable_at`, counted from the newest save made durable, else the step the run
        resumed from: every rank counts alike), except that the first saves stay local
        until the run made one local save (the ``tiers`` policy probes with
        ``durable_every`` 1 until it knows δ₁, which only a local save teaches; every
        rank made the same saves, so every rank decides alike)."""
        d = self.schedule.decision
        t = self._tracker
        if self.saves.local is None or d is None or t is None:
            return True
        if d.durable_every is not None and not self.local_started:
            return False  # a two-tier plan: measure δ₁ first, or it is never measured
        anchor = t.last_durable_save_step
        return d.durable_at(step, anchor if anchor is not None else t.start_step)

    def save_unless_saved(self, step: int, reason: str) -> bool:
        """Save ``step`` unless it is the newest step saved (and durable: a step saved
        to the local tier only is saved again, durably); True when it did."""
        if self.schedule.last_saved_step == step and not self.newest_local:
            return False
        self.save(step, reason)
        return True

    def report_done(self, step: int, now: float) -> None:
        """Hand the report of the save in flight to the listener once its write ended."""
        report = self.saves.report_done(step, now)
        if report is not None:
            self.listener.saved(report, now)

    def finish(
        self, step: int, reason: str | None, timeout: float | None, *, clean: bool = False
    ) -> None:
        """The run ends at ``step``: save it first when ``reason`` says so (see
        :func:`final_reason`), or, on a ``clean`` end (``save_on_close`` or a SIGTERM)
        whose newest save went to the local tier only, durably (so the run's end is
        durable and its memory copies are freed); then wait up to ``timeout`` seconds
        for the save in flight and report it."""
        if reason is None and clean and self.newest_local:
            reason = FINAL_SAVE_REASON
        if reason is not None:
            self.save(step, reason)
        report = self.saves.wait(step, timeout)
        if report is not None:
            self.listener.saved(report, perf_counter())

    def stop(self) -> None:
        """End the watcher thread once the writes queued for it are done."""
        self.saves.stop()
