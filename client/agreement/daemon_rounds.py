"""A rank's side of its daemon's agreement rounds (ranks without a coordination runtime).

Ranks of one job that are independent processes on one host have no runtime to agree
on; their daemon runs the rounds instead (:mod:`adaptd.core.rounds`): it proposes a
change at a step ahead of every rank (:class:`~adaptd.protocol.job.Propose`), each rank
answers (:class:`~adaptd.protocol.job.Ack`) and, if it answered yes, does not pass that
step until the daemon's :class:`~adaptd.protocol.job.Decide` arrives.

Everything here runs on the training thread: the hook hands over the messages it
receives, sends the answers, and at a step it must not pass yet lets :meth:`settle`
wait for the decision, reading its socket meanwhile. If no decision comes within the
timeout (the daemon died in the middle of a round) the rank counts the round as
aborted and goes on with the plan it has. A daemon that died after telling some ranks
"commit" and before telling the others had written that decision first; restarted, it
sends it to every rank that comes back before anything else, and a rank still
holding takes it here (:meth:`on_decide`). Ranks could disagree only if the daemon
stays away longer than the timeout (:mod:`adaptd.daemon.jobs.rounds`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from adaptd.client.agreement.ledger import Ledger, Recorded
from adaptd.client.save.schedule import NEVER, SaveSchedule
from adaptd.core import agreement as rules
from adaptd.protocol import job as p


class DaemonRounds(Recorded):
    """This rank's rounds with its daemon.

    Args:
        job, rank: who this is.
        timeout_s: longest wait at a step for a decision (default: the daemon's bound
            on a round, :data:`adaptd.protocol.job.ROUND_TIMEOUT_S`).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        job: str,
        rank: int,
        *,
        timeout_s: float = p.ROUND_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.job = job
        self.rank = rank
        self._timeout_s = float(timeout_s)
        self._clock = clock
        self.ledger = Ledger()
        #: The step this rank holds at until the open round is decided.
        self.gate = NEVER
        self.open: p.Propose | None = None
        #: Times the training thread waited for a decision, and for how long.
        self.stalls = 0
        self.stall_s = 0.0

    # ------------------------------------------------------------------ messages

    def on_propose(self, msg: p.Propose, step: int) -> p.Ack:
        """Answer a proposal at ``step`` (this rank's newest completed step); hold at
        its step if the answer is yes. A proposal while another round is open means
        the daemon gave that round up (it restarted): that round counts as aborted."""
        if self.open is not None and self.open.round != msg.round:
            self._close(rules.abort(self.open, "superseded by a new proposal from the daemon"))
        ack = rules.acknowledge(msg, self.rank, step)
        self.open = msg
        self.gate = msg.at_step if ack.ok else NEVER
        return ack

    def on_decide(self, msg: p.Decide) -> None:
        """The daemon's decision of the open round (others are ignored)."""
        if self.open is not None and msg.round == self.open.round and msg.job == self.job:
            self._close(msg)

    # ------------------------------------------------------------------ steps

    def bound(self, due: int) -> int:
        """``due`` lowered to the held step and to the next committed change."""
        return min(due, self.gate, self.ledger.next_step())

    def settle(self, step: int, wait: Callable[[float], None]) -> None:
        """At a step at or past the held one: call ``wait(seconds)`` (which receives and
        hands over messages, so :meth:`on_decide` may run) until the round is decided
        or the timeout passes; then the round counts as aborted here."""
        if step < self.gate:
            return
        t0 = self._clock()
        deadline = t0 + self._timeout_s
        while step >= self.gate:
            left = deadline - self._clock()
            if left <= 0:
                break
            wait(min(left, 0.05))
        self.stalls += 1
        self.stall_s += self._clock() - t0
        if step >= self.gate and self.open is not None:
            why = f"no decision from the daemon within {self._timeout_s:g}s"
            self._close(rules.abort(self.open, why))

    def apply(self, step: int, schedule: SaveSchedule) -> bool:
        """Apply the committed changes due by ``step``; True for a stop."""
        return self.ledger.apply_due(step, schedule)

    def _close(self, decision: p.Decide) -> None:
        assert self.open is not None
        self.ledger.record(self.open.round, self.open, decision)
        self.open = None
        self.gate = NEVER


__all__ = ["DaemonRounds"]
