"""Whose plan a rank of a multi-worker job follows: the job's, agreed by its ranks.

Under ``tf.distribute.MultiWorkerMirroredStrategy`` (:class:`Coordinated`) the ranks
agree among themselves on TensorFlow's coordination service
(:class:`~adaptd.client.agreement.rounds.Agreement`): rank 0 proposes its daemon's plan (or
its embedded policy's while its daemon is away), any rank proposes an urgent save (its
daemon's save-now, a health event), a rank that got SIGTERM proposes a save followed
by a stop, and every change takes effect at the agreed step on every rank. Other
ranks' own plans do not count: one authority per job. What the job's other hosts'
daemons need goes through the ranks: a rank other than the chief tells its daemon
each plan the ranks committed (:class:`~adaptd.protocol.job.JobPlan`), and sends the
chief in-band (:mod:`adaptd.client.agreement.mailbox`) the operator requests its daemon relays
(:class:`~adaptd.protocol.job.Relay`) and what each of its saves cost; the chief hands
them to its daemon (:class:`~adaptd.protocol.job.Request`,
:class:`~adaptd.protocol.job.SaveCost`).

Ranks without such a runtime (:class:`ViaDaemon`) agree through their daemon
(:class:`~adaptd.client.agreement.daemon_rounds.DaemonRounds`): the daemon proposes, each rank
acknowledges and holds at the step until the daemon decides.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import msgspec

from adaptd.client.agreement.authority import Solo
from adaptd.client.agreement.daemon_rounds import DaemonRounds
from adaptd.client.agreement.rounds import Agreement
from adaptd.client.daemon.link import DaemonLink
from adaptd.client.save.schedule import SaveSchedule, carried, decision_of
from adaptd.client.save.sigterm import SIGTERM_REASON
from adaptd.core.snapshot import REPLAN_TOLERANCE, Decision
from adaptd.protocol import job as protocol

log = logging.getLogger("adaptd.client")


def job_plan(committed: protocol.Propose, rank: int) -> protocol.JobPlan:
    """A committed plan round as the record a rank's daemon shows."""
    return carried(committed, protocol.JobPlan, v=protocol.VERSION, rank=rank)


class Coordinated:
    """A rank of a ``tf.distribute`` job: every change goes through ``agreement``.

    Args:
        schedule: the rank's save schedule (changed only by committed rounds).
        agreement: this rank's side of the job's agreement (started by :meth:`start`);
            its host is who decided a plan, in every host's status.
    """

    kind = "coordination"

    def __init__(self, schedule: SaveSchedule, agreement: Agreement) -> None:
        self.schedule = schedule
        self.agreement = agreement
        self.lock = agreement.lock
        self.host = agreement.who.host
        self.deciding = agreement.who.chief
        self._plan_seq: int | None = None
        self._preempting = False
        self._requests: list[protocol.Request] = []  # the chief's own daemon's Relays
        self._exact = False  # the embedded policy's plans go out exactly (new_policy)

    def start(self) -> None:
        self.agreement.start()

    def daemon_plan(self, plan: protocol.Plan, step: int) -> None:
        if not self.deciding:
            return  # one authority per job: the chief's daemon
        if self._plan_seq is not None and plan.seq < self._plan_seq:
            return  # stale (reordered)
        self._plan_seq = plan.seq
        self.agreement.want_plan(decision_of(plan), source="daemon", decided_by=self.host)

    def embedded_plan(self, decision: Decision, step: int, *, new_policy: bool = False) -> None:
        """(The chief.) Propose the embedded policy's decision unless its saves are
        within :data:`~adaptd.core.snapshot.REPLAN_TOLERANCE` of the agreed plan's, as
        the daemon's planner does: an optimal-interval policy re-fits its interval to
        every step report, and each small change was a plan round every second or two,
        every rank held at its step for it (81 rounds in 120 s of a two-host test). The
        plan of a policy that just took over (``new_policy``: an operator's set-policy,
        the daemon lost) goes out exactly, until it is settled."""
        if not self.deciding:
            return
        if new_policy:
            self._exact = True
        elif self._exact and not self.agreement.plan_wanted:
            self._exact = False  # the new policy's plan is the job's: re-fits from here
        tolerance = 0.0 if self._exact else REPLAN_TOLERANCE
        self.agreement.want_plan(
            decision, source="embedded", decided_by=self.host, tolerance=tolerance
        )

    def save_now(self, reason: str, at_step: int | None, step: int) -> None:
        self.agreement.want_save(reason, step)

    def preempt(self, step: int) -> bool:
        """SIGTERM: propose a save at an agreed step followed by a stop; False (save and
        stop alone, at once) when the agreement no longer works, unless the ranks
        already committed to a stop: then every other rank saves and stops at its
        step, so this one goes on to it too. (The store goes away, for instance,
        when the chief's process ends at that step while this rank is a step or
        more behind.)"""
        if self.agreement.broken:
            return self.agreement.stop_committed()
        if not self._preempting:  # the wish stays until a committed stop satisfies it
            self._preempting = True
            self.agreement.want_save(SIGTERM_REASON, step, stop=True)
        return True

    def message(self, msg: protocol.DaemonMessage, step: int, now: float) -> None:
        """A :class:`~adaptd.protocol.job.Relay` (an operator's request typed on this host,
        whose daemon does not decide the job) goes to the chief, as a
        :class:`~adaptd.protocol.job.Request`. Daemon rounds (Propose/Decide) are not for
        a rank that agrees in-band."""
        if not isinstance(msg, protocol.Relay) or msg.job != self.agreement.job:
            return
        request = protocol.Request(
            v=protocol.VERSION,
            job=msg.job,
            rank=self.agreement.rank,
            op=msg.op,
            spec=msg.spec,
            reason=msg.reason,
            origin=msg.origin,
            auth=msg.auth,
        )
        log.info("operator request %s from host %s: to the job's chief", msg.op, msg.origin)
        if self.deciding:
            self._requests.append(request)
        else:
            self.agreement.mailbox.post(request)

    def save_cost(self, cost: protocol.SaveCost) -> None:
        """What a save cost this rank (see :meth:`DaemonSession.save_started
        <adaptd.client.daemon.session.DaemonSession.save_started>`): to the chief, whose
        daemon counts it (:meth:`outbox`), so δ is the slowest rank's."""
        if not self.deciding:
            self.agreement.mailbox.post(cost)

    def outbox(self) -> list[protocol.ClientMessage]:
        """What this rank's daemon should hear: the chief's daemon the other ranks'
        requests (as the chief's own, ``origin`` saying where they were typed) and
        save costs; another rank's daemon the newest plan the ranks committed."""
        agreement = self.agreement
        plans = agreement.take_plans()
        if not self.deciding:
            return [job_plan(plans[-1], agreement.rank)] if plans else []
        out: list[protocol.ClientMessage] = []
        for msg in agreement.mailbox.take():
            if isinstance(msg, protocol.Request):
                log.info("operator request %s from host %s (via rank %d): to this daemon",
                         msg.op, msg.origin, msg.rank)  # fmt: skip
                out.append(msgspec.structs.replace(msg, rank=agreement.rank))
            else:
                out.append(msg)  # type: ignore[arg-type]  # a SaveCost: it names its rank
        out.extend(self._requests)
        self._requests.clear()
        return out

    def bound(self, due: int) -> int:
        return self.agreement.bound(due)

    def boundary(self, step: int, step_time_s: float | None, now: float) -> bool:
        return self.agreement.boundary(step, self.schedule, step_time_s)

    def ending(self) -> None:
        self.agreement.ending()

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

    def embedded_plan(self, decision: Decision, step: int, *, new_policy: bool = False) -> None:
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

    def save_cost(self, cost: protocol.SaveCost) -> None:
        """The daemon hears every rank's report itself."""

    def outbox(self) -> list[protocol.ClientMessage]:
        return []

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

    def ending(self) -> None:
        pass

    def close(self) -> None:
        pass


__all__ = ["Coordinated", "ViaDaemon", "job_plan"]
