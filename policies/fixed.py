"""``fixed``: save every N steps, or every T seconds of training."""

from __future__ import annotations

from dataclasses import dataclass, replace

from adaptd.core.policy import PolicyError, next_multiple
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.interval import due_step, steps_ceil

__all__ = [
    "Fixed",
]


@dataclass(frozen=True)
class Fixed:
    """Save every ``steps`` steps, or every ``seconds`` seconds (converted to steps
    with the job's measured step time). Exactly one of the two must be set.

    ``steps``: saves fall on the multiples of ``steps``, so every rank of a job, and a
    resumed run, agree on them. ``seconds``: the whole number of steps covering
    ``seconds`` at the measured step time changes with it, so a grid of its multiples
    would move under the job at every plan (from 97 steps to 100, the next multiple of
    100 can be 3 steps after the last save); the grid counts instead from the job's
    newest save (or the step it resumed from), which every rank reads the same, as the
    interval policies' does (:mod:`adaptd.policies.interval`). Saves stay ``seconds``
    apart at the step time measured when each is planned, however it varies.
    """

    steps: int | None = None
    seconds: float | None = None
    #: Two tiers fixed by hand (as Orbax's and DLRover's are): with a local tier, every
    #: ``durable_every``-th save is made durable, the others stay local (None: every
    #: save durable). A job without a local tier saves every one durably.
    durable_every: int | None = None

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
        if self.durable_every is not None and self.durable_every < 1:
            raise PolicyError(f"fixed: durable_every must be >= 1, got {self.durable_every}")

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        d = self._decide(job)
        if self.durable_every is None or not job.local_tier or d.next_step is None:
            return d
        reason = f"{d.reason}, every {self.durable_every}th durable"
        return replace(d, durable_every=self.durable_every, reason=reason)

    def _decide(self, job: JobState) -> Decision:
        if self.steps is not None:
            every = self.steps
            return Decision(
                next_step=next_multiple(job.step, every),
                every_steps=every,
                reason=f"every {every} steps",
                policy="fixed",
                interval_s=every * job.step_time_s if job.step_time_s else None,
            )
        every = steps_ceil(self.seconds, job.step_time_s)  # type: ignore[arg-type]
        if every is None:
            return Decision(
                next_step=None,
                reason=f"every {self.seconds:g}s: waiting for a step-time measurement",
                policy="fixed",
            )
        return Decision(
            next_step=due_step(job, every),
            every_steps=every,
            reason=f"every {self.seconds:g}s ≈ {every} steps at {job.step_time_s:.3g}s/step",
            policy="fixed",
            interval_s=every * job.step_time_s,  # type: ignore[operator]
        )
