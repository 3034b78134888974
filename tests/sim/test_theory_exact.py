"""The closed form and the control-variate estimator pinned exactly, fast.

test_theory.py holds them to simulation within standard errors (the slow checks run
hundreds of seeds); these pin what needs no statistics: with failures that never
come, the expected wall time is the failure-free run's, start and end included,
which the engine computes deterministically; with failures, it solves the model's
renewal equations, integrated numerically here (``by_renewal``); and the estimator is a
least-squares fit that numpy.polyfit computes independently. (Found missing by ``make
mutants``: the terms that only failures reach were held by the slow tests alone.)
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import replace

import numpy as np
import pytest
from scipy.integrate import quad

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


def by_renewal(s: sim.Scenario, k: int, risk_s: float | None = None) -> tuple[float, float]:
    """(expected wall time, expected cycle) of ``s`` saving every ``k`` steps, from the
    renewal equations of the model, integrated numerically over the failure time
    (scipy's quad), independently of the closed form's algebra.

    Failures are exponential, so a span of ``T`` s that a failure at ``x`` cuts short
    costs ``x`` plus what follows that failure; a span that a failure sends back to its
    own start costs ``E`` with ``E = through(E)``, linear in ``E``, solved from two
    evaluations. The risk window: a failure within ``risk_s`` of a save's call finds
    the previous save as the newest durable one."""
    m, r, w, st = s.job_mtbf_s, s.restore_s, s.warmup_s, s.step_time_s
    risk = s.latency_s if risk_s is None else risk_s
    tau = k * st

    def through(length: float, after, split: float | None = None) -> float:
        cuts = [0.0, *([split] if split is not None and 0 < split < length else []), length]
        density = lambda x: (x + after(x)) * math.exp(-x / m) / m  # noqa: E731
        pieces = itertools.pairwise(cuts)
        hit = sum(quad(density, a, b, epsabs=0, epsrel=1e-13)[0] for a, b in pieces)
        return hit + length * math.exp(-length / m)

    def solve(f) -> float:
        at0 = f(0.0)
        return at0 / (1.0 - (f(1.0) - at0))

    def window(length: float) -> float:  # each failure starts it again
        return solve(lambda e: through(length, lambda x: e))

    n = s.steps
    saves = -(-n // k) - 1
    if saves == 0:  # warm-up and the whole run; a failure restarts all of it
        first = w + n * st
        return through(first, lambda x: window(r + first)), math.nan
    back = window(r + w + tau)  # from a failure to the save call after the durable one
    start = through(w + tau, lambda x: back)
    period = tau + s.save_cost_s  # from one save call to the next
    cycle = solve(lambda g: through(period, lambda x: back + (g if x < risk else 0.0), risk))
    rest = (n - saves * k) * st
    ends_writing = s.blocking_s + rest / (1 - s.slowdown) <= s.latency_s
    tail = s.blocking_s + rest / (1 - s.slowdown) if ends_writing else rest + s.save_cost_s
    again = window(r + w + rest)  # from a failure after the last save is durable
    end = solve(lambda e: through(tail, lambda x: back + e if x < risk else again, risk))
    return start + (saves - 1) * cycle + end, cycle


FAILING = [
    # M = 1000 s: a run of ~1000 s fails about once; 3 saves and a 100-step tail
    (case(1_000, 1.0, 5.0, 20.0, 0.1, 60.0, 1000.0, first_step_s=11.0), 300),
    # the run ends 10 steps after the last save's call, while its write runs
    (case(910, 1.0, 5.0, 20.0, 0.1, 60.0, 1000.0, first_step_s=11.0), 300),
    # 15 steps after it: the write (13.5 steps at 90% speed) was durable 1.5 s before
    (case(915, 1.0, 5.0, 20.0, 0.1, 60.0, 1000.0, first_step_s=11.0), 300),
    # one save: no whole cycle; half-second steps, a long write
    (case(1_000, 0.5, 5.0, 150.0, 0.2, 30.0, 800.0), 600),
    # no save: a failure restarts the run from the start
    (case(1_000, 0.5, 5.0, 20.0, 0.1, 30.0, 800.0, first_step_s=20.5), 2_000),
]


@pytest.mark.parametrize(("s", "every"), FAILING)
@pytest.mark.parametrize("durable_after_s", [None, 0.0, 5.0])
def test_with_failures_the_closed_form_solves_the_renewal_equations(
    s, every, durable_after_s
) -> None:
    wall, cycle = by_renewal(s, every, durable_after_s)
    assert theory.expected_wall_s(s, every, durable_after_s) == pytest.approx(wall, rel=1e-9)
    # the failure-free run for scale: failures cost several percent at least
    assert wall > 1.05 * by_renewal(replace(s, mtbf_gpu_hours=1e9), every)[0]
    if not math.isnan(cycle):
        assert theory.cycle_s(s, every, durable_after_s) == pytest.approx(cycle, rel=1e-9)
