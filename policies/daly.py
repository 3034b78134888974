"""``daly``: Daly's higher-order optimum interval, fitted online (the core of the default)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adaptd.core import model
from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.interval import plan

__all__ = [
    "PROBE_MTBF_FRACTION",
    "Daly",
    "check_settings",
    "cost_figures",
    "fitted",
    "probe",
]


def cost_figures(
    job: JobState, save_cost_s: float | None, mtbf_s: float | None
) -> tuple[float, float] | None:
    """(δ, M) from the settings when given, else from the job; ``None`` until δ is known."""
    delta = save_cost_s if save_cost_s is not None else job.save_cost_s
    mtbf = mtbf_s if mtbf_s is not None else job.mtbf_s
    if delta is None or mtbf is None or mtbf <= 0:
        return None
    return max(delta, 1e-6), mtbf


#: Before δ is known, never put more than this fraction of an MTBF of work at risk.
PROBE_MTBF_FRACTION = 0.1


def probe(job: JobState, probe_s: float, policy: str) -> Decision:
    """Before the first measured save: save after ``probe_s`` to learn what a save costs.

    On a failure-prone job (M small) the probe comes sooner: at most a tenth of the
    MTBF, so the first save is not itself a gamble on surviving that long.
    """
    wait_s = probe_s
    if job.mtbf_s is not None and job.mtbf_s > 0:
        wait_s = min(probe_s, PROBE_MTBF_FRACTION * job.mtbf_s)
    return plan(
        job,
        wait_s,
        policy=policy,
        reason=f"no save measured yet: probing after {wait_s:.3g}s",
    )


def fitted(
    job: JobState,
    *,
    policy: str,
    probe_s: float,
    save_cost_s: float | None,
    mtbf_s: float | None,
    interval: Callable[[float, float], float],
    reason: Callable[[float, float, float], str],
) -> Decision:
    """The plan of an interval fitted to the job's δ and M (``daly``, ``young``,
    ``weibull``): :func:`probe` until δ is measured, then every ``interval(δ, M)``
    seconds, with ``reason(δ, M, τ)`` and the expected waste of that interval."""
    figures = cost_figures(job, save_cost_s, mtbf_s)
    if figures is None:
        return probe(job, probe_s, policy)
    delta, mtbf = figures
    tau = interval(delta, mtbf)
    return plan(
        job,
        tau,
        policy=policy,
        reason=reason(delta, mtbf, tau),
        waste=model.waste_approx(
            tau,
            model.Terms(
                delta, mtbf, latency_s=job.save_latency_s or 0.0, restart_s=job.restore_s or 0.0
            ),
        ),
    )


def check_settings(name: str, probe_s: float, save_cost_s: float | None, mtbf_s: float | None):
    if not probe_s > 0:
        raise PolicyError(f"{name}: probe_s must be > 0 seconds, got {probe_s}")
    if save_cost_s is not None and save_cost_s < 0:
        raise PolicyError(f"{name}: save_cost_s must be >= 0 seconds, got {save_cost_s}")
    if mtbf_s is not None and not mtbf_s > 0:
        raise PolicyError(f"{name}: mtbf_s must be > 0 seconds, got {mtbf_s}")


@dataclass(frozen=True)
class Daly:
    """Save every Daly-optimal interval for the job's measured save cost δ and MTBF M.

    ``probe_s``: before any save was measured, save once after this much training to
    learn δ. ``save_cost_s`` / ``mtbf_s`` pin δ or M instead of reading them from the
    job (the simulator's ``oracle`` pins both to the scenario's true values).
    """

    probe_s: float = 300.0
    save_cost_s: float | None = None
    mtbf_s: float | None = None

    def __post_init__(self) -> None:
        check_settings("daly", self.probe_s, self.save_cost_s, self.mtbf_s)

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        return fitted(
            job,
            policy="daly",
            probe_s=self.probe_s,
            save_cost_s=self.save_cost_s,
            mtbf_s=self.mtbf_s,
            interval=model.daly_interval,
            reason=lambda d, m, tau: (
                f"Daly: δ={model.duration_text(d)}, M={model.duration_text(m)} "
                f"→ every {model.duration_text(tau)}"
            ),
        )
