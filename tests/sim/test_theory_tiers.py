"""The simulator held to the two-tier closed form (adaptd/sim/theory_tiers.py), as
test_theory.py holds it to the one-tier form: the mean wall time of fixed two-tier
schedules (control-variate estimate) within 4 standard errors of the exact expectation,
with a tolerance narrow enough to see the mistakes a broken engine would make."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from adaptd import sim
from adaptd.sim import theory, theory_tiers
from adaptd.sim.oracles import TierOracle

Z = 4.0


def case(steps: int = 15000, **failures) -> sim.Scenario:
    return sim.from_dict(
        {
            "job": {"steps": steps, "step_time_s": 1.0, "gpus": 1},
            "checkpoint": {
                "blocking_s": 5.0,
                "latency_s": 20.0,
                "slowdown": 0.1,
                "restore_s": 120.0,
                "local": {"blocking_s": 0.5, "latency_s": 2.0, "slowdown": 0.05, "restore_s": 20.0},
            },
            "failures": {"mtbf_gpu_hours": 3000 / 3600, "process_share": 0.7, **failures},
        }
    )


@pytest.mark.parametrize(
    ("step_time_s", "first_step_s", "share"),
    [(1.0, None, 0.0), (0.5, 30.5, 0.0), (2.0, 2.0, 0.0), (1.0, None, 1.0), (0.5, 30.5, 0.6)],
)
def test_one_class_and_every_save_durable_is_the_one_tier_form(
    step_time_s, first_step_s, share
) -> None:
    """With every save to both tiers and no slow-down from the local write, a save is one
    save of blocking b₁ + b₂ durable b₁ + L₂ after its call: with host failures only, the
    one-tier closed form, start and end included (whole steps of any length, a first step
    of each incarnation 30 s longer). So it is with process failures too when the local
    copy completes with the durable one (L₁ = 15.5: b₂ + L₁ = b₁ + L₂) and a restart in
    place takes as long: every restart then comes back from the same save in the same time."""
    s = replace(case(process_share=share), step_time_s=step_time_s, first_step_s=first_step_s)
    local = {"slowdown": 0.0}
    if share:
        local.update(latency_s=15.5, restore_s=s.restore_s)
    s = replace(s, local=replace(s.local, **local))
    single = replace(s, local=None, blocking_s=5.5, latency_s=20.5)
    assert single.save_cost_s == s.save_cost_s + s.local.save_cost_s
    for every in (60, 90, 400, s.steps // 2):  # the last: one save, at the middle
        assert theory_tiers.expected_wall_s(s, every, 1) == pytest.approx(
            theory.expected_wall_s(single, every), rel=1e-11
        )
        cycle = theory_tiers.steady_state(s, every, 1)
        tau = every * step_time_s
        assert cycle.goodput == pytest.approx(tau / theory.cycle_s(single, every), rel=1e-12)
        assert cycle.kept_s == pytest.approx(tau, rel=1e-12)  # a durable save every interval
        # the steady state's start is the one-tier run's first cycle: a warm-up, an interval
        assert theory_tiers.steady_wall_s(s, every, 1) == pytest.approx(
            cycle.first_wall_s + (s.steps * step_time_s - cycle.first_kept_s) / cycle.goodput
        )
        assert cycle.first_kept_s == pytest.approx(tau, rel=1e-12)


def test_the_steady_state_is_the_whole_runs_rate() -> None:
    """The two forms are built apart (a cycle from a durable copy to the next; the whole
    run by positions): a run longer by Δ steps takes Δ/goodput more, up to where in its
    cadence a longer run ends (a lost durable copy shifts the cadence by one save), a
    few 1e-6; exactly with every save durable. Off by one in a copy's completion time
    (the local copy of a durable save complete at L₁ instead of b₂ + L₁) is 1e-4 to 1e-3."""
    base = case(steps=6000)
    late = replace(base, local=replace(base.local, latency_s=25.0))  # local after durable
    for s, every, k, tol in ((base, 60, 5, 3e-5), (base, 30, 1, 1e-12), (base, 45, 12, 3e-5),
                             (late, 60, 5, 3e-5), (late, 40, 1, 1e-12)):  # fmt: skip
        delta = every * k * 10
        longer = theory_tiers.expected_wall_s(replace(s, steps=6000 + delta), every, k)
        rate = (longer - theory_tiers.expected_wall_s(s, every, k)) / delta
        assert rate * theory_tiers.steady_state(s, every, k).goodput == pytest.approx(1, abs=tol)
        # and a whole run is its steady state but for its two ends
        whole, steady = (f(s, every, k) for f in (theory_tiers.expected_wall_s,
                                                  theory_tiers.steady_wall_s))  # fmt: skip
        assert whole != steady and whole == pytest.approx(steady, rel=2 * every * k / s.steps)


def test_the_closed_form_refuses_what_it_does_not_model() -> None:
    s = case()
    for other, why in [
        (replace(s, local=None), "needs a local tier"),
        (replace(s, distribution="weibull", weibull_shape=0.7), "exponential"),
        (replace(s, peer_share=0.5, jit_save_s=1.0), "just-in-time"),
        (replace(s, trace=(1.0,)), "trace"),
    ]:
        assert not theory_tiers.covers(other)
        with pytest.raises(ValueError, match=why):
            theory_tiers.steady_state(other, 60, 5)
    with pytest.raises(ValueError, match="outlasts an interval of 10 steps"):
        theory_tiers.steady_state(s, 10, 5)  # a 20 s durable write, saves every 10 s
    # at the bounds: a local copy complete exactly as the next save is due is in time
    # (every 10 s: a local segment of 10.5 s, a durable one of 10.5 + 5 = 15.5 s)
    sync = sim.from_dict(
        {
            "job": {"steps": 1000, "step_time_s": 1.0},
            "checkpoint": {"blocking_s": 5.0, "latency_s": 10.5,
                           "local": {"blocking_s": 0.5, "latency_s": 10.5}},
            "failures": {"mtbf_gpu_hours": 1.0, "process_share": 0.5},
        }
    )  # fmt: skip
    theory_tiers.steady_state(sync, 10, 2)  # a1 = 10.5 = t1, c1 = 15.5 = t2, c2 = 11 < 15.5
    late = replace(sync, local=replace(sync.local, latency_s=10.75))
    with pytest.raises(ValueError, match=re.escape("local copy 10.75 s after a 10.5 s segment")):
        theory_tiers.steady_state(late, 10, 2)
    durable = replace(sync, latency_s=15.0)  # c2 = 0.5 + 15 = 15.5 = t2: in time
    theory_tiers.steady_state(durable, 10, 2)
    with pytest.raises(ValueError, match=re.escape("durable 15.75 s after a 15.5 s one")):
        theory_tiers.steady_state(replace(sync, latency_s=15.25), 10, 2)
    with pytest.raises(ValueError, match="must be >= 1"):
        theory_tiers.steady_state(s, 60, 0)
    with pytest.raises(ValueError, match="saves nothing"):
        theory_tiers.expected_wall_s(case(steps=60), 60, 5)
    theory_tiers.expected_wall_s(case(steps=61), 60, 5)  # one save


@pytest.mark.slow
@pytest.mark.parametrize(("every", "k", "late"), [(30, 1, False), (60, 5, False), (60, 5, True)])
def test_the_engine_is_the_closed_form(every: int, k: int, late: bool) -> None:
    s = case()
    if late:  # the local copy of a durable save completes after its durable copy
        s = replace(s, local=replace(s.local, latency_s=25.0))
    runs = [sim.run(s, TierOracle(every, k), seed) for seed in range(150)]
    est = theory.mean_wall(runs, s.job_mtbf_s)
    expected = theory_tiers.expected_wall_s(s, every, k)
    tol = Z * est.stderr_s
    assert abs(est.mean_s - expected) <= tol, (est.mean_s, expected, est.stderr_s)
    # what the tolerance can see: restarts in place as slow as from durable storage,
    # and the classes confused either way, each move the expectation > 2 tolerances
    effects = {
        "no faster restart in place": theory_tiers.expected_wall_s(
            replace(s, local=replace(s.local, restore_s=s.restore_s)), every, k
        ),
        "every failure a lost host": theory_tiers.expected_wall_s(
            replace(s, process_share=0.0), every, k
        ),
        "no failure a lost host": theory_tiers.expected_wall_s(
            replace(s, process_share=1.0), every, k
        ),
    }
    if k == 1:  # with a durable save every 30 s its write latency shows too
        effects["durable at its call"] = theory_tiers.expected_wall_s(
            replace(s, latency_s=s.blocking_s), every, k
        )
    for what, other in effects.items():
        assert abs(other - expected) > 2 * tol, (what, other - expected, tol)
    assert est.stderr_s < est.plain_stderr_s / math.sqrt(1.5)
