"""The closed form and the control-variate estimator pinned exactly, fast.

test_theory.py holds them to simulation within standard errors (the slow checks run
hundreds of seeds); these pin what needs no statistics: with failures that never
come, the expected wall time is the failure-free run's, start and end included,
which the engine computes deterministically; and the estimator is a least-squares
fit that numpy.polyfit computes independently. (Found missing by ``make mutants``.)
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from adaptd import sim
from adaptd.policies import Fixed
from adaptd.sim import theory
from adaptd.sim.engine import RunResult
from tests.sim.test_theory import case

NEVER = 3.6e12  # an MTBF of a billion hours: no failure in any of these runs


@pytest.mark.parametrize(
    ("s", "every"),
    [
        # the run ends long after the last save is durable: its tail is rest + δ
        (case(10_000, 1.0, 5.0, 20.0, 0.1, 60.0, NEVER), 3000),
        # the last save's write outlasts the run: the tail is b + rest / (1 − slowdown)
        (case(10_000, 1.0, 5.0, 900.0, 0.1, 60.0, NEVER), 3_300),
        # a compile on the first step, a synchronous save, steps of half a second
        (case(10_000, 0.5, 30.0, 30.0, 0.0, 60.0, NEVER, first_step_s=90.0), 1_000),
        # one interval longer than the run: no save at all
        (case(10_000, 1.0, 5.0, 20.0, 0.1, 60.0, NEVER, first_step_s=10.0), 20_000),
        # the run a whole number of intervals long: no save at the end
        (case(9_000, 1.0, 5.0, 20.0, 0.1, 60.0, NEVER), 3_000),
    ],
)
def test_without_failures_the_closed_form_is_the_failure_free_run(s, every) -> None:
    r = sim.run(s, Fixed(steps=every), 0)
    assert r.failures == 0
    assert theory.expected_wall_s(s, every) == pytest.approx(r.wall_s, rel=1e-6)
    assert theory.expected_wall_s(s, every, durable_after_s=0.0) == pytest.approx(
        r.wall_s, rel=1e-6
    )


def test_with_failures_the_expectation_grows_and_the_latency_costs() -> None:
    s = case(10_000, 1.0, 5.0, 150.0, 0.1, 60.0, 2000.0)
    free = case(10_000, 1.0, 5.0, 150.0, 0.1, 60.0, NEVER)
    k = 500
    assert theory.expected_wall_s(s, k) > theory.expected_wall_s(free, k) * 1.1
    # a save durable at its call rolls back less than one durable 150 s later
    at_call = theory.expected_wall_s(s, k, durable_after_s=0.0)
    assert at_call < theory.expected_wall_s(s, k) < theory.expected_wall_s(s, k, 300.0)
    assert theory.cycle_s(s, k, 0.0) < theory.cycle_s(s, k) < theory.cycle_s(s, k, 300.0)


def test_the_closed_form_refuses_intervals_under_a_step() -> None:
    s = case(10_000, 1.0, 5.0, 20.0, 0.1, 60.0, 2000.0)
    with pytest.raises(ValueError, match=r"^every_steps must be >= 1, got 0$"):
        theory.expected_wall_s(s, 0)
    with pytest.raises(ValueError, match=r"^every_steps must be >= 1, got 0$"):
        theory.cycle_s(s, 0)
    sync = case(10_000, 1.0, 5.0, 5.0, 0.0, 60.0, 2000.0)
    assert theory.expected_wall_s(sync, 1) > 0  # one step is an interval
    # a write exactly an interval plus δ long still fits (δ = 5 s, a synchronous save)
    assert theory.expected_wall_s(case(10_000, 1.0, 5.0, 105.0, 0.0, 60.0, 2000.0), 100) > 0
    # an interval is steps x step time: 100 half-second steps and δ = 5 s take 55 s
    with pytest.raises(
        ValueError,
        match=r"^scenario 'scenario': the write \(60s\) outlasts an interval of 100 steps, so "
        r"saves would wait for it; the closed form needs latency_s <= interval \+ δ$",
    ):
        theory.expected_wall_s(case(10_000, 0.5, 5.0, 60.0, 0.0, 60.0, 2000.0), 100)
    with pytest.raises(
        ValueError,
        match=r"^scenario 'nfs-storm': the closed form needs exponential failures without "
        r"storage phases or a failure trace$",
    ):
        theory.cycle_s(sim.load("nfs-storm"), 500)


def runs(walls, failures) -> list[RunResult]:
    return [
        RunResult(w, 0.5 * w, 0.0, 0.0, 0.0, 0.0, saves=1, failures=f)
        for w, f in zip(walls, failures, strict=True)
    ]


def test_the_control_variate_estimate_is_the_least_squares_one() -> None:
    walls = [1000.0, 1300.0, 900.0, 1600.0, 1150.0]
    failures = [1, 2, 0, 4, 2]
    m = 500.0
    control = [f - w / m for w, f in zip(walls, failures, strict=True)]
    beta = np.polyfit(control, walls, 1)[0]
    adjusted = [w - beta * c for w, c in zip(walls, control, strict=True)]
    est = theory.mean_wall(runs(walls, failures), m)
    assert est.mean_s == pytest.approx(statistics.fmean(adjusted), rel=1e-12)
    assert est.stderr_s == pytest.approx(statistics.stdev(adjusted) / math.sqrt(5), rel=1e-9)
    assert est.plain_stderr_s == pytest.approx(statistics.stdev(walls) / math.sqrt(5), rel=1e-12)
    assert est.seeds == 5
    assert est.stderr_s < est.plain_stderr_s


def test_without_spread_in_the_control_the_estimate_is_the_plain_mean() -> None:
    # failures − W/M the same (1) in every run: nothing to regress on
    walls = [1000.0, 1500.0, 2000.0]
    est = theory.mean_wall(runs(walls, [3, 4, 5]), 500.0)
    assert (est.mean_s, est.stderr_s) == (1500.0, est.plain_stderr_s)
    with pytest.raises(ValueError, match=r"^need at least 3 runs for a standard error, got 2$"):
        theory.mean_wall(runs(walls[:2], [1, 1]), 500.0)
