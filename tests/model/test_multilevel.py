"""The two-tier model (adaptd/core/multilevel.py) at points worked by hand, in its degenerate
cases, and against the whole search it shortens."""

from __future__ import annotations

import math
import random

import pytest

from adaptd.core import model
from adaptd.core.multilevel import (
    MAX_DURABLE_EVERY,
    Rates,
    Tier,
    TierPlan,
    best_every,
    interval_for,
    optimal_every,
    plan,
    waste,
)

# Worked by hand. With cost(k) = δ₁ + δ₂/k and risk(k) = λ_p + kλ_h, τ_k = √(2·cost/risk)
# and, unfloored, W(τ_k, k) = √(2·cost·risk) + the latency and restart terms.
#
# A: δ₁ = 2, δ₂ = 50, λ_p = 1/1000, λ_h = 1/25000: k* = √(50·0.001/(2·0.00004)) = √625 = 25;
#    cost = 4, risk = 0.002: τ = √4000 = 63.2456, W = √0.016 = 0.126491
#    = √(2δ₁λ_p) + √(2δ₂λ_h) = 2·√0.004 (Benoit et al.'s Σ√(2λC)).
# B: δ₁ = 1, δ₂ = 30, λ_p = 1/2000, λ_h = 1/20000: k* = √300 = 17.32. k = 17: cost =
#    2.764706, risk = 0.00135, τ = √4095.86 = 63.9989, W = √0.00746471 = 0.0863985;
#    k = 18: cost 2.666667, risk 0.0014, W = √0.00746667 = 0.0864099: 17 wins, and the
#    real optimum √2·(√0.0005 + √0.0015) = 0.0863953 is a little lower.
# C: A with L₁ = 100: the floor binds (τ*_16 = √6250 = 79.06 < 100), so W(k) = (2 + 50/k)/100
#    + (0.001 + k/25000)·50 + λ_p·L₁; its least is at k = √250 = 15.8: k = 15 gives
#    0.133333, 16 gives 0.13325, 17 gives 0.133412: k = 16, W = 0.13325 + 0.1 = 0.23325.
# D: A with L₂ = 3000: kτ ≥ 3000 binds, W(k) = (2k + 50)/3000 + 1.5/k + 0.06 + λ_h·L₂,
#    least at k = √2250 = 47.4: k = 47 gives 0.1399149, 48 gives 0.1399167;
#    τ = 3000/47 = 63.8298, W = 0.1399149 + 0.12 = 0.2599149.
# E: δ₁ = δ₂ = 10, λ_p = λ_h = 1e-4, R₁ = 0, R₂ = 600: k* = 1; k = 1: cost 20, risk 2e-4,
#    τ = √200000 = 447.214, W = √0.008 + 1e-4·600 = 0.0894427 + 0.06 = 0.1494427; k = 2:
#    √0.009 + 0.06 = 0.1548683. One tier: Young √(2·10·5000) = 316.23, first-order
#    0.0632456 + 2e-4·600 = 0.1832456 > 0.1494: two tiers, every save durable.
A = (Tier(2.0), Tier(50.0), Rates(1 / 1000, 1 / 25000))
CASES = [
    # (local, durable, rates, k, τ, W)
    (*A, 25, math.sqrt(4000), 0.1264911),
    (Tier(1.0), Tier(30.0), Rates(1 / 2000, 1 / 20000), 17, 63.99891, 0.0863985),
    (Tier(2.0, 100.0), Tier(50.0), A[2], 16, 100.0, 0.23325),
    (Tier(2.0), Tier(50.0, 3000.0), A[2], 47, 3000 / 47, 0.2599149),
    (Tier(10.0, 0.0, 0.0), Tier(10.0, 0.0, 600.0), Rates(1e-4, 1e-4), 1, math.sqrt(2e5), 0.1494427),
]  # fmt: skip


@pytest.mark.parametrize(("local", "durable", "rates", "k", "tau", "w"), CASES)
def test_the_two_tier_optimum_at_points_worked_by_hand(local, durable, rates, k, tau, w) -> None:
    got = plan(durable, rates, local)
    assert (got.durable_every, got.interval_s, got.waste) == (
        k,
        pytest.approx(tau, rel=1e-6),
        pytest.approx(w, rel=1e-6),
    )
    assert got.durable_interval_s == pytest.approx(k * tau, rel=1e-6)
    assert interval_for(k, local, durable, rates) == got.interval_s
    assert waste(got.interval_s, k, local, durable, rates) == got.waste


def test_k_star_and_the_least_waste_are_benoit_et_als() -> None:
    local, durable, rates = A
    assert optimal_every(local, durable, rates) == pytest.approx(25.0, rel=1e-12)
    least = math.sqrt(2 * 2.0 / 1000) + math.sqrt(2 * 50.0 / 25000)
    assert plan(durable, rates, local).waste == pytest.approx(least, rel=1e-12)
    # for B the integer k costs a little more than the real optimum, never less
    local, durable, rates = CASES[1][:3]
    real = math.sqrt(2) * (math.sqrt(1.0 / 2000) + math.sqrt(30.0 / 20000))
    assert real < plan(durable, rates, local).waste < real * 1.0001
    assert optimal_every(local, durable, rates) == pytest.approx(math.sqrt(300), rel=1e-12)
    assert optimal_every(Tier(0.0), durable, rates) == math.inf
    assert optimal_every(local, durable, Rates(0.0, 1e-4)) == 0.0
    assert optimal_every(Tier(0.0), Tier(0.0), Rates(0.0, 1e-4)) == 1.0


def test_the_waste_adds_latencies_restarts_and_covered_failures_per_class() -> None:
    local, durable = Tier(2.0, 5.0, 30.0), Tier(50.0, 100.0, 600.0)
    rates = Rates(1e-3, 4e-5, covered=2e-3, covered_cost_s=40.0)
    # 4/60 + 1e-3·(30 + 5 + 30) + 4e-5·(25·30 + 100 + 600) + 2e-3·40
    expected = 4 / 60 + 1e-3 * 65 + 4e-5 * 1450 + 0.08
    assert waste(60.0, 25, local, durable, rates) == pytest.approx(expected, rel=1e-12)


def test_without_a_local_tier_the_answer_is_dalys_exactly() -> None:
    for delta, mtbf in [(30.0, 10986.0), (8.0, 2e5), (50.0, 100.0), (0.0, 500.0)]:
        got = plan(Tier(delta, 120.0, 600.0), Rates.of(None, mtbf))
        assert got.durable_every is None
        assert got.interval_s == pytest.approx(
            model.daly_interval(max(delta, 1e-6), mtbf), rel=1e-12
        )
        assert got.waste == pytest.approx(
            model.waste_approx(
                got.interval_s,
                model.Terms(max(delta, 1e-6), mtbf, latency_s=120.0, restart_s=600.0),
            ),
            rel=1e-12,
        )


def test_the_degenerate_classes() -> None:
    local, durable = Tier(2.0), Tier(50.0)
    # no process failures: a local save protects nothing a durable one does not
    assert plan(durable, Rates(0.0, 1e-3), local).durable_every is None
    # no host failures: as many local saves per durable one as allowed
    assert plan(durable, Rates(1e-3, 0.0), local).durable_every == MAX_DURABLE_EVERY
    assert plan(durable, Rates(1e-3, 0.0), local, max_every=7).durable_every == 7
    # host failures only, but a local save that restarts nothing faster: one tier
    assert (
        plan(Tier(10.0, 0.0, 600.0), Rates(1e-4, 1e-4), Tier(10.0, 0.0, 600.0)).durable_every
        is None
    )


def test_the_reasons_say_both_intervals_the_classes_and_the_waste() -> None:
    local, durable, rates = A
    assert plan(durable, rates, local).reason == (
        "two tiers: local every 63.2 s (δ₁=2 s), durable every 25th (δ₂=50 s); uncovered "
        "failures: process every 16.7 min, host every 6.94 h → waste 12.6%"
    )
    assert plan(Tier(50.0), Rates(0.0, 1 / 1000)).reason == (
        "one tier: every 4.73 min (δ=50 s); uncovered failures: process never, host every "
        "16.7 min → waste 31.8%"
    )
    got = plan(Tier(10.0, 0.0, 600.0), Rates(1e-4, 1e-4), Tier(10.0))
    assert "durable every save (δ₂=10 s)" in got.reason
    covered = Rates.of(1000.0, 4000.0, coverage=0.5)
    assert "(50% covered just in time)" in plan(durable, covered, local).reason
    for top, nth in ((2, "2nd"), (3, "3rd"), (11, "11th"), (21, "21st")):
        assert f"every {nth} " in plan(durable, Rates(1e-3, 0.0), local, max_every=top).reason


def test_rates_of_mtbfs_and_coverage() -> None:
    r = Rates.of(1000.0, 4000.0, coverage=0.5, covered_cost_s=9.0)
    assert (r.process, r.host, r.covered, r.covered_cost_s) == (
        pytest.approx(5e-4),
        pytest.approx(1.25e-4),
        pytest.approx(0.5 * (1e-3 + 2.5e-4)),
        9.0,
    )
    assert r.uncovered == pytest.approx(6.25e-4)
    assert Rates.of(None, 4000.0) == Rates(0.0, 1 / 4000.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Tier(-1.0), "save_cost_s must be >= 0 seconds, got -1.0"),
        (lambda: Tier(1.0, math.inf), "latency_s must be >= 0 seconds, got inf"),
        (lambda: Tier(1.0, 0.0, -2.0), "restart_s must be >= 0 seconds, got -2.0"),
        (lambda: Rates(-1e-3, 1e-3), "process rate must be a finite number >= 0 per second"),
        (lambda: Rates(0.0, 0.0), "no uncovered failures"),
        (lambda: Rates(1e-3, 0.0, covered=-1.0), "covered rate"),
        (lambda: Rates.of(1000.0, 1000.0, coverage=1.0), r"coverage must be a share in \[0, 1\)"),
        (lambda: Rates.of(1000.0, 0.0), "host_mtbf_s must be a positive"),
        (lambda: Rates.of(-5.0, 1000.0), "process_mtbf_s must be a positive"),
        (lambda: interval_for(0, *A), "durable every must be >= 1"),
        (lambda: waste(0.0, 1, *A), "interval_s must be a positive"),
        (lambda: waste(10.0, 0, *A), "durable every must be >= 1"),
        (lambda: plan(A[1], A[2], A[0], max_every=0), "max_every must be >= 1"),
        (lambda: best_every(*A, max_every=0), "max_every must be >= 1"),
    ],
)
def test_invalid_figures_are_named(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_the_descent_finds_what_the_whole_search_finds() -> None:
    """The least waste over k falls then rises (W is jointly convex in τ and kτ, each
    floored on its own): the descent from D°/τ° agrees with trying every k."""
    rng = random.Random(3)
    for _ in range(600):
        e = lambda a, b: 10 ** rng.uniform(a, b)  # noqa: E731
        local = Tier(e(-3, 1.5), e(-2, 2) if rng.random() < 0.7 else 0.0, e(0, 3))
        durable = Tier(e(-1, 3), e(-1, 3.5) if rng.random() < 0.8 else 0.0, e(0, 3.5))
        rates = Rates(e(-7, -2), e(-8, -2) if rng.random() < 0.95 else 0.0)
        top = rng.choice([1, 2, 5, 100])
        k, w, tau = best_every(local, durable, rates, top)
        every = [waste(interval_for(j, local, durable, rates), j, local, durable, rates)
                 for j in range(1, top + 1)]  # fmt: skip
        least = min(every)
        assert w <= least * (1 + 1e-12), (local, durable, rates, top)
        assert k == every.index(least) + 1 or every[k - 1] == least
        assert tau == interval_for(k, local, durable, rates)


def test_a_plan_is_a_frozen_record() -> None:
    p = TierPlan(60.0, 5, 0.1, "why")
    assert p.durable_interval_s == 300.0
    assert TierPlan(60.0, None, 0.1, "why").durable_interval_s == 60.0
    with pytest.raises(AttributeError):
        p.interval_s = 1.0  # type: ignore[misc]


# ------------------------------------------------------------------ found by make mutants


@pytest.mark.parametrize(
    ("local", "durable", "rates", "top", "start"),
    [
        # A: D* = √(2·50·25000) = 1581.1, τ* = √(2·2·1000) = 63.25: 25
        (*A, 100, 25),
        # B: D* = √(2·30·20000) = 1095.4, τ* = √(2·1·2000) = 63.25: 17.32 → 17
        (*CASES[1][:3], 100, 17),
        # C: τ° = L₁ = 100: 15.8 → 16; D: D° = L₂ = 3000: 47.4 → 47
        (*CASES[2][:3], 100, 16),
        (*CASES[3][:3], 100, 47),
        (*A, 10, 10),  # capped
        (Tier(2.0), Tier(50.0), Rates(1e-3, 0.0), 100, 100),  # no host failures: the most
        (Tier(50.0), Tier(1.0), Rates(1e-4, 1e-2), 100, 1),  # at least one
        # saves under a second: τ* = √40 = 6.325, D* = √1e7 = 3162.3 and √1e5 = 316.2
        (Tier(0.02), Tier(50.0), Rates(1e-3, 1e-5), 1000, 500),
        (Tier(0.02), Tier(0.5), Rates(1e-3, 1e-5), 1000, 50),
    ],
)
def test_the_descent_starts_next_to_the_floored_real_optimum(local, durable, rates, top, start):
    from adaptd.core.multilevel import start_every

    assert start_every(local, durable, rates, top) == start


def test_the_descent_reaches_the_least_waste_from_any_start_and_keeps_the_smaller_k_on_ties():
    rng = random.Random(9)
    for _ in range(200):
        e = lambda a, b: 10 ** rng.uniform(a, b)  # noqa: E731
        local, durable = Tier(e(-3, 1.5), e(-2, 2), e(0, 3)), Tier(e(-1, 3), e(-1, 3.5), e(0, 3))
        rates = Rates(e(-7, -2), e(-8, -2))
        least = min(waste(interval_for(j, local, durable, rates), j, local, durable, rates)
                    for j in range(1, 41))  # fmt: skip
        for start in (1, rng.randint(1, 40), 40, 99):
            assert best_every(local, durable, rates, 40, start=start)[1] <= least * (1 + 1e-12)
    # δ₁ = 1, δ₂ = 6, λ_p = λ_h: W(2) = W(3) exactly (δ₁λ_h = δ₂λ_p/(2·3)); 2 from anywhere
    tie = (Tier(1.0), Tier(6.0), Rates(1 / 1024, 1 / 1024))
    w2, w3 = (waste(interval_for(k, *tie), k, *tie) for k in (2, 3))
    assert w2 == w3
    assert [best_every(*tie, start=s)[0] for s in (None, 1, 2, 3, 10)] == [2] * 5


def test_durations_and_ordinals_in_reasons() -> None:
    from adaptd.core.model import duration_text
    from adaptd.core.multilevel import _ordinal

    assert [duration_text(x) for x in (119.0, 120.0, 7199.0, 7200.0)] == [
        "119 s", "2 min", "120 min", "2 h",
    ]  # fmt: skip
    assert [_ordinal(n) for n in (1, 2, 3, 4, 10, 11, 12, 13, 20, 21, 22, 111, 121)] == [
        "1st", "2nd", "3rd", "4th", "10th", "11th", "12th", "13th", "20th", "21st", "22nd",
        "111th", "121st",
    ]  # fmt: skip
    got = plan(Tier(50.0), Rates.of(None, 1000.0, coverage=0.5), Tier(2.0))
    assert got.reason == (
        "one tier: every 6.91 min (δ=50 s); uncovered failures: process never, host every "
        "33.3 min (50% covered just in time) → waste 22.4%"
    )


def test_covered_failures_and_latencies_count_for_the_single_tier_too() -> None:
    # the covered constant is in the single tier's reported waste ...
    base = plan(Tier(50.0), Rates(0.0, 1e-3))
    covered = plan(Tier(50.0), Rates(0.0, 1e-3, covered=1e-3, covered_cost_s=40.0))
    assert covered.waste == pytest.approx(base.waste + 0.04, rel=1e-12)
    # ... and in its comparison with two tiers (case E: two tiers by 0.0338, not by 0.04)
    e = (Tier(10.0, 0.0, 600.0), Rates(1e-4, 1e-4, covered=1e-4, covered_cost_s=200.0))
    assert plan(*e, Tier(10.0)).durable_every == 1
    # a durable latency of 400 s costs the single tier λ·L₂, two tiers only λ_h·L₂:
    # 0.0632 + 2e-4·1000 = 0.263 against 0.0894 + 1e-4·1000 = 0.189
    assert plan(Tier(10.0, 400.0, 600.0), Rates(1e-4, 1e-4), Tier(10.0)).durable_every == 1


def test_the_smallest_figures_and_bounds() -> None:
    # both saves free: the cost floors at Daly's 1e-6 s, τ = √(2e-6/2e-3)
    free = interval_for(1, Tier(0.0), Tier(0.0), Rates(1e-3, 1e-3))
    assert free == pytest.approx(math.sqrt(1e-3), rel=1e-12)
    assert plan(Tier(50.0, 0.0, 600.0), Rates(1e-3, 0.0), Tier(2.0), max_every=1).durable_every == 1


@pytest.mark.parametrize(
    ("rates", "message"),
    [
        (lambda: Rates(1e-3, -1.0), "host rate must be a finite number >= 0 per second, got -1.0"),
        (lambda: Rates(1e-3, 0.0, covered=math.nan), "covered rate must be a finite number"),
        (
            lambda: Rates(1e-3, 0.0, covered_cost_s=-1.0),
            "covered_cost_s must be >= 0 seconds, got -1.0",
        ),
    ],
)
def test_each_rate_is_named(rates, message) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        rates()
    with pytest.raises(ValueError) as err:
        Rates(0.0, 0.0)
    assert str(err.value) == (
        "no uncovered failures (process and host rates both 0): the interval would be "
        "infinite; plan for at least a small share of uncovered failures"
    )
