"""What the simulator must give, in closed form: the yardstick its tests and the
decision-quality benchmark hold it and the oracle to.

For a fixed interval of ``k`` steps and exponential failures (no storage phases),
:func:`expected_wall_s` is the exact expected wall time of a whole run of the
simulator's model, start and end included; docs/simulator.md ("The closed form")
derives it. Its steady state is Daly's exact expectation extended with the write
latency ``L`` and the warm-up ``w``: a cycle of ``τ = k × step time`` of kept work
takes ``g = (1 − e^(−(τ+δ)/M)) · M · e^((R + w + τ + L)/M)``, which with ``L = δ``
and ``w = 0`` is Daly's ``M·e^(R/M)·(e^((τ+δ)/M) − 1)``.

:func:`mean_wall` estimates the same expectation from simulated runs with a control
variate that has a known mean whatever the policy or the engine do, so it needs
several times fewer seeds for the same precision.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from adaptd.sim.engine import RunResult
from adaptd.sim.scenario import Scenario


def _window_s(length_s: float, mtbf_s: float) -> float:
    """Expected time until ``length_s`` pass without a failure, when each failure
    starts the wait again (a restart, a warm-up, compute since a durable save)."""
    return mtbf_s * math.expm1(length_s / mtbf_s)


def _hit(t: float, mtbf_s: float) -> float:
    """P(a failure within ``t``)."""
    return -math.expm1(-t / mtbf_s)


def cycle_s(scenario: Scenario, every_steps: int, durable_after_s: float | None = None) -> float:
    """Expected wall time per ``every_steps`` steps of kept work, in steady state.

    ``durable_after_s``: when a save becomes durable, counted from its call (default
    the scenario's ``latency_s``; other values give what-ifs: 0 is a save durable at
    its call, ``blocking_s`` one durable when the loop resumes). Raises
    :class:`ValueError` when the formula does not apply: the scenario is not
    exponential, has storage phases or a failure trace, or the write outlasts the
    interval (the next save would wait for it).
    """
    _check(scenario, every_steps)
    s, mtbf = scenario, scenario.job_mtbf_s
    risk = s.latency_s if durable_after_s is None else durable_after_s
    tau = every_steps * s.step_time_s
    return (
        _hit(tau + s.save_cost_s, mtbf)
        * mtbf
        * math.exp((s.restore_s + s.warmup_s + tau + risk) / mtbf)
    )


def expected_wall_s(
    scenario: Scenario, every_steps: int, durable_after_s: float | None = None
) -> float:
    """Exact expected wall time of one run of ``scenario`` saving every ``every_steps``
    steps (counted from the last save or resume), as the simulator models it.

    ``durable_after_s`` and the errors raised: as :func:`cycle_s`.
    """
    _check(scenario, every_steps)
    s, mtbf, k = scenario, scenario.job_mtbf_s, every_steps
    n, st, b, lat, w, r = s.steps, s.step_time_s, s.blocking_s, s.latency_s, s.warmup_s, s.restore_s
    risk = lat if durable_after_s is None else durable_after_s
    tau, delta = k * st, s.save_cost_s
    saves = math.ceil(n / k) - 1  # saves of a run without failures (none at the end)
    if saves == 0:
        first = w + n * st
        return mtbf * _hit(first, mtbf) + _hit(first, mtbf) * _window_s(r + first, mtbf)
    # from a failure: restart, warm-up and one interval of compute, to the next save call
    back = _window_s(r + w + tau, mtbf)
    # from the start to the first save call: warm-up and one interval, no restart first
    start = mtbf * _hit(w + tau, mtbf) + _hit(w + tau, mtbf) * back
    # from the last save call to the end: the remaining steps, durable or not
    rest = (n - saves * k) * st
    writing = rest <= (1.0 - s.slowdown) * (lat - b)  # the run ends while the write runs
    tail = b + rest / (1.0 - s.slowdown) if writing else rest + delta
    risky = min(risk, tail)  # a failure before this rolls back one more interval
    end = (
        mtbf * _hit(tail, mtbf)
        + _hit(risky, mtbf) * back
        + (_hit(tail, mtbf) - _hit(risky, mtbf)) * _window_s(r + w + rest, mtbf)
    ) / (1.0 - _hit(risky, mtbf))
    return start + (saves - 1) * cycle_s(s, k, durable_after_s) + end


def covers(s: Scenario) -> bool:
    """Whether the closed form applies: exponential failures, no storage phases, no trace."""
    return s.distribution == "exponential" and not s.phases and s.trace is None


def _check(s: Scenario, every_steps: int) -> None:
    if not covers(s):
        raise ValueError(
            f"scenario {s.name!r}: the closed form needs exponential failures without "
            "storage phases or a failure trace"
        )
    if every_steps < 1:
        raise ValueError(f"every_steps must be >= 1, got {every_steps}")
    if s.latency_s > every_steps * s.step_time_s + s.save_cost_s:
        raise ValueError(
            f"scenario {s.name!r}: the write ({s.latency_s:g}s) outlasts an interval of "
            f"{every_steps} steps, so saves would wait for it; the closed form needs "
            "latency_s <= interval + δ"
        )


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with its standard error (seconds)."""

    mean_s: float
    stderr_s: float
    plain_stderr_s: float  # the standard error of the plain mean, for comparison
    seeds: int


def mean_wall(runs: Sequence[RunResult], mtbf_s: float) -> Estimate:
    """The mean wall time of ``runs``, with the failure count as control variate.

    Failures form a Poisson process of rate 1/M and a run ends at a stopping time W
    (its end depends only on the failures before it), so by optional stopping
    ``E[failures − W/M] = 0`` for any policy and any engine that draws its failures
    from that process. Most of the spread of W between seeds is how many failures
    struck; subtracting ``β·(failures − W/M)`` (β fitted by least squares) removes it
    and leaves what each failure cost. The correction has mean zero whether or not
    the engine is right, so it sharpens the estimate without pulling it toward the
    theory. Raises :class:`ValueError` for fewer than 3 runs.
    """
    if len(runs) < 3:
        raise ValueError(f"need at least 3 runs for a standard error, got {len(runs)}")
    walls = [r.wall_s for r in runs]
    control = [r.failures - r.wall_s / mtbf_s for r in runs]
    n = len(runs)
    var_c = statistics.variance(control)
    beta = statistics.covariance(walls, control) / var_c if var_c > 0 else 0.0
    adjusted = [w - beta * c for w, c in zip(walls, control, strict=True)]
    return Estimate(
        mean_s=statistics.fmean(adjusted),
        stderr_s=statistics.stdev(adjusted) / math.sqrt(n),
        plain_stderr_s=statistics.stdev(walls) / math.sqrt(n),
        seeds=n,
    )
