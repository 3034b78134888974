"""``fixed``: save every N steps, or every T seconds of training."""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.policy import PolicyError, next_multiple, steps_for_seconds
from adaptd.snapshot import Decision, JobState, Snapshot

__all__ = [
    "Fixed",
]


@dataclass(frozen=True)
class Fixed:
    """Save every ``steps`` steps, or every ``seconds`` seconds (converted to steps
    with the job's measured step time). Exactly one of the two must be set.

    Saves fall on the grid of multiples of the interval, so every rank of a job,
    and a resumed run, agree on the steps.
    """

    steps: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.seconds is None):
            raise PolicyError(
                f"fixed: set exactly one of steps= or seconds= "
                f"(got steps={self.steps}, seconds={self.seconds})"
            )
        if self.steps is not None and self.steps < 1:
            raise PolicyError(f"fixed: steps must be >= 1, got {self.steps}")
        if self.seconds is not None and not self.seconds > 0:
            raise PolicyError(f"fixed: seconds must be > 0, got {self.seconds}")

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        if self.steps is not None:
            every = self.steps
            reason = f"every {every} steps"
        else:
            every = steps_for_seconds(self.seconds, job.step_time_s)  # type: ignore[arg-type]
            if every is None:
                return Decision(
                    next_step=None,
                    reason=f"every {self.seconds:g}s: waiting for a step-time measurement",
                    policy="fixed",
                )
            reason = f"every {self.seconds:g}s ≈ {every} steps at {job.step_time_s:.3g}s/step"
        interval_s = every * job.step_time_s if job.step_time_s else None
        return Decision(
            next_step=next_multiple(job.step, every),
            every_steps=every,
            reason=reason,
            policy="fixed",
            interval_s=interval_s,
        )
