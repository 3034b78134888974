"""``budget``: keep save overhead under a fixed fraction of training time (CheckFreq-style).

CheckFreq (Mohan et al., FAST 2021) picks the checkpoint frequency so that the
overhead stays below a user-set fraction of step time, with no failure model:
the interval is δ / overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.daly import probe
from adaptd.policies.interval import plan

__all__ = [
    "Budget",
]


@dataclass(frozen=True)
class Budget:
    """Save as often as an overhead of ``overhead`` (fraction, default 3.5%) allows."""

    overhead: float = 0.035
    probe_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.overhead < 1:
            raise PolicyError(
                f"budget: overhead must be a fraction in (0, 1), e.g. 0.035, got {self.overhead}"
            )
        if not self.probe_s > 0:
            raise PolicyError(f"budget: probe_s must be > 0 seconds, got {self.probe_s}")

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        if job.save_cost_s is None:
            return probe(job, self.probe_s, "budget")
        tau = max(job.save_cost_s, 1e-6) / self.overhead
        return plan(
            job,
            tau,
            policy="budget",
            reason=f"budget {self.overhead:.2%}: δ={job.save_cost_s:.3g}s → every {tau:.4g}s",
            waste=self.overhead,
        )
