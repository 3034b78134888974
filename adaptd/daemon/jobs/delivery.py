"""How a job's ranks learn what was decided for them: directly, or in agreement rounds.

The :class:`~adaptd.daemon.jobs.planner.Planner` decides a job's plan and its urgent
saves; :class:`Delivery` is the one part that tells the job's ranks, and the one owner
of the daemon's agreement rounds:

- a job whose ranks agree through this daemon
  (:attr:`~adaptd.daemon.jobs.table.Job.runs_rounds`) must switch plans at the same
  step on every rank, so its plans and urgent saves are proposed in a round
  (:class:`~adaptd.daemon.jobs.rounds.Agreements`), never sent as they are; its ranks'
  hellos, acknowledgements and goodbyes go to the rounds, and so does every tick;
- any other job's live ranks get a :class:`~adaptd.protocol.job.Plan` or a
  :class:`~adaptd.protocol.job.SaveNow` at once;
- every rank that reports after ``resend_after_s`` without hearing from the daemon
  gets the plan again, or its Welcome when it is sent no plans (rounds, or a plan
  decided on another host): the daemon's half of the liveness contract
  (:data:`adaptd.protocol.job.KEEPALIVE_S`).
"""

from __future__ import annotations

from collections.abc import Iterable

from adaptd import __version__
from adaptd.daemon.jobs.rounds import Agreements
from adaptd.daemon.jobs.table import Job, Rank
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import SendRank
from adaptd.protocol import job as p

__all__ = ["RESEND_AFTER_S", "Delivery", "plan_message"]

#: A rank that sends anything (but a Goodbye) after this long without hearing from the
#: daemon gets the plan (or its Welcome) again: the daemon's half of the liveness
#: contract (:data:`adaptd.protocol.job.KEEPALIVE_S`).
RESEND_AFTER_S = p.KEEPALIVE_S


class Delivery:
    """Tells ranks their job's plan and urgent saves; runs the rounds of the jobs that
    agree through this daemon. Called from the daemon's loop."""

    def __init__(
        self,
        *,
        send: SendRank,
        rounds: Agreements,
        stats: DaemonStats,
        resend_after_s: float = RESEND_AFTER_S,
    ) -> None:
        self.send = send
        self.rounds = rounds
        self.stats = stats
        self.resend_after_s = resend_after_s

    # ------------------------------------------------------------------ what was decided

    def plan(self, job: Job, now: float) -> tuple[p.Plan, int]:
        """The job's new plan to its live ranks, or proposed in a round (applied at the
        step it agrees). Returns the plan as the wire carries it (:func:`plan_message`)
        and the ranks told."""
        msg = plan_message(job)
        ranks = [r for r in job.ranks.values() if r.alive]
        if job.runs_rounds:
            assert job.plan is not None
            self.rounds.want_plan(job, job.plan, now)
            return msg, len(ranks)
        for r in ranks:
            self.send(r, msg, now)
        self.stats.counters["plans_sent"] += len(ranks)
        return msg, len(ranks)

    def save_now(self, job: Job, reason: str, now: float) -> int:
        """Every live rank saves at its next step (one agreed step, in a round); returns
        how many ranks were asked."""
        ranks = job.live_ranks()
        if job.runs_rounds:
            self.rounds.want_save(job, reason, now)
            return len(ranks)
        msg = p.SaveNow(v=p.VERSION, job=job.id, reason=reason[: p.MAX_TEXT])
        for r in ranks:
            self.send(r, msg, now)
        return len(ranks)

    # ------------------------------------------------------------------ what ranks say

    def welcome(self, job: Job, rank: Rank, now: float) -> None:
        """The reply to a hello, and the liveness signal of a rank sent no plans."""
        msg = p.Welcome(v=p.VERSION, job=job.id, rank=rank.rank, daemon_version=__version__)
        self.send(rank, msg, now)

    def joined(self, job: Job, rank: Rank, pushed: bool, now: float) -> None:
        """``rank`` said hello (its Welcome sent, its job decided: ``pushed`` whether that
        sent a new plan). A rank of a job in rounds takes part in the round in flight
        and learns the job's plan in the next; any other gets the current plan now."""
        if job.runs_rounds:
            self.rounds.on_hello(job, rank, now)
        elif job.decides and not pushed and job.plan is not None:
            self.send(rank, plan_message(job), now)

    def acked(self, job: Job, ack: p.Ack, now: float) -> None:
        if job.runs_rounds:
            self.rounds.on_ack(job, ack, now)

    def left(self, job: Job, now: float) -> None:
        """A rank said goodbye: a round no longer waits for it."""
        if job.runs_rounds:
            self.rounds.check(job, now)

    def tick(self, jobs: Iterable[Job], now: float) -> None:
        """Once a second: the rounds that a lost rank or the time decides."""
        self.rounds.tick(jobs, now)

    def answer(self, job: Job, rank: Rank, now: float) -> None:
        """The client's sign that its daemon is alive: the plan again (or the Welcome, for
        a rank sent no plans) unless the rank heard from the daemon within
        ``resend_after_s``. Every message but a Goodbye is answered so: an Ack or a
        JobPlan may be the one the client times (:data:`adaptd.protocol.job.KEEPALIVE_S`)."""
        if now - rank.last_sent < self.resend_after_s:
            return
        if not job.decides or job.runs_rounds:
            self.welcome(job, rank, now)
        elif job.plan is not None:
            self.send(rank, plan_message(job), now)


def plan_message(job: Job) -> p.Plan:
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
        durable_every=d.durable_every if d.durable_every and d.durable_every >= 1 else None,
        memory_budget=job.memory_budget if job.local_tier == "memory" else None,
    )


def _figure(value: float | None) -> float | None:
    """A policy's figure as the protocol carries it: None unless finite and in range."""
    if value is None or not 0 <= value <= p.MAX_SECONDS:
        return None
    return value
