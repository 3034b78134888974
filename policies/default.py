"""``default``: the stack a job gets unless it asks for another.

Daly's interval fitted online, deferred around storage congestion (``io_aware``),
overridden by health and operator events (``risk``), inside the hard limits
(``guards``): ``guards(io_aware(daly) + risk)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from adaptd.policies.daly import Daly
from adaptd.policies.guards import Guards
from adaptd.policies.io_aware import IoAware
from adaptd.policies.risk import Risk
from adaptd.policy import AnyPolicy, Policy
from adaptd.snapshot import Decision, JobState, Snapshot

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
                        inner=Daly(probe_s=self.probe_s),
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
