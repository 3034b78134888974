"""``young``: Young's first-order optimum, τ = √(2δM), fitted online."""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.core import model
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.daly import check_settings, cost_figures, probe
from adaptd.policies.interval import plan

__all__ = [
    "Young",
]


@dataclass(frozen=True)
class Young:
    """Save every √(2δM) with the job's measured δ and its M (see :class:`~adaptd.policies.Daly`
    for the settings)."""

    probe_s: float = 300.0
    save_cost_s: float | None = None
    mtbf_s: float | None = None

    def __post_init__(self) -> None:
        check_settings("young", self.probe_s, self.save_cost_s, self.mtbf_s)

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        figures = cost_figures(job, self.save_cost_s, self.mtbf_s)
        if figures is None:
            return probe(job, self.probe_s, "young")
        delta, mtbf = figures
        tau = model.young_interval(delta, mtbf)
        return plan(
            job,
            tau,
            policy="young",
            reason=f"Young: √(2·{delta:.3g}s·{mtbf:.3g}s) = {tau:.4g}s",
            waste=model.waste_approx(
                tau, delta, mtbf, job.save_latency_s or 0.0, job.restore_s or 0.0
            ),
        )
