"""Which upload to a destination goes next, and when a failed one is tried again: pure.

Each job has at most one pending upload per destination (:class:`Pending`): a newer
checkpoint replaces an older pending one and keeps its place in line (:func:`merge`).
A worker that is free takes the job waiting longest, ties round-robin
(:func:`next_upload`); a failed upload waits :func:`retry_delay` before it is tried
again. :class:`~adaptd.tiers.destination.DestinationQueue` keeps the state and the
threads; nothing here has a clock or a lock.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

__all__ = ["RETRY_FIRST_S", "RETRY_MAX_S", "Pending", "merge", "next_upload", "retry_delay"]

#: First retry after a failed upload waits this long; each further failure doubles it ...
RETRY_FIRST_S = 2.0
#: ... up to this.
RETRY_MAX_S = 300.0


@dataclass(frozen=True)
class Pending:
    """One job's next upload to one destination.

    ``waiting_since`` is the wall time of the oldest save of the job still waiting for
    this destination (kept when a newer step replaces an older pending one), the key
    that orders jobs. ``not_before`` (monotonic) delays a retry; ``attempts`` counts
    failures of this step.
    """

    job: str
    step: int
    saved: float  # wall time the local checkpoint was saved
    waiting_since: float
    nbytes: int = 0
    not_before: float = 0.0
    attempts: int = 0


def next_upload(
    pending: Mapping[str, Pending],
    uploading: Collection[str],
    last_started: Mapping[str, float],
    now: float,
) -> Pending | None:
    """The upload to start now, or ``None``: among jobs not uploading to this destination
    already and not waiting out a retry delay, the one waiting longest; ties go to the job
    whose last upload started longest ago (round-robin), then by id."""
    ready = [p for p in pending.values() if p.job not in uploading and p.not_before <= now]
    if not ready:
        return None
    return min(ready, key=lambda p: (p.waiting_since, last_started.get(p.job, -math.inf), p.job))


def merge(old: Pending | None, new: Pending) -> Pending:
    """A newly saved checkpoint ``new`` joining the job's pending ``old``: the newer
    step wins (a retry delay and failures belong to the old step and are dropped), and
    the job keeps its place in line."""
    if old is None:
        return new
    if new.step <= old.step:
        return old
    return replace(new, waiting_since=min(old.waiting_since, new.waiting_since))


def retry_delay(attempts: int) -> float:
    """Seconds before retry number ``attempts`` (1, 2, ...): 2 s doubling up to 5 min."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, attempts - 1))
