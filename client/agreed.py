"""Whose plan a rank of a multi-worker job follows: the job's, agreed by its ranks.

Under ``tf.distribute.MultiWorkerMirroredStrategy`` (:class:`Coordinated`) the ranks
agree among themselves on TensorFlow's coordination service
(:class:`~adaptd.client.agreement.Agreement`): rank 0 proposes its daemon's plan (or
its embedded policy's while its daemon is away), any rank proposes an urgent save (its
daemon's save-now, a health event), a rank that got SIGTERM proposes a save followed
by a stop, and every change takes effect at the agreed step on every rank. Other
ranks' own plans do not count: one authority per job.

Ranks without such a runtime (:class:`ViaDaemon`) agree through their daemon
(:class:`~adaptd.client.daemon_rounds.DaemonRounds`): the daemon proposes, each rank
acknowledges and holds at the step until the daemon decides.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from adaptd import protocol
from adaptd.client.agreement import Agreement
from adaptd.client.authority import Solo
from adaptd.client.daemon_rounds import DaemonRounds
from adaptd.client.link import DaemonLink
from adaptd.client.schedule import SaveSchedule
from adaptd.snapshot import Decision

log = logging.getLogger("adaptd.client")


def decision_of(plan: protocol.Plan) -> Decision:
    """The daemon's plan as a policy decision (to propose it to the job)."""
    return Decision(
        next_step=plan.next_step,
        every_steps=plan.every_steps,
        reason=plan.reason,
        policy=plan.policy,
        interval_s=plan.interval_s,
        waste=plan.waste,
    )


class Coordinated:
    """A rank of a ``tf.distribute`` job: every change goes through ``agreement``.

    Args:
        schedule: the rank's save schedule (changed only by committed rounds).
        agreement: this rank's side of the job's agreement (started by :meth:`start`).
        host: this host's name (who decided a plan, for every host's status).
    """

    kind = "coordination"

    def __init__(self, schedule: SaveSchedule, agreement: Agreement, *, host: str) -> None:
        self.schedule = schedule
        self.agreement = agreement
        self.lock = agreement.lock
        self.host = host
        self.deciding = agreement.rank == 0
        self._plan_seq: int | None = None
        self._preempting = False

    def start(self) -> None:
        self.agreement.start()

    def daemon_plan(self, plan: protocol.Plan, step: int) -> None:
        if not self.deciding:
            return  # one authority per job: the chief's daemon
        if self._plan_seq is not None and plan.seq < self._plan_seq:
            return  # stale (reordered)
        self._plan_seq = plan.seq
        self.agreement.want_plan(decision_of(plan), source="daemon", decided_by=self.host)

    def embedded_plan(self, decision: Decision, step: int) -> None:
        if self.deciding:
            self.agreement.want_plan(decision, source="embedded", decided_by=self.host)

    def save_now(self, reason: str, at_step: int | None, step: int) -> None:
        self.agreement.want_save(reason, step)

    def preempt(self, step: int) -> bool:
        """SIGTERM: propose a save at an agreed step followed by a stop; False (save and
        stop alone, at once) when the agreement no longer works."""
        if self.agreement.broken:
            return False
        if not self._preempting:  # the wish stays until a committed stop satisfies it
            self._preempting = True
            self.agreement.want_save("SIGTERM", step, stop=True)
        return True

    def message(self, msg: protocol.DaemonMessage, step: int, now: float) -> None:
        """Daemon rounds (Propose/Decide) are not for a rank that agrees in-band."""

    def bound(self, due: int) -> int:
        return self.agreement.bound(due)

    def boundary(self, step: int, step_time_s: float | None, now: float) -> bool:
        return self.agreement.boundary(step, self.schedule, step_time_s)

    def close(self) -> None:
        self.agreement.close()


class ViaDaemon:
    """A rank of a job without a runtime of its own: the daemon runs the rounds.

    Args:
        schedule: the rank's save schedule.
        rounds: this rank's side of the daemon's rounds.
        link: the socket to the daemon (the answers go back on it).
        position: this rank's newest completed step.
        pump: receives and hands over the daemon's messages for up to the given
            seconds (while the rank holds at a step waiting for a decision).
    """

    kind = "daemon"
    lock = threading.Lock()  # nothing runs off the training thread: uncontended

    def __init__(
        self,
        schedule: SaveSchedule,
        rounds: DaemonRounds,
        link: DaemonLink,
        *,
        position: Callable[[], int],
        pump: Callable[[float], None],
    ) -> None:
        self.schedule = schedule
        self.rounds = rounds
        self.link = link
        self._position = position
        self._pump = pump
        self._solo = Solo(schedule)
        #: The daemon ran a round for this job (from then on only rounds change plans).
        self.rounds_seen = False

    def start(self) -> None:
        pass

    def daemon_plan(self, plan: protocol.Plan, step: int) -> None:
        """A Plan outside a round: applied at once only from a daemon that has not run
        a round for this job yet (one that does not run rounds); once it has, plans
        change only through committed rounds."""
        if not self.rounds_seen:
            self._solo.daemon_plan(plan, step)

    def embedded_plan(self, decision: Decision, step: int) -> None:
        """While the daemon is away the ranks keep the plan they agreed on; before any
        round, the embedded plan as for one rank."""
        if not self.rounds_seen:
            self._solo.embedded_plan(decision, step)

    def save_now(self, reason: str, at_step: int | None, step: int) -> None:
        """A save-now outside a round (request_save(), or a daemon without rounds):
        this rank's alone."""
        self._solo.save_now(reason, at_step, step)

    def preempt(self, step: int) -> bool:
        return False

    def message(self, msg: protocol.DaemonMessage, step: int, now: float) -> None:
        if isinstance(msg, protocol.Propose):
            if msg.job == self.rounds.job:
                self.rounds_seen = True
                self.link.send(self.rounds.on_propose(msg, self._position()), now)
        elif isinstance(msg, protocol.Decide):
            self.rounds.on_decide(msg)

    def bound(self, due: int) -> int:
        return self.rounds.bound(due)

    def boundary(self, step: int, step_time_s: float | None, now: float) -> bool:
        self.rounds.settle(step, self._pump)
        return self.rounds.apply(step, self.schedule)

    def close(self) -> None:
        pass


__all__ = ["Coordinated", "ViaDaemon", "decision_of"]
