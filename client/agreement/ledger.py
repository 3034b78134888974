"""What a rank's agreement decided: every round, and the committed changes waiting for
their step.

Shared by the two ways a job's ranks agree: among themselves on TensorFlow's
coordination service (:mod:`adaptd.client.agreement.rounds`) and through their daemon
(:mod:`adaptd.client.agreement.daemon_rounds`). Not thread-safe by itself: the owner guards it.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from adaptd.client.save.schedule import NEVER, SaveSchedule
from adaptd.core import agreement as rules
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as p

_NO_LOCK = contextlib.nullcontext()


@dataclass(frozen=True)
class Round:
    """A decided round, as every rank records it."""

    round: int
    action: str
    at_step: int
    proposer: int
    commit: bool
    reason: str


@dataclass(frozen=True)
class Applied:
    """A committed change as this rank applied it: at ``step``, its first boundary at
    or after ``at_step``."""

    round: int
    action: str
    at_step: int
    step: int
    reason: str


class Ledger:
    """Decided rounds and the committed changes not yet applied."""

    def __init__(self) -> None:
        self.pending: list[p.Propose] = []  # committed, not yet applied
        #: The job's plan once every committed plan round took effect.
        self.agreed_plan: Decision | None = None
        #: Every decided round, and every change as applied here.
        self.rounds: list[Round] = []
        self.applied: list[Applied] = []

    def record(self, k: int, proposal: p.Propose, decision: p.Decide | None) -> bool:
        """Record round ``k``'s outcome; True when it committed."""
        commit = decision is not None and decision.commit
        reason = decision.reason if decision is not None else ""
        self.rounds.append(
            Round(k, proposal.action, proposal.at_step, proposal.proposer, commit, reason)
        )
        if commit:
            self.pending.append(proposal)
            if proposal.action == "plan":
                self.agreed_plan = rules.decision_of(proposal)
        return commit

    def next_step(self) -> int:
        """The step of the next committed change (NEVER when none waits)."""
        return min((c.at_step for c in self.pending), default=NEVER)

    def stop_pending(self) -> bool:
        """A committed stop waits for its step (every rank acknowledged it: each stops
        there, whatever happens to the store afterwards)."""
        return any(c.action == "stop" for c in self.pending)

    def plan_floor(self) -> int:
        """The step a new plan may take effect at the earliest: not before a committed
        plan still waiting (plans apply in round order, so the newer one wins)."""
        return max((c.at_step for c in self.pending if c.action == "plan"), default=0)

    def take(self, step: int) -> list[p.Propose]:
        """Remove and return the committed changes due by ``step``, in round order."""
        ready = [c for c in self.pending if c.at_step <= step]
        if ready:
            self.pending = [c for c in self.pending if c.at_step > step]
        return ready

    def apply_due(
        self, step: int, schedule: SaveSchedule, lock: AbstractContextManager[Any] = _NO_LOCK
    ) -> bool:
        """Take the committed changes due by ``step`` (holding ``lock``, when another
        thread records rounds) and apply them to ``schedule`` (not holding it: the
        schedule is the training thread's); True when one of them is a stop."""
        with lock:
            ready = self.take(step)
        return self.apply(ready, step, schedule)

    def apply(self, ready: list[p.Propose], step: int, schedule: SaveSchedule) -> bool:
        """Apply ``ready`` (from :meth:`take`) to ``schedule`` at ``step``; True when one
        of them is a stop (save at this step, then stop)."""
        stop = False
        for c in ready:
            if c.action == "plan":
                schedule.adopt(rules.decision_of(c), step, c.source or "daemon")
            else:
                schedule.request(step, c.reason or c.action, step)
                stop = stop or c.action == "stop"
            self.applied.append(Applied(c.round, c.action, c.at_step, step, c.reason))
        return stop


class Recorded:
    """What an agreement decided, as both kinds show it (the owner sets ``ledger``)."""

    ledger: Ledger

    @property
    def rounds(self) -> list[Round]:
        """Every decided round."""
        return self.ledger.rounds

    @property
    def applied(self) -> list[Applied]:
        """Every committed change as applied here."""
        return self.ledger.applied


__all__ = ["Applied", "Ledger", "Recorded", "Round"]
