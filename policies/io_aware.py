"""``io_aware``: defer a due save while its storage target is saturated or busy with
another job's save, or while no fleet write slot is free on it, by a bounded amount,
so jobs sharing a target stagger."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from adaptd.core.policy import Policy, PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.interval import anchor, inner_policy, steps_ceil

__all__ = [
    "IoAware",
]


@dataclass(frozen=True)
class IoAware:
    """Wraps ``inner`` (a spec or a policy, default ``daly``).

    While the job's storage target is saturated (``busy_fraction`` ≥ ``busy``) or
    at least ``max_writers`` other jobs on it have a save in flight (the target's own
    limit, ``[storage."NAME"] max_concurrent_saves`` in the daemon's config, wins over
    ``max_writers`` where it is set), a planned save
    is pushed back, but never beyond ``max_defer`` × the inner interval past when it
    was due. Once the target clears, an overdue save happens at the next step.
    Urgent decisions pass through untouched.

    On a target the fleet coordinates (``fleet_slots`` set: several hosts share it and
    etcd answers) the fleet's slots replace the local figures: a job saves when it
    holds a slot and is deferred otherwise, within the same bound. A save due within
    ``slot_lead_s`` (or overdue) whose job holds no slot is tagged ``fleet-wait``: the
    daemon then asks the fleet for one, early enough that an uncontended grant is there
    when the save is due.

    With two tiers, a save that stays in the local tier (``Decision.durable_at``) does
    not touch the storage target and is never deferred; the durable ones are.
    """

    inner: str | Policy = "daly"
    busy: float = 0.8
    max_writers: int = 1
    max_defer: float = 1.0
    slot_lead_s: float = 3.0
    policy: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.busy <= 1:
            raise PolicyError(f"io_aware: busy must be a fraction in (0, 1], got {self.busy}")
        if self.max_writers < 1:
            raise PolicyError(f"io_aware: max_writers must be >= 1, got {self.max_writers}")
        if not 0 <= self.max_defer <= 10:
            raise PolicyError(
                f"io_aware: max_defer must be in [0, 10] intervals, got {self.max_defer}"
            )
        if not 0 <= self.slot_lead_s <= 600:
            raise PolicyError(
                f"io_aware: slot_lead_s must be in [0, 600] seconds, got {self.slot_lead_s}"
            )
        object.__setattr__(self, "policy", inner_policy("io_aware", self.inner))

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        d = self.policy.decide(snapshot, job)
        if d.urgent or d.next_step is None or not d.every_steps:
            return d
        if not d.durable_at(d.next_step, job.durable_anchor):
            return d  # a local save: the storage target is not involved
        due = anchor(job) + d.every_steps
        deadline = due + round(self.max_defer * d.every_steps)
        target = snapshot.storage_for(job.storage_target)
        fleet = target is not None and target.fleet_slots is not None
        if target is not None and target.fleet_slots is not None:
            # a slot holder writes whatever else writes there: the fleet counts the writers
            why = (
                None
                if job.job in target.fleet_holding
                else f"waiting for one of {target.fleet_slots} fleet write slot(s) "
                f"on {target.target}"
            )
        else:
            why = self.congestion(snapshot, job)
        if why is not None and job.step < deadline:
            lead = steps_ceil(self.slot_lead_s, job.step_time_s) or 0
            asks = fleet and job.step + lead >= due
            tags = (*d.tags, "deferred", *(("fleet-wait",) if asks else ()))
            return dataclasses.replace(
                d,
                next_step=max(deadline, job.step + 1),
                reason=f"{d.reason}; deferred: {why} (at most until step {deadline})",
                tags=tags,
            )
        if why is None and due <= job.step and d.next_step > job.step + 1:
            # a deferred save the inner policy's grid would skip: take it now
            return dataclasses.replace(
                d, next_step=job.step + 1, reason=f"{d.reason}; storage clear, saving the overdue"
            )
        return d

    def congestion(self, snapshot: Snapshot, job: JobState) -> str | None:
        """Why the job's storage target should not take a save now, or ``None``."""
        target = snapshot.storage_for(job.storage_target)
        if target is None:
            return None
        if target.busy_fraction is not None and target.busy_fraction >= self.busy:
            return f"{target.target} is {target.busy_fraction:.0%} busy"
        others = [j for j in target.writing_jobs if j != job.job]
        limit = target.max_writers if target.max_writers is not None else self.max_writers
        if len(others) >= limit:
            return f"{len(others)} other job(s) writing to {target.target} (at most {limit})"
        return None
