"""What each job is told: its policy's decision, as a plan or an urgent save.

:class:`Planner` runs a job's policy on the newest snapshot and the job's state,
applies the operator's pause, and pushes a new :class:`~adaptd.protocol.job.Plan` to
every live rank when the saves it asks for changed (:func:`~adaptd.core.snapshot.same_saves`,
with the tolerance :data:`REPLAN_TOLERANCE` for policies that re-fit their interval
to every report), or a :class:`~adaptd.protocol.job.SaveNow` for an urgent decision or
an operator's request. It also chooses a job's policy at hello (the operator's
setting, the job's own spec, the daemon's default) and changes it on
``set-policy``. A policy that raises or returns something else is counted and
logged; the job keeps its plan. A job whose ranks agree through the daemon gets its
plans and urgent saves as agreement rounds (:mod:`adaptd.daemon.jobs.rounds`), never as
plain messages; a job whose plan another host decides (:attr:`Job.decides`) is
not decided here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from adaptd.core.policy import Policy, PolicyCache, PolicyError
from adaptd.core.snapshot import Decision, Snapshot, same_saves
from adaptd.daemon import events as ev
from adaptd.daemon.jobs.records import Job, Rank
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.logfmt import Throttle, logfmt
from adaptd.daemon.stats import DaemonStats
from adaptd.protocol import job as p

if TYPE_CHECKING:
    from adaptd.daemon.jobs.rounds import Agreements

__all__ = [
    "PLAN_LEAD_S",
    "REPLAN_TOLERANCE",
    "Planner",
    "SendRank",
    "ahead_of_the_job",
    "same_saves",
]

log = logging.getLogger("adaptd.server")

#: A new decision whose interval and next save moved by at most this fraction of the
#: current interval keeps the current plan (see :func:`~adaptd.core.snapshot.same_saves`).
REPLAN_TOLERANCE = 0.05
#: How far past a job's last reported step an overdue save is placed (see
#: :func:`ahead_of_the_job`): ranks report about once a second, so they are up to that
#: far on when a plan reaches them.
PLAN_LEAD_S = 2.0

#: Sends a message to one rank and notes when (:meth:`adaptd.daemon.transport.Transport.send_rank`).
SendRank = Callable[[Rank, p.Message, float], None]


class Planner:
    """Decides and pushes plans. ``snapshot_source`` must not block (it runs in the loop)."""

    def __init__(
        self,
        *,
        default_policy: Policy,
        default_spec: str,
        policies: PolicyCache,
        settings: OperatorSettings,
        snapshot_source: Callable[[], Snapshot],
        send: SendRank,
        emit: Callable[[ev.Event], None],
        stats: DaemonStats,
        replan_tolerance: float = REPLAN_TOLERANCE,
        wall: Callable[[], float] = time.time,
        agreements: Agreements | None = None,
    ) -> None:
        self.default_policy = default_policy
        self.default_spec = default_spec
        self.policies = policies
        self.settings = settings
        self.snapshot_source = snapshot_source
        self.send = send
        self.emit = emit
        self.stats = stats
        self.replan_tolerance = replan_tolerance
        self.wall = wall
        #: The rounds of jobs whose ranks agree through this daemon: their plans and
        #: urgent saves go there instead of to the ranks (adaptd.daemon.jobs.rounds).
        self.agreements = agreements
        self._throttle = Throttle()

    def _rounds(self, job: Job) -> Agreements | None:
        return self.agreements if job.runs_rounds else None

    # ------------------------------------------------------------------ policies

    def choose_policy(self, job: Job, asked: str, rank: int) -> str | None:
        """Give a job its policy at hello, if it has none yet: the operator's setting,
        else the spec the rank ``asked`` for, else the daemon's default. Returns why
        the asked spec was refused (the rank is told), else ``None``."""
        if asked:
            job.asked_spec = asked
        configured = self.settings.policy(job.id)
        if job.policy is None and configured is not None:
            job.policy = self.policies.get(configured)  # parsed when it was set
            job.policy_spec = configured
        if job.policy is None:
            spec = asked or self.default_spec
            try:
                job.policy = self.policies.get(spec)
                job.policy_spec = spec
            except PolicyError as exc:
                job.policy = self.default_policy
                job.policy_spec = self.default_spec
                return f"policy {asked!r} refused, using {self.default_spec!r}: {exc}"
        elif asked and asked != job.policy_spec:
            log.warning(
                logfmt("policy_ignored", job=job.id, rank=rank, asked=asked, using=job.policy_spec)
            )
        return None

    def set_policy(self, job: Job, spec: str, now: float) -> tuple[str, int]:
        """An operator's new policy for ``job``, kept in its settings and pushed at once.
        Returns ``(previous spec, plan seq)``; raises :class:`PolicyError`."""
        policy = self.policies.get(spec)
        previous = job.policy_spec
        job.policy, job.policy_spec = policy, spec
        self.settings.change(job.id, now, policy=spec)
        return previous, self.replan(job, now)

    def clear_policy(self, job: Job, now: float) -> tuple[str | None, str, str, int]:
        """Take back an operator's policy: the job gets the config's for it, else the
        spec its ranks asked for, else the daemon's default (as at a first hello).
        Returns ``(operator's spec taken back or None when none was set, spec now,
        where it comes from: "config", "job" or "default", plan seq)``."""
        before, configured = self.settings.clear_policy(job.id, now)
        cleared = before if before != configured else None
        spec, source, policy = self._unset_policy(job, configured)
        if cleared is None and spec == job.policy_spec:
            return None, spec, source, 0  # nothing to take back
        job.policy, job.policy_spec = policy, spec
        return cleared, spec, source, self.replan(job, now)

    def _unset_policy(self, job: Job, configured: str | None) -> tuple[str, str, Policy]:
        """The job's policy when no operator set one: ``(spec, source, policy)``."""
        for spec, source in ((configured, "config"), (job.asked_spec, "job")):
            if spec:
                try:
                    return spec, source, self.policies.get(spec)
                except PolicyError:
                    continue  # refused at hello already: the default took over then too
        return self.default_spec, "default", self.default_policy

    # ------------------------------------------------------------------ decisions

    def decide(self, job: Job, now: float) -> bool:
        """Run the job's policy; push a plan (or SaveNow) when it changed. Returns whether
        anything was pushed. A job whose plan another host's daemon decides
        (:attr:`Job.decides`) gets no plan from here, but an urgent decision on this
        host's view (an XID or a degraded GPU of its local ranks, this host draining)
        still asks its local ranks to save now: under the ranks' own agreement that
        rank proposes one urgent save for the whole job (docs/multiworker.md)."""
        if job.policy is None or job.state != "active":
            return False
        decided = self._decision(job, now)
        if decided is None:
            return False
        decision, step = decided
        if not job.decides:
            return self._urgent_here(job, decision, now)
        return self._apply(job, decision, step, now)

    def _urgent_here(self, job: Job, decision: Decision, now: float) -> bool:
        """For a job decided on another host: only this host's urgent decisions count."""
        if not decision.urgent:
            job.urgent_sent = False
            return False
        if job.urgent_sent:
            return False
        job.urgent_sent = True
        hosts = sorted({r.hostname for r in job.live_ranks() if r.hostname}) or ["this host"]
        self.save_now(job, f"{decision.reason or 'urgent'} (on {', '.join(hosts)})", now)
        return True

    def _decision(self, job: Job, now: float) -> tuple[Decision, int] | None:
        """The job's policy on the newest snapshot and the step it saw, or None when it
        failed (counted and logged, throttled)."""
        assert job.policy is not None
        counters = self.stats.counters
        try:
            snapshot = self.snapshot_source()
        except Exception:
            counters["snapshot_errors"] += 1
            if self._throttle("snapshot"):
                log.exception(logfmt("snapshot_failed"))
            snapshot = Snapshot(time=now)
        paused = self.settings.paused(job.id)
        state = job.tracker.state(
            time=max(job.tracker.time, now),
            pids=tuple(r.pid for r in job.live_ranks() if r.pid > 0),
            urgent=job.urgent,
            storage_target=next((s.target for s in snapshot.storage if job.id in s.jobs), None),
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
                log.error(
                    logfmt(
                        "policy_failed",
                        job=job.id,
                        policy=job.policy_spec,
                        error=f"returned {type(decision).__name__}, not a Decision",
                    )
                )
            return None
        if paused and not decision.urgent:
            decision = Decision(
                next_step=None,
                reason=f"paused by operator (the policy would: {decision.reason})",
                policy=decision.policy,
                interval_s=decision.interval_s,
                waste=decision.waste,
            )
        return ahead_of_the_job(decision, job.plan, state.step, state.step_time_s), state.step

    def _apply(self, job: Job, decision: Decision, step: int, now: float) -> bool:
        """Push ``decision`` to the job (SaveNow if urgent, else a changed plan); ``step``
        is the job's step the policy saw."""
        job.latest = decision
        if decision.urgent:
            if job.urgent_sent:
                return False
            job.urgent_sent = True
            self.save_now(job, decision.reason or "urgent", now)
            return True
        job.urgent_sent = False
        if job.plan is not None and same_saves(job.plan, decision, step, self.replan_tolerance):
            return False
        self._push(job, decision, step, now)
        return True

    def replan(self, job: Job, now: float) -> int:
        """Decide afresh and push the plan even if its saves did not change (the reason did).
        Returns the plan's seq, 0 when nothing could be pushed."""
        if job.state != "active":
            return 0
        job.plan = None
        job.urgent_sent = False
        self.decide(job, now)
        return job.plan_seq if job.plan is not None else 0

    def _push(self, job: Job, decision: Decision, step: int, now: float) -> None:
        job.plan = decision
        job.plan_seq += 1
        plan = self.plan_message(job)
        ranks = job.live_ranks()
        rounds = self._rounds(job)
        if rounds is not None:  # agreed in a round first, applied at its step
            rounds.want_plan(job, decision, now)
        else:
            for r in ranks:
                self.send(r, plan, now)
            self.stats.counters["plans_sent"] += len(ranks)
        log.info(
            logfmt(
                "plan",
                job=job.id,
                seq=plan.seq,
                step=step,
                next_step=plan.next_step,
                every_steps=plan.every_steps,
                policy=plan.policy,
                reason=plan.reason,
                interval_s=plan.interval_s,
                waste=plan.waste,
                ranks=len(ranks),
            )
        )
        self.emit(
            ev.PlanChanged(
                now,
                self.wall(),
                job.id,
                plan.seq,
                step,
                decision,
                len(ranks),
                step_time_s=job.tracker.step_time_s,
            )
        )

    # ------------------------------------------------------------------ messages

    def plan_message(self, job: Job) -> p.Plan:
        """The job's current plan as the wire message (figures a rank cannot use dropped)."""
        d = job.plan
        assert d is not None
        return p.Plan(
            v=p.VERSION,
            job=job.id,
            seq=job.plan_seq,
            next_step=d.next_step,
            every_steps=d.every_steps if d.every_steps and d.every_steps >= 1 else None,
            policy=(d.policy or job.policy_spec)[: p.MAX_TEXT],
            reason=d.reason[: p.MAX_TEXT],
            interval_s=_figure(d.interval_s),
            waste=_figure(d.waste),
        )

    def send_plan(self, rank: Rank, job: Job, now: float) -> None:
        """The job's current plan again, to one rank (a reconnect, a quiet rank). A rank
        whose plans are agreed in rounds, or decided on another host, gets its Welcome
        instead (the client's sign that the daemon is alive): never a plain plan."""
        if not job.decides or self._rounds(job) is not None:
            if self.agreements is not None:
                self.agreements.keep_alive(job, rank, now)
        elif job.plan is not None:
            self.send(rank, self.plan_message(job), now)

    def save_now(self, job: Job, reason: str, now: float) -> int:
        """Ask every live rank of ``job`` to save at its next step; returns how many."""
        msg = p.SaveNow(v=p.VERSION, job=job.id, reason=reason[: p.MAX_TEXT])
        ranks = job.live_ranks()
        rounds = self._rounds(job)
        if rounds is not None:  # one agreed step for every rank
            rounds.want_save(job, reason, now)
        else:
            for r in ranks:
                self.send(r, msg, now)
        log.info(logfmt("save_now", job=job.id, step=job.step, reason=reason, ranks=len(ranks)))
        self.emit(
            ev.SaveRequested(
                now,
                self.wall(),
                job.id,
                job.step,
                reason,
                len(ranks),
                step_time_s=job.tracker.step_time_s,
            )
        )
        return len(ranks)


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


def _figure(value: float | None) -> float | None:
    """A policy's figure as the protocol carries it: None unless finite and in range."""
    if value is None or not 0 <= value <= p.MAX_SECONDS:
        return None
    return value
