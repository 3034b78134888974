"""``opportunistic``: take a save that is due soon now, while the job's GPUs are idle.

An input-bound stretch or an evaluation pass leaves the GPUs under-utilised; a
save then disturbs compute least, so one due within a fraction of the interval
is brought forward to the next step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from adaptd.core.policy import Policy, PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.gpus import job_gpus
from adaptd.policies.interval import anchor, inner_policy

__all__ = [
    "Opportunistic",
    "idle_util",
]


@dataclass(frozen=True)
class Opportunistic:
    """Wraps ``inner`` (default ``daly``).

    When the inner plan's save is at most ``window`` × its interval away and every
    GPU of the job reports SM utilisation ≤ ``idle`` (per NVML), save at the next
    step. A save already taken early in that window stands in for the due one.
    """

    inner: str | Policy = "daly"
    window: float = 0.25
    idle: float = 0.3
    policy: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.window < 1:
            raise PolicyError(
                f"opportunistic: window must be a fraction in (0, 1), got {self.window}"
            )
        if not 0 <= self.idle < 1:
            raise PolicyError(f"opportunistic: idle must be in [0, 1), got {self.idle}")
        object.__setattr__(self, "policy", inner_policy("opportunistic", self.inner))

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        d = self.policy.decide(snapshot, job)
        if d.urgent or d.next_step is None or not d.every_steps:
            return d
        window = max(1, round(self.window * d.every_steps))
        last = anchor(job)
        if d.next_step - window <= last < d.next_step and last > job.start_step:
            # the due save was taken early while the GPUs idled: skip to the next one
            return dataclasses.replace(
                d, next_step=d.next_step + d.every_steps, reason=f"{d.reason}; taken early"
            )
        if job.save_in_flight or d.next_step - job.step > window:
            return d
        util = idle_util(snapshot, job)
        if util is not None and util <= self.idle:
            return dataclasses.replace(
                d,
                next_step=job.step + 1,
                reason=f"GPUs {util:.0%} busy and a save is due in {d.next_step - job.step} "
                f"steps: saving now ({d.reason})",
                tags=(*d.tags, "opportunistic"),
            )
        return d


def idle_util(snapshot: Snapshot, job: JobState) -> float | None:
    """The highest SM utilisation among the job's GPUs, ``None`` if any is unknown."""
    gpus = job_gpus(snapshot, job)
    if not gpus or any(g.util_sm is None for g in gpus):
        return None
    return max(g.util_sm for g in gpus)  # type: ignore[type-var]
