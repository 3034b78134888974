"""``guards``: hard limits around any policy.

Never lose more than ``max_lost_s`` of work (the plan is pulled in so that the
gap between saves is at most that), and never save more often than the durable
latency allows: at most one save is in flight, so saves come at least ``L``
apart and none is planned before the one in flight is durable. Urgent saves pass.
With two tiers (a plan with ``durable_every``) the floor is the local tier's latency:
the next save goes there; the durable cadence's own floor is the inner policy's
(:func:`adaptd.core.multilevel.interval_for`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from adaptd.core.policy import Policy, PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.interval import anchor, inner_policy, steps_ceil

__all__ = [
    "Guards",
]


@dataclass(frozen=True)
class Guards:
    """Wraps ``inner`` (default ``daly``) with ``max_lost_s`` (seconds; ``None``: no
    cap) and ``latency_floor`` (respect the durable latency; default on)."""

    inner: str | Policy = "daly"
    max_lost_s: float | None = None
    latency_floor: bool = True
    policy: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_lost_s is not None and not self.max_lost_s > 0:
            raise PolicyError(f"guards: max_lost_s must be > 0 seconds, got {self.max_lost_s}")
        object.__setattr__(self, "policy", inner_policy("guards", self.inner))

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        d = self.policy.decide(snapshot, job)
        if d.urgent:
            return d
        base = anchor(job)
        nxt, every, notes = d.next_step, d.every_steps, []
        if self.max_lost_s is not None:
            cap = steps_ceil(self.max_lost_s, job.step_time_s)
            if cap is not None and (nxt is None or nxt > base + cap):
                nxt = max(base + cap, job.step + 1)
                every = min(every or cap, cap)
                notes.append(f"capped: at most {self.max_lost_s:g}s of work at risk")
        latency = job.save_latency_s if d.durable_every is None else job.local_latency_s
        if self.latency_floor and nxt is not None and latency:
            floor = steps_ceil(latency, job.step_time_s)
            if floor is not None:
                earliest = base + floor
                if job.save_in_flight and job.last_save_time is not None:
                    left = latency - (job.time - job.last_save_time)
                    earliest = max(earliest, job.step + (steps_ceil(left, job.step_time_s) or 1))
                if nxt < earliest:
                    nxt = earliest
                    every = max(every or floor, floor)
                    notes.append(f"floored: a save takes {latency:.3g}s to be durable")
        if not notes:
            return d
        # the interval stated is the one asked for now: a cap shortens it
        interval_s = d.interval_s
        if every is not None and job.step_time_s:
            interval_s = every * job.step_time_s
        return dataclasses.replace(
            d,
            next_step=nxt,
            every_steps=every,
            interval_s=interval_s,
            reason=f"{d.reason}; {'; '.join(notes)}",
        )
