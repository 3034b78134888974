"""``default``: the stack a job gets unless it asks for another.

Daly's interval fitted online, deferred around storage congestion (``io_aware``),
overridden by health and operator events (``risk``), inside the hard limits
(``guards``): ``guards(io_aware(daly) + risk)``.

Where the daemon belongs to a fleet that has seen its failures come in bursts (the
Weibull shape fitted to the fleet's failure times credibly below 1, see
:class:`adaptd.core.snapshot.FleetSample`), the interval is the age-aware Weibull optimum
with that shape instead of Daly's: ``guards(io_aware(weibull:shape=k) + risk)``.

Where the job has a local tier or some of its failures are covered by just-in-time saves
(``JobState.local_tier``, ``jit_coverage``), the local interval and the durable cadence
are chosen together for the uncovered failures (``tiers``, issues 23 and 24):
``guards(io_aware(tiers) + risk)``. That takes precedence over the fleet's shape (there
is no two-tier Weibull optimum); every other job gets exactly what it got before.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from adaptd.core.policy import AnyPolicy, Policy
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.daly import Daly
from adaptd.policies.guards import Guards
from adaptd.policies.io_aware import IoAware
from adaptd.policies.risk import Risk
from adaptd.policies.tiers import Tiers
from adaptd.policies.weibull import Weibull

__all__ = [
    "Default",
]


@dataclass(frozen=True)
class Default:
    """The default stack; its settings are those of the policies it is made of."""

    probe_s: float = 300.0
    busy: float = 0.8
    max_writers: int = 1
    max_defer: float = 1.0
    max_lost_s: float | None = None
    degraded_every_s: float = 300.0
    stack: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        stack = Guards(
            inner=AnyPolicy(
                (
                    IoAware(
                        inner=FleetInterval(probe_s=self.probe_s),
                        busy=self.busy,
                        max_writers=self.max_writers,
                        max_defer=self.max_defer,
                    ),
                    Risk(degraded_every_s=self.degraded_every_s),
                )
            ),
            max_lost_s=self.max_lost_s,
        )
        object.__setattr__(self, "stack", stack)

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        return self.stack.decide(snapshot, job)


@dataclass(frozen=True)
class FleetInterval:
    """Daly's interval, or the Weibull optimum with the fleet's shape while the fleet's
    failures are credibly bursty (``snapshot.fleet.bursty``); Daly alone without a fleet;
    ``tiers`` for a job with a local tier or with failures covered just in time."""

    probe_s: float = 300.0
    daly: Daly = field(init=False, repr=False, compare=False)
    tiers: Tiers = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "daly", Daly(probe_s=self.probe_s))
        object.__setattr__(self, "tiers", Tiers(probe_s=self.probe_s))

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        if job.local_tier or job.jit_coverage > 0:
            return self.tiers.decide(snapshot, job)
        fleet = snapshot.fleet
        if fleet is not None and fleet.bursty and fleet.failure_shape is not None:
            shape = min(max(fleet.failure_shape, 0.05), 20.0)
            return _weibull(round(shape, 3), self.probe_s).decide(snapshot, job)
        return self.daly.decide(snapshot, job)


@functools.lru_cache(maxsize=64)
def _weibull(shape: float, probe_s: float) -> Weibull:
    return Weibull(shape=shape, probe_s=probe_s)
