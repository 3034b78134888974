"""δ of a job with several ranks: its slowest rank's cost of each save.

Every rank of a data-parallel job saves at the same step, and the job goes on only
when the slowest of them does, so the cost that sets the job's interval is the
largest of the ranks' costs of one save (blocking time plus extra step time while
the write ran). The registry counts a save once, from the first report of its step;
the other ranks' costs of it then raise that observation (:meth:`JobTracker.on_slower_rank`):

- the reports of the job's ranks on this daemon (:func:`on_report`);
- the job's cost as the chief measured it over every rank (``SaveReport.job_cost_s``,
  ranks that agree on TensorFlow's coordination service);
- another rank's cost forwarded by the chief (:class:`~adaptd.protocol.job.SaveCost`,
  :func:`on_save_cost`), kept until its save is counted if it comes first.
"""

from __future__ import annotations

from adaptd.daemon.jobs.records import Job
from adaptd.protocol.job import SaveCost, SaveReport

__all__ = ["KEPT_STEPS", "on_report", "on_save_cost"]

#: Forwarded costs kept for saves not counted yet (only the next few can still be).
KEPT_STEPS = 16


def on_report(job: Job, msg: SaveReport, counted: bool) -> None:
    """A rank's save report, after the registry counted it (``counted``) or not."""
    if not msg.ok:
        return
    t = job.tracker
    if counted:
        slower = job.slower_costs.pop(msg.step, None)
        if slower is not None:
            t.on_slower_rank(msg.step, slower)
    cost = msg.blocking_s + msg.extra_step_s
    if msg.job_cost_s is not None:
        cost = max(cost, msg.job_cost_s)
    t.on_slower_rank(msg.step, cost, max(msg.durable_s, msg.blocking_s))


def on_save_cost(job: Job, msg: SaveCost) -> None:
    """Another rank's cost of the save at ``msg.step``, forwarded by the job's chief."""
    if not msg.ok:
        return
    cost = msg.blocking_s + msg.extra_step_s
    if msg.step in job.counted_save_steps:
        job.tracker.on_slower_rank(msg.step, cost)
        return
    costs = job.slower_costs
    costs[msg.step] = max(cost, costs.get(msg.step, 0.0))
    while len(costs) > KEPT_STEPS:
        del costs[min(costs)]
