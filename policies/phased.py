"""``phased``: the warm-up schedule practitioners use.

Early training changes fast and early crashes (bad config, OOM, a flaky node) are
common, so save often at first and rarely later: by default every 50 steps until
step 1000, then every 300.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.core.policy import PolicyError, next_multiple
from adaptd.core.snapshot import Decision, JobState, Snapshot

__all__ = [
    "Phased",
]


@dataclass(frozen=True)
class Phased:
    """Every ``early_every`` steps below ``warmup_steps``, then every ``late_every``."""

    warmup_steps: int = 1000
    early_every: int = 50
    late_every: int = 300

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "early_every", "late_every"):
            value = getattr(self, name)
            if value < 1:
                raise PolicyError(f"phased: {name} must be >= 1, got {value}")

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        if job.step < self.warmup_steps:
            nxt = next_multiple(job.step, self.early_every)
            if nxt < self.warmup_steps:
                why = f"warm-up: every {self.early_every} steps until {self.warmup_steps}"
                return _grid(job, nxt, self.early_every, why)
            # the warm-up grid would overshoot the boundary: the late grid starts there
        nxt = next_multiple(job.step, self.late_every, origin=self.warmup_steps)
        return _grid(job, nxt, self.late_every, f"after warm-up: every {self.late_every} steps")


def _grid(job: JobState, next_step: int, every: int, reason: str) -> Decision:
    """Save at ``next_step``, then every ``every`` steps (that many steps' time, known)."""
    seconds = every * job.step_time_s if job.step_time_s else None
    return Decision(
        next_step=next_step, every_steps=every, reason=reason, policy="phased", interval_s=seconds
    )
