"""Which step the next save falls on: the daemon's plan, the embedded plan, urgent saves.

Pure bookkeeping, no clock and no I/O, so it is unit-tested without TensorFlow.
The hook keeps one integer, :attr:`SaveSchedule.due`, and compares the step
counter against it on every step; everything here runs only when that compare
fires or when a message arrives.

Steps count *completed* steps (as in :class:`~adaptd.core.snapshot.JobState`): a save
"at step 100" captures the state after 100 steps.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from adaptd.core.snapshot import Decision, same_saves
from adaptd.protocol.job import Plan, SaveNow

__all__ = [
    "NEVER",
    "Due",
    "SaveSchedule",
    "carried",
    "decision_of",
]

T = TypeVar("T")

#: "No save planned": larger than any step count, so ``step >= NEVER`` is never true.
NEVER = 1 << 62


@dataclass(frozen=True, slots=True)
class Due:
    """The next save: at ``step``, because of ``reason``; ``policy`` names who planned
    it and ``source`` whose plan is in force (``"daemon"``/``"embedded"``)."""

    step: int
    reason: str
    policy: str = ""
    source: str = ""


def carried(record: Any, kind: Callable[..., T], **given: Any) -> T:
    """A ``kind`` (a dataclass or a msgspec struct) holding every field of ``record``
    that ``kind`` has too, and ``given``: a plan passed from one record to another (the
    daemon's :class:`~adaptd.protocol.job.Plan` to a decision, a committed round to the
    record a daemon shows), so a field the records gain (a tier's cadence) is carried
    without a change here."""
    names = _fields(kind)
    values = {n: getattr(record, n) for n in names if n not in given and hasattr(record, n)}
    return kind(**values, **given)


@functools.cache
def _fields(kind: Any) -> tuple[str, ...]:
    if dataclasses.is_dataclass(kind):
        return tuple(f.name for f in dataclasses.fields(kind) if f.init)
    return tuple(kind.__struct_fields__)


def decision_of(plan: Plan) -> Decision:
    """The daemon's plan as a policy decision (to install it, or propose it to the job)."""
    return carried(plan, Decision)


class SaveSchedule:
    """Combines the current plan (from the daemon or the embedded policy) and urgent saves.

    ``source`` says whose plan is in force: ``"daemon"`` or ``"embedded"``.
    The daemon's plans carry a sequence number; a plan with a lower ``seq`` than the
    newest one seen is stale (reordered or from before a daemon restart's reset is
    noticed) and is ignored, an equal one is the daemon repeating itself.
    """

    def __init__(self) -> None:
        self.decision: Decision | None = None
        self.source = "embedded"
        self.plan_seq: int | None = None
        self.urgent_step: int | None = None
        self.urgent_reason = ""
        self.last_saved_step: int | None = None
        self.due = NEVER
        self.due_reason = ""
        self.due_urgent = False

    # ------------------------------------------------------------------ inputs

    def set_embedded(self, decision: Decision, step: int) -> bool:
        """Install the embedded policy's decision (only while the daemon's is not in force).

        Returns True when the save steps changed.
        """
        if self.source == "daemon":
            return False
        return self._install(decision, step, "embedded")

    def apply_plan(self, plan: Plan, step: int) -> bool:
        """Install a daemon :class:`~adaptd.protocol.job.Plan`; returns True when it changed
        the save steps. A plan older than the newest seen is ignored."""
        if self.plan_seq is not None and plan.seq < self.plan_seq:
            return False
        self.plan_seq = plan.seq
        return self._install(decision_of(plan), step, "daemon")

    def adopt(self, decision: Decision, step: int, source: str) -> bool:
        """Install a plan the job's ranks agreed on (:mod:`adaptd.client.agreement.rounds`), in
        force from ``step``; ``source`` says who decided it (``"daemon"`` or
        ``"embedded"``, on the deciding rank's host). Returns True when the save steps
        changed."""
        return self._install(decision, step, source)

    def daemon_lost(self) -> None:
        """The daemon stopped answering: the embedded plan takes over on the next decision.

        The daemon's plan stays in force until then (it is still the best plan known).
        ``plan_seq`` is forgotten, since a restarted daemon numbers its plans afresh.
        """
        self.source = "embedded"
        self.plan_seq = None

    def save_now(self, msg: SaveNow, step: int) -> None:
        """An urgent save: at ``msg.at_step`` if still ahead, else at this step boundary."""
        self.request(
            step if msg.at_step is None or msg.at_step <= step else msg.at_step,
            msg.reason or "save-now",
            step,
        )

    def request(self, at_step: int, reason: str, step: int) -> None:
        """Save at ``at_step`` (``<= step``: at this boundary) whatever the plan says."""
        at_step = max(at_step, step)
        if self.urgent_step is None or at_step < self.urgent_step:
            self.urgent_step = at_step
            self.urgent_reason = reason
        self._recompute(step)

    def saved(self, step: int) -> None:
        """A save at ``step`` was started; plan the next one after it."""
        self.last_saved_step = step
        if self.urgent_step is not None and self.urgent_step <= step:
            self.urgent_step = None
            self.urgent_reason = ""
        self._recompute(step)

    # ------------------------------------------------------------------ internals

    def _install(self, decision: Decision, step: int, source: str) -> bool:
        # "Changed" means the job would save at other steps (the daemon's test,
        # adaptd.core.snapshot.same_saves): a policy that restates the same grid after each
        # save (next_step moves on) is no change; another source or due step is.
        before, old_source, old_due = self.decision, self.source, self.due
        self.decision = decision
        self.source = source
        if decision.urgent:
            self.request(step, decision.reason or "urgent", step)
        self._recompute(step)
        floor = step - 1 if self.last_saved_step is None else max(step - 1, self.last_saved_step)
        return (
            source != old_source or self.due != old_due or not same_saves(before, decision, floor)
        )

    def _recompute(self, step: int) -> None:
        # A plan that names the current step saves at this boundary, unless that
        # step is already saved: look for the first grid step after ``floor``.
        floor = step - 1
        if self.last_saved_step is not None:
            floor = max(floor, self.last_saved_step)
        due, reason, urgent = NEVER, "", False
        if self.decision is not None:
            nxt = self.decision.due_after(floor)
            if nxt is not None:
                due, reason = nxt, self.decision.reason
        if self.urgent_step is not None and self.urgent_step <= due:
            due, reason, urgent = max(self.urgent_step, floor + 1), self.urgent_reason, True
        self.due = due
        self.due_reason = reason
        self.due_urgent = urgent

    def interval_s(self, step_time_s: float | None) -> float | None:
        """Seconds between saves in the plan in force (None: no plan, or no pace yet)."""
        d = self.decision
        if d is None:
            return None
        if d.interval_s is not None:
            return d.interval_s
        return d.every_steps * step_time_s if d.every_steps and step_time_s else None

    def next_due(self) -> Due | None:
        """The planned save, or None when none is planned."""
        if self.due >= NEVER:
            return None
        policy = "urgent" if self.due_urgent or self.decision is None else self.decision.policy
        return Due(self.due, self.due_reason, policy, self.source)
