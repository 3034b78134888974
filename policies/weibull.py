"""``weibull``: the numeric optimum for Weibull failures, which depends on the job's age.

Fleet studies (Schroeder & Gibson, DSN 2006) find a system's inter-failure times
Weibull with shape 0.7-0.8: failures come in bursts, so the hazard is high right
after a restart and falls as the job survives. The best interval is then short
after a restart and grows later; there is no closed form, so it is minimised
numerically (:func:`adaptd.core.model.weibull_interval`, scipy, imported lazily).
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.core import model
from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.daly import check_settings, fitted

__all__ = [
    "Weibull",
    "interval_start_age",
]


@dataclass(frozen=True)
class Weibull:
    """Minimise the expected waste of the next interval given the age since the last failure.

    ``shape``: the Weibull shape k (< 1: bursty failures); the scale follows from the
    job's MTBF. The age is taken at the start of the current interval (the last save),
    so the plan does not drift while the interval runs. Other settings as for ``daly``.
    """

    shape: float = 0.7
    probe_s: float = 300.0
    save_cost_s: float | None = None
    mtbf_s: float | None = None

    def __post_init__(self) -> None:
        if not 0.05 <= self.shape <= 20:
            raise PolicyError(f"weibull: shape must be in [0.05, 20], got {self.shape}")
        check_settings("weibull", self.probe_s, self.save_cost_s, self.mtbf_s)

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        age, k = interval_start_age(job), self.shape
        return fitted(
            job,
            policy="weibull",
            probe_s=self.probe_s,
            save_cost_s=self.save_cost_s,
            mtbf_s=self.mtbf_s,
            interval=lambda d, m: model.weibull_interval(
                age, model.Terms(d, m, restart_s=job.restore_s or 0.0), k
            ),
            reason=lambda d, m, tau: (
                f"Weibull k={k:g}: age {model.duration_text(age)}, δ={model.duration_text(d)}, "
                f"M={model.duration_text(m)} → every {model.duration_text(tau)}"
            ),
        )


def interval_start_age(job: JobState) -> float:
    """The job's age (time since its last failure) when the current interval began."""
    age = job.time_since_failure_s or 0.0
    if job.last_save_time is not None and job.last_save_step is not None:
        age -= max(0.0, job.time - job.last_save_time)
    return max(0.0, age)
