"""The daemon's agreement rounds for one job whose ranks have no runtime of their own.

Ranks of a job that are independent processes (no ``tf.distribute`` coordination
service), all served by one daemon, get the same guarantee as ranks that agree among
themselves (:mod:`adaptd.core.agreement`): a changed plan, or an urgent save, is committed
at a step only after every live rank acknowledged it before reaching that step.
Here the daemon is the proposer and the decider, and the messages go over its socket:

1. :meth:`JobRounds.next` turns the job's wish (a new plan from its policy, an
   urgent save) into a :class:`~adaptd.protocol.job.Propose` for every live rank, at a
   step ahead of the furthest step any rank reported: the lead covers the ranks'
   report interval (a rank may be up to one report ahead of what the daemon knows)
   plus the round's own travel.
2. Each rank answers :class:`~adaptd.protocol.job.Ack` (:meth:`JobRounds.on_ack`); a
   rank that acknowledged holds at the step until it hears the decision.
3. Once every live rank answered, or a rank left (it is no longer waited for), or
   the round timed out (:meth:`JobRounds.check`), the round is decided; the daemon
   sends the :class:`~adaptd.protocol.job.Decide` to every live rank. An aborted wish is
   proposed again further ahead.

Pure: no clock (``now`` is passed in), no sockets. The daemon keeps one per job with
more than one rank.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from adaptd.core import agreement as rules
from adaptd.core.snapshot import Decision, same_saves
from adaptd.protocol import job as p

#: Default bound on a round: a rank that has not answered by then is counted missing
#: (the protocol's :data:`~adaptd.protocol.job.ROUND_TIMEOUT_S`, the ranks' bound too).
TIMEOUT_S = p.ROUND_TIMEOUT_S
#: Default lead of a daemon's proposal: one step report interval plus travel.
LEAD_TIME_S = p.REPORT_INTERVAL_S + 0.5
#: Decided rounds kept in :attr:`JobRounds.history`.
HISTORY = 10_000


@dataclass
class OpenRound:
    """The round in flight: its proposal, when it was sent and who answered."""

    proposal: p.Propose
    since: float
    acks: dict[int, p.Ack] = field(default_factory=dict)


class JobRounds:
    """The daemon's rounds for one job.

    Args:
        job: the job id.
        world_size: the job's world size (the daemon proposes as rank ``world_size``).
        timeout_s: bound on a round.
        lead_time_s: how far ahead of the furthest reported step to propose.
    """

    def __init__(
        self,
        job: str,
        world_size: int,
        *,
        timeout_s: float = TIMEOUT_S,
        lead_time_s: float = LEAD_TIME_S,
    ) -> None:
        if world_size < 2:
            raise ValueError(f"a job of {world_size} rank needs no agreement")
        if not timeout_s > 0 or not lead_time_s >= 0:
            raise ValueError(
                f"timeout_s must be > 0 and lead_time_s >= 0, got {timeout_s!r}, {lead_time_s!r}"
            )
        self.job = job
        self.proposer = world_size
        self.timeout_s = float(timeout_s)
        self.lead_time_s = float(lead_time_s)
        self.round = 0  # the next round's number
        self.open: OpenRound | None = None
        #: The plan every rank follows once the committed rounds took effect.
        self.agreed: Decision | None = None
        self._plan: Decision | None = None
        self._save: str | None = None
        self._attempts = 0
        self._last_abort: p.Decide | None = None
        self._force = False  # propose the plan even if it saves as the agreed one
        #: The most recent decided rounds (:data:`HISTORY`): (round, action, at_step, committed).
        self.history: list[tuple[int, str, int, bool]] = []
        self.committed = 0
        self.aborted = 0
        #: The step the agreed plan is in force from.
        self.agreed_from: int | None = None
        #: When the first rank of this run said hello (set by the daemon): ranks not
        #: heard of by ``timeout_s`` later are no longer waited for (they may never come).
        self.first_hello: float | None = None
        #: How many ranks had said hello when the rounds went on without the others
        #: (logged once per count).
        self.went_on_with: int | None = None
        #: The newest decision of these rounds (what a restarted daemon is told of).
        self.last_decided: p.Decide | None = None
        #: The newest decision of the daemon that ran this job's rounds before a
        #: restart (:meth:`restore`): it may have reached some ranks and not others.
        self.inherited: p.Decide | None = None

    def restore(self, next_round: int, decided: p.Decide | None) -> None:
        """Go on from what the daemon before a restart recorded: numbers from
        ``next_round`` on (never one it may have proposed), and ``decided``, its
        newest decision, kept in :attr:`inherited` for the ranks that come back."""
        if next_round < 0:
            raise ValueError(f"next_round must be >= 0, got {next_round!r}")
        self.round = max(self.round, next_round)
        self.inherited = decided

    # ------------------------------------------------------------------ wishes

    def want_plan(self, decision: Decision) -> None:
        """The job's policy decided ``decision``; proposed unless it saves at the same
        steps as the agreed plan. An urgent decision is a save (:meth:`want_save`)."""
        if decision.urgent:
            self.want_save(decision.reason or "urgent")
        else:
            self._plan = decision

    def rejoin(self, plan: Decision | None) -> None:
        """A rank (re)joined the job (a restart, a reconnect to a restarted daemon): it
        may not know the agreed plan, so ``plan`` (the job's current one) is proposed
        again to every rank, even if it saves at the steps agreed (for the others,
        nothing changes)."""
        if plan is not None and not plan.urgent:
            self._plan = plan
            self._force = True

    def want_save(self, reason: str) -> None:
        """An urgent save (operator, drain, GPU health): proposed before any plan."""
        if self._save is None:
            self._save = reason or "save-now"

    # ------------------------------------------------------------------ rounds

    def next(
        self, now: float, steps: Mapping[int, int], step_time_s: float | None
    ) -> p.Propose | None:
        """The next round's proposal, for every live rank (``steps``: each live rank's
        newest reported step), or None: a round is open, or nothing is wanted."""
        if self.open is not None or not steps:
            return None
        lead = rules.lead_steps(step_time_s, self.lead_time_s)
        at = rules.retry_step(max(steps.values()), lead, self._last_abort, self._attempts)
        if self._save is not None:
            proposal = rules.save_proposal(self.job, self.round, at, self.proposer, self._save)
        elif self._plan is not None and (
            self._force or not same_saves(self.agreed, self._plan, at - 1)
        ):
            # never before a committed plan still waiting for its step (the lead shrinks
            # when the step time grows): plans apply in round order, the newest wins
            at = max(at, self.agreed_from or 0)
            proposal = rules.plan_proposal(
                self.job, self.round, at, self.proposer, self._plan, source="daemon"
            )
        else:
            self._plan = None
            return None
        self.open = OpenRound(proposal, now)
        self.round += 1
        return proposal

    def on_ack(self, ack: p.Ack, live: Collection[int], now: float) -> p.Decide | None:
        """Record a rank's answer; the decision when it completes the round."""
        rnd = self.open
        if rnd is None or ack.round != rnd.proposal.round or ack.job != self.job:
            return None  # late, or for a round already decided
        rnd.acks[ack.rank] = ack
        return self.check(now, live)

    def check(self, now: float, live: Collection[int]) -> p.Decide | None:
        """Decide the open round when every live rank answered (or one refused), or
        when it timed out. Call when ranks come and go, and now and then."""
        rnd = self.open
        if rnd is None:
            return None
        members = set(live)
        answered = members.issubset(rnd.acks)
        refused = any(not a.ok for r, a in rnd.acks.items() if r in members)
        if not (answered or refused or now - rnd.since >= self.timeout_s):
            return None
        decision = rules.decide(rnd.proposal, rnd.acks, members)
        self._close(rnd.proposal, decision)
        return decision

    def _close(self, proposal: p.Propose, decision: p.Decide) -> None:
        self.open = None
        self.last_decided = decision
        self.history.append((proposal.round, proposal.action, proposal.at_step, decision.commit))
        if len(self.history) > HISTORY:
            del self.history[: len(self.history) - HISTORY]
        if not decision.commit:
            self.aborted += 1
            self._attempts += 1
            self._last_abort = decision
            return
        self.committed += 1
        self._attempts, self._last_abort = 0, None
        if proposal.action == "plan":
            self.agreed = rules.decision_of(proposal)
            self.agreed_from = proposal.at_step
            self._force = False
            if self._plan is not None and same_saves(self.agreed, self._plan, proposal.at_step - 1):
                self._plan = None
        else:
            self._save = None


__all__ = ["JobRounds", "OpenRound"]
