"""The daemon running its agreement rounds for the jobs whose ranks have no runtime.

A job whose ranks said ``Hello.agreement = "daemon"`` (independent processes of one
job on this host) must save at the same steps on every rank, so its plans are never
pushed as plain :class:`~adaptd.protocol.job.Plan` messages that each rank switches to
on arrival. :class:`Agreements` turns what is wanted for such a job (a new plan, an
urgent save: :class:`~adaptd.daemon.jobs.delivery.Delivery`, the one part that calls it,
hands them over) into rounds of the job's :class:`~adaptd.core.rounds.JobRounds`
(pure; the rules are :mod:`adaptd.core.agreement`) and does their I/O:

- a proposal goes to every live rank, once every rank of the job has said hello in
  this run (a rank the daemon has not heard of yet could not acknowledge, and would
  miss the change: after a daemon restart, the ranks come back one by one), or once
  ``timeout_s`` passed since the first of them did: a rank that died while the daemon
  was down never comes back, and must not hold the job's rounds for ever (it learns
  the plan when it does come: see the next point);
- each :class:`~adaptd.protocol.job.Ack` is recorded; the round is decided when every
  live rank answered, one refused (it had passed the step: the wish is proposed
  again further ahead), a rank left (it is not waited for) or it timed out (checked
  every tick); the :class:`~adaptd.protocol.job.Decide` goes to every live rank;
- a rank that (re)joins gets the round in flight and, in the next round, the job's
  current plan again (it may not know the plan agreed before it came).

A restarted daemon starts again at round 0 with no agreed plan; a rank that still
holds at a step of the dead daemon's round gives that round up at its own timeout
or at the new daemon's first proposal (:mod:`adaptd.client.agreement.daemon_rounds`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from adaptd.core.rounds import TIMEOUT_S, JobRounds
from adaptd.core.snapshot import Decision
from adaptd.daemon.jobs.table import Job, Rank
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import SendRank
from adaptd.logfmt import logfmt
from adaptd.protocol import job as p

__all__ = ["Agreements"]

log = logging.getLogger("adaptd.server")


class Agreements:
    """The rounds of every job that :attr:`~adaptd.daemon.jobs.table.Job.runs_rounds`;
    called from the daemon's loop."""

    def __init__(self, *, send: SendRank, stats: DaemonStats, timeout_s: float = TIMEOUT_S) -> None:
        """``timeout_s``: a round's bound, and how long the rounds wait for ranks not heard
        of after a daemon restart."""
        self.send = send
        self.stats = stats
        self.timeout_s = timeout_s

    def rounds(self, job: Job) -> JobRounds:
        """The job's rounds (made at first use; a new run of the job gets new ones)."""
        return job.rounds_made(lambda: JobRounds(job.id, job.world_size, timeout_s=self.timeout_s))

    # ------------------------------------------------------------------ wishes

    def want_plan(self, job: Job, decision: Decision, now: float) -> None:
        """The job's new plan: proposed in a round, never sent as such."""
        self.rounds(job).want_plan(decision)
        self.advance(job, now)

    def want_save(self, job: Job, reason: str, now: float) -> None:
        """An urgent save (operator, drain, policy): one agreed step for every rank."""
        self.rounds(job).want_save(reason)
        self.advance(job, now)

    # ------------------------------------------------------------------ ranks

    def on_hello(self, job: Job, rank: Rank, now: float) -> None:
        """A rank said hello: it takes part in the round in flight, and the job's plan is
        proposed again so that it learns it (see :meth:`JobRounds.rejoin`)."""
        rounds = self.rounds(job)
        if rounds.first_hello is None:
            rounds.first_hello = now
        if rounds.open is not None:
            self.send(rank, rounds.open.proposal, now)
        rounds.rejoin(job.plan)
        self.advance(job, now)

    def on_ack(self, job: Job, ack: p.Ack, now: float) -> None:
        rounds = self.rounds(job)
        self._decided(job, rounds.on_ack(ack, _live(job), now), now)

    def check(self, job: Job, now: float) -> None:
        """Decide a round a departed rank no longer holds up, or one that timed out;
        then propose what is wanted next. After a goodbye, a loss, and every tick."""
        if job.state != "active" or job.rounds is None:
            return
        self._decided(job, job.rounds.check(now, _live(job)), now)
        self.advance(job, now)

    def tick(self, jobs: Iterable[Job], now: float) -> None:
        for job in jobs:
            if job.runs_rounds:
                self.check(job, now)

    # ------------------------------------------------------------------ rounds

    def advance(self, job: Job, now: float) -> None:
        """Propose the next wish, when no round is open and every rank is known."""
        rounds = self.rounds(job)
        if job.state != "active" or rounds.open is not None:
            return
        if len(job.joined) < job.world_size and not self._stop_waiting(job, rounds, now):
            return  # a rank not heard of yet would miss the change
        live = job.live_ranks()
        steps = {r.rank: r.step for r in live}
        proposal = rounds.next(now, steps, job.tracker.step_time_s)
        if proposal is None:
            return
        for r in live:
            self.send(r, proposal, now)
        self.stats.counters["rounds_proposed"] += 1
        log.info(logfmt("round_proposed", job=job.id, round=proposal.round,
                        action=proposal.action, at_step=proposal.at_step,
                        next_step=proposal.next_step, every_steps=proposal.every_steps,
                        reason=proposal.reason, ranks=len(live)))  # fmt: skip

    def _stop_waiting(self, job: Job, rounds: JobRounds, now: float) -> bool:
        """Whether the rounds go on without the ranks that have not said hello in this
        run: ``timeout_s`` after the first did (a bound on a live rank's return after a
        daemon restart, which it notices within seconds). Logged once per count."""
        since = rounds.first_hello
        if since is None or now - since < self.timeout_s:
            return False
        if rounds.went_on_with != len(job.joined):
            rounds.went_on_with = len(job.joined)
            log.warning(logfmt("round_without_ranks", job=job.id,
                               missing=job.world_size - len(job.joined),
                               waited_s=round(now - since, 1)))  # fmt: skip
        return True

    def _decided(self, job: Job, decision: p.Decide | None, now: float) -> None:
        if decision is None:
            return
        live = job.live_ranks()
        for r in live:  # one loop: a daemon dying here is the one window of disagreement
            self.send(r, decision, now)
        self.stats.counters["rounds_committed" if decision.commit else "rounds_aborted"] += 1
        log.info(logfmt("round_decided", job=job.id, round=decision.round,
                        commit=decision.commit, reason=decision.reason or None,
                        retry_from=decision.retry_from, ranks=len(live)))  # fmt: skip
        self.advance(job, now)


def _live(job: Job) -> list[int]:
    return [r.rank for r in job.live_ranks()]
