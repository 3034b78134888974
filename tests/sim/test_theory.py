"""The simulator and its oracle held to the closed form (docs/simulator.md, "The
closed form"; adaptd/sim/theory.py).

The oracle runs 100 seeds of each case; the mean wall time, estimated with the
failure count as control variate (:func:`adaptd.sim.theory.mean_wall`), must lie
within 4 standard errors of the exact expectation. Each case also asserts that the
test can tell the model from its likely mistakes: the write latency's whole effect
and a save made durable at its call must each sit at least twice the tolerance
away, a 25x wrong MTBF many times further.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from adaptd import sim
from adaptd.core import model
from adaptd.core.policy import steps_for_seconds
from adaptd.policies import Fixed
from adaptd.sim import theory

SEEDS = 100
#: Standard errors of tolerance: a right simulator misses it about once in 10,000 seed sets.
Z = 4.0


def case(steps, step_time_s, blocking_s, latency_s, slowdown, restore_s, mtbf_s, first_step_s=None):
    job = {"steps": steps, "step_time_s": step_time_s, "gpus": 1}
    if first_step_s is not None:
        job["first_step_s"] = first_step_s
    return sim.from_dict(
        {
            "job": job,
            "checkpoint": {
                "blocking_s": blocking_s,
                "latency_s": latency_s,
                "slowdown": slowdown,
                "restore_s": restore_s,
            },
            "failures": {"distribution": "exponential", "mtbf_gpu_hours": mtbf_s / 3600},
        }
    )


CASES = {
    # the example of issue 16: write latency worth 0.3% of waste
    "issue-16": case(200_000, 1.0, 5.0, 20.0, 0.1, 60.0, 5000.0),
    # a synchronous save: Daly's own model (L = δ)
    "daly-sync": case(100_000, 1.0, 30.0, 30.0, 0.0, 120.0, 3600.0),
    # a slow write: durable 150 s after a 2 s blocking
    "long-write": case(100_000, 1.0, 2.0, 150.0, 0.1, 60.0, 5000.0),
    # every incarnation's first step compiles for 90 s, with a slow write
    "compile": case(100_000, 0.5, 5.0, 100.0, 0.1, 30.0, 2000.0, first_step_s=90.0),
}


def oracle_steps(s: sim.Scenario, mtbf_s: float | None = None) -> int:
    """The plan Daly makes from the true figures, worked out here, not by the oracle."""
    tau = model.daly_interval(s.save_cost_s, s.job_mtbf_s if mtbf_s is None else mtbf_s)
    return steps_for_seconds(tau, s.step_time_s)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_oracles_goodput_is_the_closed_forms(name: str) -> None:
    s = CASES[name]
    k = oracle_steps(s)
    runs = [sim.run(s, sim.resolve("oracle", s), seed) for seed in range(SEEDS)]
    est = theory.mean_wall(runs, s.job_mtbf_s)
    expected = theory.expected_wall_s(s, k)
    tol = Z * est.stderr_s
    useful = s.steps * s.step_time_s
    err = useful * est.stderr_s / est.mean_s**2
    assert abs(est.mean_s - expected) <= tol, (
        f"{name}: oracle goodput {useful / est.mean_s:.5f} ± {err:.5f}, "
        f"closed form {useful / expected:.5f} (every {k} steps)"
    )
    # the tolerance is narrow enough to see what a broken model or oracle would change
    if s.latency_s > s.blocking_s:
        latency = expected - theory.expected_wall_s(s, k, durable_after_s=s.blocking_s)
        assert latency > 2 * tol, (name, latency, tol)
    at_call = expected - theory.expected_wall_s(s, k, durable_after_s=0.0)
    assert at_call > 2 * tol, (name, at_call, tol)
    wrong_mtbf = theory.expected_wall_s(s, oracle_steps(s, 25 * s.job_mtbf_s)) - expected
    assert wrong_mtbf > 20 * tol, (name, wrong_mtbf, tol)
    # and the control variate earns its keep (at least 2x fewer seeds for this precision)
    assert est.stderr_s < est.plain_stderr_s / math.sqrt(2)


def test_the_closed_form_is_dalys_for_a_synchronous_save() -> None:
    """With L = δ and no warm-up the cycle is Daly's M·e^(R/M)·(e^((τ+δ)/M) − 1), and
    in steady state the waste is :func:`adaptd.core.model.waste_fraction`'s."""
    s = CASES["daly-sync"]
    m, r, d = s.job_mtbf_s, s.restore_s, s.save_cost_s
    for k in (50, 250, 1000):
        tau = k * s.step_time_s
        daly = m * math.exp(r / m) * math.expm1((tau + d) / m)
        assert theory.cycle_s(s, k) == pytest.approx(daly, rel=1e-12)
    for s in CASES.values():
        k = oracle_steps(s)
        tau = k * s.step_time_s
        terms = model.Terms(
            s.save_cost_s,
            s.job_mtbf_s,
            latency_s=s.latency_s,
            restart_s=s.restore_s + s.warmup_s,
            blocking_s=s.blocking_s,
        )
        waste = model.waste_fraction(tau, terms)
        assert 1 - tau / theory.cycle_s(s, k) == pytest.approx(waste, rel=1e-9)
        # a run is many cycles: its whole expectation is close to the steady state
        cycles = s.steps / k
        assert theory.expected_wall_s(s, k) == pytest.approx(
            cycles * theory.cycle_s(s, k), rel=5 / cycles
        )


def test_fixed_intervals_far_from_the_optimum_also_match() -> None:
    """Not only the oracle's interval: short and long fixed intervals too (the formula
    has no optimum built in)."""
    s = replace(CASES["long-write"], steps=50_000)
    for k in (160, 2000):
        runs = [sim.run(s, Fixed(steps=k), seed) for seed in range(40)]
        est = theory.mean_wall(runs, s.job_mtbf_s)
        assert abs(est.mean_s - theory.expected_wall_s(s, k)) <= Z * est.stderr_s, k


def test_the_closed_form_refuses_what_it_does_not_model() -> None:
    s = CASES["long-write"]
    with pytest.raises(ValueError, match="outlasts"):
        theory.expected_wall_s(s, 100)  # a 150 s write, saves every 100 s
    with pytest.raises(ValueError, match="exponential"):
        theory.expected_wall_s(sim.load("nfs-storm"), 500)
    with pytest.raises(ValueError, match="at least 3 runs"):
        theory.mean_wall([sim.run(s, Fixed(steps=500), 0)], s.job_mtbf_s)
