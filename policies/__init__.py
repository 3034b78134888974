"""Policies: the interface a plugin implements, the facts it decides on, and the built-ins
(import name ``adaptd.policies``).

A plugin author needs nothing else::

    from dataclasses import dataclass

    from adaptd.policies import Decision, JobState, Snapshot, PolicyError

    @dataclass(frozen=True)
    class EveryN:
        n: int = 7

        def __post_init__(self) -> None:
            if self.n < 1:
                raise PolicyError(f"every_n: n must be >= 1, got {self.n}")

        def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
            nxt = (job.step // self.n + 1) * self.n
            return Decision(next_step=nxt, every_steps=self.n, reason=f"every {self.n}")

and registers it under the ``adaptd.policies`` entry-point group of its own
distribution. :class:`Policy` is the Protocol it satisfies; :func:`parse` turns a spec
such as ``"fixed:steps=100"`` into a policy; :class:`AnyPolicy` composes several.
Each built-in lives in its own module here, one small frozen dataclass each, and is
registered in ``pyproject.toml``. (The same names stay importable from
:mod:`adaptd.core.policy` and :mod:`adaptd.core.snapshot`, where they are defined.)
"""

from adaptd.core.policy import (
    DEFAULT_SPEC,
    AnyPolicy,
    Policy,
    PolicyError,
    available,
    earliest,
    next_multiple,
    parse,
    steps_for_seconds,
)
from adaptd.core.snapshot import (
    Decision,
    Figure,
    GpuSample,
    HostSample,
    JobState,
    Reading,
    Snapshot,
    StorageSample,
    same_saves,
)
from adaptd.policies.budget import Budget
from adaptd.policies.daly import Daly
from adaptd.policies.default import Default
from adaptd.policies.fixed import Fixed
from adaptd.policies.guards import Guards
from adaptd.policies.io_aware import IoAware
from adaptd.policies.opportunistic import Opportunistic
from adaptd.policies.phased import Phased
from adaptd.policies.risk import Risk
from adaptd.policies.tiers import Tiers
from adaptd.policies.weibull import Weibull
from adaptd.policies.young import Young

__all__ = [
    "DEFAULT_SPEC",
    "AnyPolicy",
    "Budget",
    "Daly",
    "Decision",
    "Default",
    "Figure",
    "Fixed",
    "GpuSample",
    "Guards",
    "HostSample",
    "IoAware",
    "JobState",
    "Opportunistic",
    "Phased",
    "Policy",
    "PolicyError",
    "Reading",
    "Risk",
    "Snapshot",
    "StorageSample",
    "Tiers",
    "Weibull",
    "Young",
    "available",
    "earliest",
    "next_multiple",
    "parse",
    "same_saves",
    "steps_for_seconds",
]
