"""δ of a job with several ranks: its slowest rank's cost of each save.

Every rank of a data-parallel job saves at the same step, and the job goes on only
when the slowest of them does, so the cost that sets the job's interval is the
largest of the ranks' costs of one save (blocking time plus extra step time while
the write ran). The registry counts a save once, from the first report of its step;
the other ranks' costs of it then raise that observation (:meth:`JobTracker.on_slower_rank`):

- the reports of the job's ranks on this daemon (:meth:`SaveCosts.on_report`);
- the job's cost as the chief measured it over every rank (``SaveReport.job_cost_s``,
  ranks that agree on TensorFlow's coordination service);
- another rank's cost forwarded by the chief (:class:`~adaptd.protocol.job.SaveCost`,
  :meth:`SaveCosts.on_save_cost`), kept until its save is counted if it comes first.

:class:`SaveCosts` is one job's part of that (held by its
:class:`~adaptd.daemon.jobs.table.Job`): which saved steps were counted, and the
forwarded costs of saves not counted yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from adaptd.core.estimators import JobTracker
from adaptd.protocol.job import SaveCost, SaveReport

__all__ = ["COUNTED_STEPS", "KEPT_STEPS", "SaveCosts"]

#: Forwarded costs kept for saves not counted yet (only the next few can still be).
KEPT_STEPS = 16
#: Saved steps remembered as counted (only recent steps can be reported again).
COUNTED_STEPS = 64


@dataclass
class SaveCosts:
    """One job's counted saves and the slower ranks' costs of them."""

    #: Saved steps whose first report taught the tracker (a later report of one does not).
    counted: set[int] = field(default_factory=set)
    #: Costs other ranks reported (SaveCost) for saves not counted yet: step -> slowest.
    slower: dict[int, float] = field(default_factory=dict)

    def on_report(self, tracker: JobTracker, msg: SaveReport, now: float) -> bool:
        """A rank's save report: the tracker learns it if it is the first report of its
        step (or a failure, which always counts); then the rank's cost raises the save's.
        Returns whether it was counted."""
        counted = not msg.ok or msg.step not in self.counted
        if counted:
            tracker.on_save_report(
                now,
                msg.step,
                blocking_s=msg.blocking_s,
                durable_s=msg.durable_s,
                extra_step_s=msg.extra_step_s,
                ok=msg.ok,
                tier="local" if msg.tier == "local" else "durable",
            )
            if msg.ok:
                self.counted.add(msg.step)
                if len(self.counted) > COUNTED_STEPS:
                    self.counted.discard(min(self.counted))
        if msg.ok:
            if counted and (slower := self.slower.pop(msg.step, None)) is not None:
                tracker.on_slower_rank(msg.step, slower)
            cost = msg.blocking_s + msg.extra_step_s
            if msg.job_cost_s is not None:
                cost = max(cost, msg.job_cost_s)
            tracker.on_slower_rank(msg.step, cost, max(msg.durable_s, msg.blocking_s))
        return counted

    def on_save_cost(self, tracker: JobTracker, msg: SaveCost) -> None:
        """Another rank's cost of the save at ``msg.step``, forwarded by the job's chief."""
        if not msg.ok:
            return
        cost = msg.blocking_s + msg.extra_step_s
        if msg.step in self.counted:
            tracker.on_slower_rank(msg.step, cost)
            return
        self.slower[msg.step] = max(cost, self.slower.get(msg.step, 0.0))
        while len(self.slower) > KEPT_STEPS:
            del self.slower[min(self.slower)]

    def clear(self) -> None:
        """A new run of the job: its steps start again."""
        self.counted.clear()
        self.slower.clear()
