"""``young``: Young's first-order optimum, τ = √(2δM), fitted online."""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.core import model
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.daly import check_settings, fitted

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
        return fitted(
            job,
            policy="young",
            probe_s=self.probe_s,
            save_cost_s=self.save_cost_s,
            mtbf_s=self.mtbf_s,
            interval=model.young_interval,
            reason=lambda d, m, tau: f"Young: √(2·{d:.3g}s·{m:.3g}s) = {tau:.4g}s",
        )
