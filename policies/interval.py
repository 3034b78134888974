"""Shared arithmetic for policies that choose an interval in seconds.

Interval policies anchor on the newest save (or the step the job resumed from),
not on a global grid: when the interval changes, the next save is one new
interval after the last one, and a save that is already overdue happens at the
next step. Every rank reads the same ``last_save_step``, so ranks still agree.

An interval in seconds becomes the whole number of steps that covers it (rounded
up), so a plan never asks for saves closer together than the interval it states.
"""

from __future__ import annotations

import math

from adaptd.core.policy import Policy, PolicyError, parse
from adaptd.core.snapshot import Decision, JobState

__all__ = [
    "anchor",
    "due_step",
    "inner_policy",
    "plan",
    "steps_ceil",
]


def anchor(job: JobState) -> int:
    """The step the current interval counts from."""
    if job.last_save_step is not None and job.last_save_step >= job.start_step:
        return job.last_save_step
    return job.start_step


def due_step(job: JobState, every: int) -> int:
    """One interval of ``every`` steps after :func:`anchor`, but never in the past."""
    return max(anchor(job) + every, job.step + 1)


def plan(
    job: JobState,
    interval_s: float,
    *,
    policy: str,
    reason: str,
    waste: float | None = None,
) -> Decision:
    """A decision saving ``interval_s`` of compute after the anchor (``None`` plan
    while the step time is unknown)."""
    every = steps_ceil(interval_s, job.step_time_s)
    if every is None:
        return Decision(next_step=None, reason=f"{reason}: waiting for a step time", policy=policy)
    return Decision(
        next_step=due_step(job, every),
        every_steps=every,
        reason=reason,
        policy=policy,
        interval_s=interval_s,
        waste=waste,
    )


def steps_ceil(seconds: float, step_time_s: float | None) -> int | None:
    """Whole steps covering at least ``seconds``."""
    if step_time_s is None or step_time_s <= 0:
        return None
    return max(1, math.ceil(seconds / step_time_s - 1e-9))


def inner_policy(owner: str, inner: object) -> Policy:
    """Resolve a wrapper's ``inner`` setting: a policy object or a spec string.

    In a spec, the inner policy's own settings are separated by ``;`` because
    ``,`` already separates the wrapper's: ``io_aware:inner=fixed:steps=50;seconds=``.
    """
    if isinstance(inner, str):
        try:
            return parse(inner.replace(";", ","))
        except PolicyError as exc:
            raise PolicyError(f"{owner}: inner={inner!r}: {exc}") from exc
    return parse(inner)  # type: ignore[arg-type]
