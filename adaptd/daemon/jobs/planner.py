"""What each job is told: its policy's decision, as a plan or an urgent save.

:class:`Planner` runs a job's policy on the newest snapshot and the job's state,
applies the operator's pause, and pushes a new :class:`~adaptd.protocol.job.Plan` when
the saves it asks for changed (:func:`~adaptd.core.snapshot.same_saves`, with the
tolerance :attr:`PlannerOptions.replan_tolerance` for policies that re-fit their
interval to every report), or an urgent save for an urgent decision or an operator's
request. A policy that raises or returns something else is counted and logged; the job
keeps its plan. How the job's ranks learn the plan (at once, or agreed in a round) is
its :class:`~adaptd.daemon.jobs.delivery.Delivery`'s; a job whose plan another host
decides (:attr:`Job.decides`) is not decided here. Which policy a job runs is
:class:`~adaptd.daemon.jobs.policy_choice.PolicyChoice`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from adaptd import events as ev
from adaptd.core.snapshot import REPLAN_TOLERANCE, Decision, Snapshot, same_saves
from adaptd.daemon.jobs.delivery import Delivery
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.jobs.table import Job
from adaptd.daemon.stats import DaemonStats
from adaptd.logfmt import Throttle, logfmt

__all__ = [
    "PLAN_LEAD_S",
    "Planner",
    "PlannerOptions",
    "ahead_of_the_job",
    "same_saves",
    "snapshot_now",
]

log = logging.getLogger("adaptd.server")

#: How far past a job's last reported step an overdue save is placed (see
#: :func:`ahead_of_the_job`): ranks report about once a second, so they are up to that
#: far on when a plan reaches them.
PLAN_LEAD_S = 2.0


def snapshot_now() -> Snapshot:
    """An empty snapshot (no telemetry) at the current time: the default snapshot source."""
    return Snapshot(time=time.monotonic())


@dataclass(frozen=True)
class PlannerOptions:
    """How eagerly plans change. Raises :class:`ValueError` naming a bad option.

    ``replan_tolerance``: a new decision whose interval and next save moved by at most
    this fraction of the current interval keeps the current plan (``[0, 1)``; 0 pushes
    every change). ``lead_s``: how far past the last report an overdue save is placed
    (> 0; :func:`ahead_of_the_job`).
    """

    replan_tolerance: float = REPLAN_TOLERANCE
    lead_s: float = PLAN_LEAD_S

    def __post_init__(self) -> None:
        if not 0 <= self.replan_tolerance < 1:
            raise ValueError(f"replan_tolerance must be in [0, 1), got {self.replan_tolerance}")
        if not self.lead_s > 0:
            raise ValueError(f"lead_s must be > 0 seconds, got {self.lead_s}")


class Planner:
    """Decides and pushes plans. ``snapshot_source`` must not block (it runs in the loop).

    ``settings``: the operators' (a pause holds a job's saves); ``delivery``: tells the
    ranks; ``emit``: :class:`~adaptd.events.PlanChanged` and
    :class:`~adaptd.events.SaveRequested`; ``stats``: policy and snapshot faults.
    """

    def __init__(
        self,
        *,
        settings: OperatorSettings,
        snapshot_source: Callable[[], Snapshot],
        delivery: Delivery,
        emit: Callable[[ev.Event], None],
        stats: DaemonStats,
        options: PlannerOptions = PlannerOptions(),
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.snapshot_source = snapshot_source
        self.delivery = delivery
        self.emit = emit
        self.stats = stats
        self.options = options
        self.wall = wall
        self._throttle = Throttle()
        #: By job: the ranks whose step reports came since its last decision.
        self._reported: dict[str, set[int]] = {}

    def reported(self, job: Job, rank: int, now: float) -> bool:
        """A step report of ``rank`` was taken: decide once every live rank of the job
        reported since its last decision, else leave it to :meth:`decide_reported` (the
        loop's next tick, within a second). A job's plan is decided from job-wide
        figures, so deciding at each of its ranks' reports (once a second each) decided
        the same plan ``world_size`` times a second (issue 35: a third of a host's CPU at
        64 jobs of 8 ranks). Returns whether anything was pushed."""
        waiting = self._reported.setdefault(job.id, set())
        waiting.add(rank)
        if any(r.rank not in waiting for r in job.live_ranks()):
            return False
        return self.decide(job, now)

    def decide_reported(self, jobs: Iterable[Job], now: float) -> None:
        """Decide each of ``jobs`` that took a step report since its last decision (a
        rank that reports late or never holds its job's decision back a tick at most)."""
        for job in list(jobs):
            if self._reported.get(job.id):
                self.decide(job, now)

    def decide(self, job: Job, now: float) -> bool:
        """Run the job's policy; push a plan (or SaveNow) when it changed. Returns whether
        anything was pushed. A job whose plan another host's daemon decides
        (:attr:`Job.decides`) gets no plan from here, but an urgent decision on this
        host's view (an XID or a degraded GPU of its local ranks, this host draining)
        still asks its local ranks to save now: under the ranks' own agreement that
        rank proposes one urgent save for the whole job (docs/multiworker.md)."""
        self._reported.pop(job.id, None)
        if job.policy is None or job.state != "active":
            return False
        decided = self._decision(job, now)
        if decided is None:
            return False
        decision, step, step_time_s = decided
        if not job.decides:
            return self._urgent_here(job, decision, now)
        return self._apply(job, decision, step, step_time_s, now)

    def _urgent_here(self, job: Job, decision: Decision, now: float) -> bool:
        """For a job decided on another host: only this host's urgent decisions count."""
        if not job.urgent_once(decision.urgent):
            return False
        hosts = sorted({r.hostname for r in job.live_ranks() if r.hostname}) or ["this host"]
        self.save_now(job, f"{decision.reason or 'urgent'} (on {', '.join(hosts)})", now)
        return True

    def _decision(self, job: Job, now: float) -> tuple[Decision, int, float | None] | None:
        """The job's policy on the newest snapshot, the step and step time it saw, or
        None when it failed (counted and logged, throttled)."""
        assert job.policy is not None
        counters = self.stats.counters
        try:
            snapshot = self.snapshot_source()
        except Exception:
            counters["snapshot_errors"] += 1
            if self._throttle("snapshot"):
                log.exception(logfmt("snapshot_failed"))
            snapshot = Snapshot(time=now)
        pids = tuple(r.pid for r in job.ranks.values() if r.alive and r.pid > 0)
        target = next((s.target for s in snapshot.storage if job.id in s.jobs), None)
        paused = self.settings.paused(job.id)
        state = job.tracker.state(
            time=max(job.tracker.time, now),
            pids=pids,
            urgent=job.urgent,
            storage_target=target,
            time_since_failure_s=job.tracker.time_since_failure_s(now),
            paused=paused,
        )
        try:
            decision = job.policy.decide(snapshot, state)
        except Exception:
            counters["policy_errors"] += 1
            if self._throttle(f"policy:{job.policy_spec}"):
                log.exception(logfmt("policy_failed", job=job.id, policy=job.policy_spec))
            return None
        if not isinstance(decision, Decision):
            counters["policy_errors"] += 1
            if self._throttle(f"policy-type:{job.policy_spec}"):
                error = f"returned {type(decision).__name__}, not a Decision"
                log.error(logfmt("policy_failed", job=job.id, policy=job.policy_spec, error=error))
            return None
        if paused and not decision.urgent:
            decision = Decision(
                next_step=None,
                reason=f"paused by operator (the policy would: {decision.reason})",
                policy=decision.policy,
                interval_s=decision.interval_s,
                waste=decision.waste,
            )
        step_time_s = state.step_time_s
        ahead = ahead_of_the_job(decision, job.plan, state.step, step_time_s, self.options.lead_s)
        return ahead, state.step, step_time_s

    def _apply(
        self, job: Job, decision: Decision, step: int, step_time_s: float | None, now: float
    ) -> bool:
        """Push ``decision`` to the job (SaveNow if urgent, else a changed plan); ``step``
        and ``step_time_s`` are the job's as the policy saw them."""
        outcome = job.decided(decision, step, self.options.replan_tolerance)
        if outcome == "urgent":
            self.save_now(job, decision.reason or "urgent", now)
            return True
        if outcome is None:
            return False
        plan, ranks = self.delivery.plan(job, now)
        log.info(logfmt("plan", job=job.id, seq=plan.seq, step=step,
                        next_step=plan.next_step, every_steps=plan.every_steps,
                        policy=plan.policy, reason=plan.reason,
                        interval_s=plan.interval_s, waste=plan.waste, ranks=ranks))  # fmt: skip
        self.emit(ev.PlanChanged(now, self.wall(), job.id, plan.seq, step, decision,
                                 ranks, step_time_s=step_time_s))  # fmt: skip
        return True

    def replan(self, job: Job, now: float) -> int:
        """Decide afresh and push the plan even if its saves did not change (the reason did).
        Returns the plan's seq, 0 when nothing could be pushed."""
        if job.state != "active":
            return 0
        job.forget_plan()
        self.decide(job, now)
        return job.plan_seq if job.plan is not None else 0

    def save_now(self, job: Job, reason: str, now: float) -> int:
        """Ask every live rank of ``job`` to save at its next step; returns how many."""
        ranks = self.delivery.save_now(job, reason, now)
        log.info(logfmt("save_now", job=job.id, step=job.step, reason=reason, ranks=ranks))
        self.emit(ev.SaveRequested(now, self.wall(), job.id, job.step, reason, ranks,
                                   step_time_s=job.tracker.step_time_s))  # fmt: skip
        return ranks


def ahead_of_the_job(
    new: Decision,
    old: Decision | None,
    step: int,
    step_time_s: float | None,
    lead_s: float = PLAN_LEAD_S,
) -> Decision:
    """An overdue save moved to a step the job's ranks have not passed yet.

    A policy plans an overdue save at the step after the job's last report
    (``step + 1``), but a rank is up to a report interval further on when the plan
    reaches it, so it would take the next step of the plan's grid, a whole interval
    later; and at the next report the same overdue decision, named from a newer
    step, would move the grid again, so the save never came (a job whose interval
    shrank while a slow write was in flight went 45 s without a save). So the save
    goes ``lead_s`` of steps past ``step``, or stays at the step the current plan
    ``old`` already names within that lead: once announced, it holds still.
    """
    if new.urgent or new.next_step is None or new.next_step > step + 1:
        return new
    if not step_time_s or step_time_s <= 0:
        return new
    lead = step + max(1, math.ceil(lead_s / step_time_s))
    pending = old.due_after(step) if old is not None and not old.urgent else None
    nxt = pending if pending is not None and pending <= lead else lead
    return dataclasses.replace(new, next_step=nxt)
