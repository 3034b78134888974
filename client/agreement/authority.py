"""Whose plan a rank follows: the single-rank case.

The daemon session (:mod:`adaptd.client.daemon.session`) hands every plan it hears of (the
daemon's :class:`~adaptd.protocol.job.Plan`, the embedded policy's decision, a save-now)
to an *authority*, and the hook asks it at each slow-path boundary what applies. A
job of one rank (:class:`Solo`) follows its own daemon, or its embedded policy while
the daemon is away, at once. A job of several ranks must agree first
(:mod:`adaptd.client.agreement.agreed`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Protocol

from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as protocol

log = logging.getLogger("adaptd.client")


class Authority(Protocol):
    """What the hook needs of whoever decides the rank's schedule."""

    #: The Hello's ``agreement`` field ("none", "daemon", "coordination").
    kind: str
    #: Held while the hook computes and stores its next due step (see :meth:`bound`).
    lock: Any

    def start(self) -> None: ...

    def daemon_plan(self, plan: protocol.Plan, step: int) -> None: ...

    def embedded_plan(self, decision: Decision, step: int, *, new_policy: bool = False) -> None:
        """The embedded policy's decision at ``step``; ``new_policy``: the first since
        the embedded policy took over or was replaced (its plan is news even where its
        saves are within the re-plan tolerance of the plan in force)."""

    def save_now(self, reason: str, at_step: int | None, step: int) -> None: ...

    def preempt(self, step: int) -> bool: ...

    def message(self, msg: protocol.DaemonMessage, step: int, now: float) -> None: ...

    def save_cost(self, cost: protocol.SaveCost) -> None: ...

    def outbox(self) -> list[protocol.ClientMessage]: ...

    def bound(self, due: int) -> int: ...

    def boundary(self, step: int, step_time_s: float | None, now: float) -> bool: ...

    def ending(self) -> None:
        """The training loop is over (the hook's close began): no round is started or
        answered from here on, and the other ranks ending theirs (the coordination
        service going with the chief's process) is not a failure of the agreement."""

    def close(self) -> None: ...


class Solo:
    """A job of one rank: every plan is applied at once."""

    kind = "none"
    lock = contextlib.nullcontext()

    def __init__(self, schedule: SaveSchedule) -> None:
        self.schedule = schedule

    def start(self) -> None:
        pass

    def daemon_plan(self, plan: protocol.Plan, step: int) -> None:
        if self.schedule.apply_plan(plan, step):
            log.info("plan from the daemon: %s", describe(self.schedule))

    def embedded_plan(self, decision: Decision, step: int, *, new_policy: bool = False) -> None:
        if self.schedule.set_embedded(decision, step):
            log.info("embedded plan: %s", describe(self.schedule))

    def save_now(self, reason: str, at_step: int | None, step: int) -> None:
        self.schedule.request(step if at_step is None or at_step <= step else at_step, reason, step)

    def preempt(self, step: int) -> bool:
        """SIGTERM: False, this rank saves and stops on its own at once."""
        return False

    def message(self, msg: protocol.DaemonMessage, step: int, now: float) -> None:
        """A daemon message of the agreement (none reach a job of one rank)."""

    def save_cost(self, cost: protocol.SaveCost) -> None:
        """What a save cost this rank (its report goes to the daemon as it is)."""

    def outbox(self) -> list[protocol.ClientMessage]:
        """Messages for the daemon on the job's behalf: none for one rank."""
        return []

    def bound(self, due: int) -> int:
        return due

    def boundary(self, step: int, step_time_s: float | None, now: float) -> bool:
        """Nothing to agree on: never a stop."""
        return False

    def ending(self) -> None:
        pass

    def close(self) -> None:
        pass


def describe(schedule: SaveSchedule) -> str:
    """The plan in force, for the log."""
    d = schedule.decision
    due = schedule.next_due()
    if d is None:
        return "no save planned"
    where = f"next save at step {due.step}" if due else "no save planned"
    every = f", then every {d.every_steps}" if d.every_steps else ""
    return f"{where}{every} ({d.policy or '?'}: {d.reason})"


__all__ = ["Authority", "Solo", "describe"]
