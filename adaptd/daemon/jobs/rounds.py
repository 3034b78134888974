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

A daemon dying while it sends a decision can leave it with some ranks and not the
others (the send loop, and what zmq had not written yet when the process died; a
daemon SIGKILLed mid-run in a loaded suite run left one rank of three with a plan the
others never applied). So, with a :class:`RoundMemory` (``adaptd serve``'s is the state
database, :class:`StoredRounds`), every proposal's number and every decision is
written, synchronously, *before* it is sent; a restarted daemon numbers its rounds after
the last one proposed and sends the last decision first to every rank that comes back.
A rank still holding at that round's step (it holds for up to the round timeout,
:data:`~adaptd.protocol.job.ROUND_TIMEOUT_S`) takes it as the others did; a decision
that was never written was never sent, so the ranks holding that round give it up, all
of them, at their own timeout or at the new daemon's first proposal
(:mod:`adaptd.client.agreement.daemon_rounds`). Left: a daemon down for longer than the
round timeout finds the holders gone on without the decision some had.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from adaptd.core.rounds import TIMEOUT_S, JobRounds
from adaptd.core.snapshot import Decision
from adaptd.daemon.jobs.table import Job, Rank
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import SendRank
from adaptd.logfmt import logfmt
from adaptd.protocol import job as p

__all__ = ["Agreements", "RoundMemory", "StoredRounds"]

log = logging.getLogger("adaptd.server")


class RoundMemory(Protocol):
    """Where a job's rounds are recorded to outlive the daemon: ``save`` must be
    durable when it returns (it runs before the message it records is sent)."""

    def load(self, job: str) -> tuple[int, p.Decide | None]:
        """The next round number to use, and the newest decision (None: none)."""
        ...

    def save(self, job: str, next_round: int, decided: p.Decide | None) -> None: ...


class Params(Protocol):
    """The part of :class:`~adaptd.state.store.Store` :class:`StoredRounds` uses."""

    def param(self, scope: str, key: str, default: Any = None) -> Any: ...
    def set_param(self, scope: str, key: str, value: Any) -> None: ...
    def flush(self) -> int: ...


class StoredRounds:
    """:class:`RoundMemory` in the state database's parameters (scope ``rounds``, one
    key per job), each save flushed at once (one small transaction per round)."""

    SCOPE = "rounds"

    def __init__(self, store: Params) -> None:
        self.store = store

    def load(self, job: str) -> tuple[int, p.Decide | None]:
        got = self.store.param(self.SCOPE, job)
        if not isinstance(got, dict):
            return 0, None
        try:
            nxt = int(got["next"])
            d = got.get("decided")
            decided = None if d is None else p.Decide(
                v=p.VERSION, job=job, round=int(d["round"]), commit=bool(d["commit"]),
                reason=str(d.get("reason", "")), retry_from=d.get("retry_from"),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            log.warning(logfmt("rounds_record_unreadable", job=job, error=repr(exc)))
            return 0, None
        return max(0, nxt), decided

    def save(self, job: str, next_round: int, decided: p.Decide | None) -> None:
        d = None
        if decided is not None:
            d = {"round": decided.round, "commit": decided.commit, "reason": decided.reason,
                 "retry_from": decided.retry_from}  # fmt: skip
        self.store.set_param(self.SCOPE, job, {"next": next_round, "decided": d})
        self.store.flush()


class Agreements:
    """The rounds of every job that :attr:`~adaptd.daemon.jobs.table.Job.runs_rounds`;
    called from the daemon's loop."""

    def __init__(
        self,
        *,
        send: SendRank,
        stats: DaemonStats,
        timeout_s: float = TIMEOUT_S,
        memory: RoundMemory | None = None,
    ) -> None:
        """``timeout_s``: a round's bound, and how long the rounds wait for ranks not heard
        of after a daemon restart. ``memory``: where the rounds are recorded before
        their messages go (None: nowhere; a restart starts again at round 0)."""
        self.send = send
        self.stats = stats
        self.timeout_s = timeout_s
        self.memory = memory

    def rounds(self, job: Job) -> JobRounds:
        """The job's rounds (made at first use; a new run of the job gets new ones,
        numbered on from the recorded ones)."""
        return job.rounds_made(lambda: self._made(job))

    def _made(self, job: Job) -> JobRounds:
        rounds = JobRounds(job.id, job.world_size, timeout_s=self.timeout_s)
        if self.memory is not None:
            rounds.restore(*self.memory.load(job.id))
        return rounds

    def _record(self, job: Job, rounds: JobRounds) -> None:
        if self.memory is not None:
            self.memory.save(job.id, rounds.round, rounds.last_decided or rounds.inherited)

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
        if rounds.inherited is not None:  # first: it may end a round the rank holds
            self.send(rank, rounds.inherited, now)
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
        self._record(job, rounds)  # its number, before any rank can hold at it
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
        self._record(job, self.rounds(job))  # before any rank hears it
        live = job.live_ranks()
        for r in live:
            self.send(r, decision, now)
        self.stats.counters["rounds_committed" if decision.commit else "rounds_aborted"] += 1
        log.info(logfmt("round_decided", job=job.id, round=decision.round,
                        commit=decision.commit, reason=decision.reason or None,
                        retry_from=decision.retry_from, ranks=len(live)))  # fmt: skip
        self.advance(job, now)


def _live(job: Job) -> list[int]:
    return [r.rank for r in job.live_ranks()]
