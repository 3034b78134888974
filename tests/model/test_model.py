"""The interval model against hand-computed values and its defining properties."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptd.core import model

# (δ, M, Young, Daly), worked by hand: Young = √(2δM); with x = δ/2M,
# Daly = Young·(1 + √x/3 + x/9) − δ.
TABLE = [
    # δ=30, M=10986: Young = √659160 = 811.887; x = 0.0013653, √x = 0.036950
    # Daly = 811.887 · 1.012468 − 30 = 792.010
    (30.0, 10986.0, 811.887, 792.010),
    # δ=8, M=2e5: Young = √3.2e6 = 1788.854; x = 2e-5, √x = 0.0044721
    # Daly = 1788.854 · 1.0014929 − 8 = 1783.525
    (8.0, 2e5, 1788.854, 1783.525),
    # δ=50, M=100: x = 0.25: Young = 100; Daly = 100 · (1 + 0.5/3 + 0.25/9) − 50 = 69.444
    (50.0, 100.0, 100.0, 69.444),
    # δ ≥ 2M: Daly saves once per expected failure, τ = M
    (200.0, 100.0, 200.0, 100.0),
    (500.0, 100.0, math.sqrt(2 * 500 * 100), 100.0),
    (0.0, 100.0, 0.0, 0.0),
]


@pytest.mark.parametrize(("delta", "mtbf", "young", "daly"), TABLE)
def test_young_and_daly_match_hand_computed_values(delta, mtbf, young, daly) -> None:
    assert model.young_interval(delta, mtbf) == pytest.approx(young, abs=1e-3)
    assert model.daly_interval(delta, mtbf) == pytest.approx(daly, abs=1e-3)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: model.daly_interval(-1, 10), "save_cost_s"),
        (lambda: model.young_interval(1, 0), "mtbf_s"),
        (lambda: model.waste_fraction(0, model.Terms(1, 10)), "interval_s"),
        (lambda: model.weibull_interval(0, model.Terms(1, 10), shape=0), "shape"),
        (lambda: model.job_mtbf(100, 0), "gpus"),
    ],
)
def test_invalid_figures_are_named(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


positive = st.floats(min_value=1e-3, max_value=1e7, allow_nan=False)


@settings(max_examples=200)
@given(delta=positive, mtbf=positive, factor=st.floats(min_value=1.001, max_value=100))
def test_interval_grows_with_cost_and_mtbf(delta, mtbf, factor) -> None:
    for f in (model.young_interval, model.daly_interval):
        assert f(delta * factor, mtbf) >= f(delta, mtbf)
        assert f(delta, mtbf * factor) >= f(delta, mtbf)


@settings(max_examples=200)
@given(
    mtbf=st.floats(min_value=100, max_value=1e7),
    ratio=st.floats(min_value=1e-6, max_value=0.05),
    latency=st.floats(min_value=0, max_value=1),
    restart=st.floats(min_value=0, max_value=1),
)
def test_waste_is_minimised_at_dalys_interval(mtbf, ratio, latency, restart) -> None:
    delta = ratio * mtbf
    tau = model.daly_interval(delta, mtbf)
    terms = model.Terms(
        delta, mtbf, latency_s=latency * mtbf * 0.01, restart_s=restart * mtbf * 0.01
    )
    w = model.waste_fraction(tau, terms)
    for f in (0.9, 0.97, 1.03, 1.1):
        assert w <= model.waste_fraction(tau * f, terms) + 1e-12
    # and Daly's closed form is within 0.5% of the exact optimum
    assert tau == pytest.approx(model.optimal_interval(terms), rel=5e-3)


def test_waste_fraction_reduces_to_dalys_model_and_first_order() -> None:
    tau, delta, m, r = 800.0, 30.0, 11000.0, 600.0
    daly_total = m * math.exp(r / m) * math.expm1((tau + delta) / m)
    daly = model.Terms(delta, m, restart_s=r)
    assert model.waste_fraction(tau, daly) == pytest.approx(1 - tau / daly_total)
    # for τ ≪ M the exact waste is close to δ/τ + (τ/2 + L + R)/M
    exact = model.waste_fraction(
        tau, model.Terms(delta, m, latency_s=100.0, restart_s=r, blocking_s=20.0)
    )
    approx = model.waste_approx(tau, model.Terms(delta, m, latency_s=100.0, restart_s=r))
    assert exact == pytest.approx(approx, rel=0.1)


def test_latency_and_restart_add_waste_but_do_not_move_the_optimum() -> None:
    delta, m = 20.0, 40000.0
    taus = [500 + 10 * i for i in range(150)]

    def terms(latency_s: float, restart_s: float) -> model.Terms:
        return model.Terms(delta, m, latency_s=latency_s, restart_s=restart_s, blocking_s=5)

    best = [
        min(taus, key=lambda t, L=L, R=R: model.waste_fraction(t, terms(L, R)))
        for L, R in ((5, 0), (300, 0), (5, 900), (300, 900))
    ]
    assert len(set(best)) == 1
    assert model.waste_fraction(1200, terms(300, 900)) > model.waste_fraction(1200, terms(5, 0))


def test_async_floor_keeps_one_save_in_flight() -> None:
    assert model.async_floor(30.0, 120.0) == 120.0
    assert model.async_floor(300.0, 120.0) == 300.0
    assert model.async_floor(300.0, None) == 300.0


def test_weibull_shape_one_is_the_exponential_optimum() -> None:
    delta, m = 22.0, 43945.0
    for age in (0.0, 5000.0, 50000.0):  # memoryless: the age does not matter
        terms = model.Terms(delta, m)
        assert model.weibull_interval(age, terms, 1.0) == pytest.approx(
            model.optimal_interval(terms), rel=2e-3
        )


def test_weibull_bursty_failures_want_short_intervals_early_and_long_later() -> None:
    delta, m = 22.0, 43945.0
    terms = model.Terms(delta, m, restart_s=300)
    early = model.weibull_interval(60.0, terms, 0.7)
    later = [model.weibull_interval(a, terms, 0.7) for a in (1e4, 5e4, 2e5)]
    assert early < model.daly_interval(delta, m) < later[-1]
    assert later == sorted(later)


def test_weibull_cost_ratio_agrees_with_numeric_integration() -> None:
    from scipy.integrate import quad

    age, tau, delta, m, k, r = 3000.0, 900.0, 20.0, 40000.0, 0.7, 300.0
    lam = model.weibull_scale(m, k)

    def surv(x: float) -> float:
        return math.exp((age / lam) ** k - ((age + x) / lam) ** k)

    integral, _ = quad(surv, 0, tau + delta)
    p = surv(tau + delta)
    expected = (integral + (1 - p) * r) / (p * tau)
    terms = model.Terms(delta, m, restart_s=r)
    assert model.weibull_cost_ratio(tau, age, terms, k) == pytest.approx(expected, rel=1e-9)


def test_weibull_scale_gives_the_mean() -> None:
    lam = model.weibull_scale(1000.0, 0.7)
    assert lam * math.gamma(1 + 1 / 0.7) == pytest.approx(1000.0)
    assert model.job_mtbf(50000 * 3600, 16384) == pytest.approx(10986.3, rel=1e-4)


def test_hypothesis_draws_the_same_examples_every_run() -> None:
    """The suite's profile (tests/conftest.py) is derandomised unless ``explore`` is asked."""
    if os.environ.get("ADAPTD_HYPOTHESIS_PROFILE", "ci") == "ci":
        assert settings.default.derandomize and settings.default.database is None


# Every validated figure of every public function: (call, the name its error must
# start with, the value it must quote). The name is what the user looks up in the
# docs and the value is what they passed, so both are part of the contract.
NAMED_ERRORS = [
    (lambda: model.job_mtbf(0.0, 8), "gpu_mtbf_s", "0.0"),
    (lambda: model.job_mtbf(3600.0, 0), "gpus", "0"),
    (lambda: model.young_interval(-1.0, 10.0), "save_cost_s", "-1.0"),
    (lambda: model.young_interval(1.0, 0.0), "mtbf_s", "0.0"),
    (lambda: model.daly_interval(-1.0, 10.0), "save_cost_s", "-1.0"),
    (lambda: model.daly_interval(1.0, math.inf), "mtbf_s", "inf"),
    # the model's figures are refused once, where they are made into Terms
    (lambda: model.Terms(-2.0, 10.0), "save_cost_s", "-2.0"),
    (lambda: model.Terms(math.inf, 10.0), "save_cost_s", "inf"),
    (lambda: model.Terms(1.0, -10.0), "mtbf_s", "-10.0"),
    (lambda: model.Terms(1.0, 0.0), "mtbf_s", "0.0"),
    (lambda: model.Terms(1.0, math.inf), "mtbf_s", "inf"),
    (lambda: model.Terms(1.0, 10.0, latency_s=-3.0), "latency_s", "-3.0"),
    (lambda: model.Terms(1.0, 10.0, restart_s=math.nan), "restart_s", "nan"),
    (lambda: model.Terms(1.0, 10.0, blocking_s=-0.5), "blocking_s", "-0.5"),
    # and what each function asks beyond them
    (lambda: model.waste_fraction(0.0, model.Terms(1.0, 10.0)), "interval_s", "0.0"),
    (lambda: model.waste_approx(0.0, model.Terms(1.0, 10.0)), "interval_s", "0.0"),
    (lambda: model.waste_approx(math.nan, model.Terms(1.0, 10.0)), "interval_s", "nan"),
    (lambda: model.optimal_interval(model.Terms(0.0, 10.0)), "save_cost_s", "0.0"),
    (lambda: model.weibull_scale(0.0, 0.7), "mean_s", "0.0"),
    (lambda: model.weibull_scale(100.0, 0.0), "weibull shape", "0.0"),
    (lambda: model.weibull_interval(-1.0, model.Terms(1.0, 10.0), 0.7), "age_s", "-1.0"),
    (lambda: model.weibull_interval(0.0, model.Terms(0.0, 10.0), 0.7), "save_cost_s", "0.0"),
    (lambda: model.weibull_interval(0.0, model.Terms(1.0, 10.0), -0.7), "weibull shape", "-0.7"),
    (lambda: model.Terms(1.0, 10.0, restart_s=-5.0), "restart_s", "-5.0"),
]


def test_terms_are_one_frozen_value_with_the_easily_swapped_figures_by_name() -> None:
    terms = model.Terms(30.0, 11000.0, restart_s=600.0)
    assert terms.blocked_s == 30.0  # a synchronous save blocks the loop for all of δ
    assert model.Terms(30.0, 11000.0, blocking_s=0.0).blocked_s == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        terms.mtbf_s = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        model.Terms(30.0, 11000.0, 100.0, 600.0)  # type: ignore[misc]  # L, R by name only


@pytest.mark.parametrize(("call", "name", "value"), NAMED_ERRORS)
def test_each_invalid_figure_is_named_with_its_value(call, name, value) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be .*, got {value}$"):
        call()


def test_one_gpu_is_a_job_of_one_and_its_mtbf_is_the_gpus() -> None:
    assert model.job_mtbf(3600.0, 1) == 3600.0
    assert model.job_mtbf(3600.0, 2) == 1800.0


# (τ, δ, M, L, R, b) -> expected waste, worked by hand from the renewal formula
# E = (1 − e^(−(τ+δ)/M)) · M · e^((R + τ + max(L, b))/M), waste = 1 − τ/E.
WASTE = [
    # defaults: L = 0, R = 0, b = δ (a synchronous save): Daly's M·(e^((τ+δ)/M) − 1)
    # E = 11000 · (e^(830/11000) − 1) = 11000 · 0.0783744 = 862.118; 1 − 800/862.118
    ((800.0, 30.0, 11000.0), {}, 0.0720510),
    # b = 0, L = 0: an async save whose write is durable at once rolls back nothing more:
    # E = (1 − e^(−0.0754545)) · 11000 · e^(800/11000) = 0.0726790 · 11000 · 1.0754367
    ((800.0, 30.0, 11000.0), {"blocking_s": 0.0}, 0.0695167),
    # R = 600 adds e^(600/11000) = 1.0560583 to Daly's E: 862.118 · 1.0560583 = 910.447
    ((800.0, 30.0, 11000.0), {"restart_s": 600.0}, 0.1213107),
    # L = 100 > b = 20 sets the exponent: e^((600 + 800 + 100)/11000) = 1.1461038
    (
        (800.0, 30.0, 11000.0),
        {"latency_s": 100.0, "restart_s": 600.0, "blocking_s": 20.0},
        0.1268846,
    ),
    # τ = M/2: E = 7200 · (e^(3720/7200) − 1) = 7200 · 0.676453 = 4870.46
    ((3600.0, 120.0, 7200.0), {}, 0.2608255),
    # a job that never finishes: e^(exponent) past what a float holds
    ((1e6, 30.0, 1000.0), {}, 1.0),
    ((10.0, 30.0, 1.0), {"restart_s": 800.0}, 1.0),
]


@pytest.mark.parametrize(("args", "kwargs", "waste"), WASTE)
def test_waste_fraction_matches_hand_computed_values(args, kwargs, waste) -> None:
    tau, delta, m = args
    assert model.waste_fraction(tau, model.Terms(delta, m, **kwargs)) == pytest.approx(
        waste, abs=1e-7
    )


def test_waste_approx_is_the_first_order_sum() -> None:
    # δ/τ + (τ/2 + L + R)/M = 30/800 + (400 + 100 + 600)/11000 = 0.0375 + 0.1
    terms = model.Terms(30.0, 11000.0, latency_s=100.0, restart_s=600.0)
    assert model.waste_approx(800.0, terms) == pytest.approx(0.1375)
    # defaults L = R = 0: 0.0375 + 400/11000
    assert model.waste_approx(800.0, model.Terms(30.0, 11000.0)) == pytest.approx(
        0.0375 + 400 / 11000
    )


@settings(max_examples=200)
@given(delta=st.floats(min_value=0.0, max_value=1e7), mtbf=positive)
def test_daly_never_saves_less_often_than_young(delta, mtbf) -> None:
    """Daly − Young = Young·(√x/3 + x/9) − δ = −(4/3)·M·x + (2/9)·M·x^1.5 < 0 for
    x = δ/2M < 1, and beyond that Daly's τ = M is below Young's √(2δM) ≥ 2M."""
    assert model.daly_interval(delta, mtbf) <= model.young_interval(delta, mtbf) * (1 + 1e-12)


def test_weibull_shape_must_be_positive_even_where_the_mean_is_fine() -> None:
    with pytest.raises(ValueError, match="weibull shape must be > 0, got 0"):
        model.weibull_scale(100.0, 0)


def test_an_interval_no_job_survives_costs_infinitely_much() -> None:
    # shape 2, M = 100 s: surviving 10^7 s has probability e^(−10^10), exactly 0.0
    assert model.weibull_cost_ratio(1e7, 0.0, model.Terms(0.0, 100.0), 2.0) == math.inf


def test_the_survival_integral_keeps_its_precision_far_in_the_tail() -> None:
    """A job that has survived ~200 scales (hazard (t/λ)^k ≈ 40 at shape 0.7): the lower
    incomplete gammas are both 1.0 in floating point there, the upper ones are not."""
    from scipy.integrate import quad

    k, m, tau, delta = 0.7, 40000.0, 900.0, 20.0
    lam = model.weibull_scale(m, k)
    for age in (194 * lam, 3.0 * lam, 0.01 * lam):

        def surv(x: float, age: float = age) -> float:
            return math.exp((age / lam) ** k - ((age + x) / lam) ** k)

        integral, _ = quad(surv, 0, tau + delta, epsabs=0, epsrel=1e-12)
        p = surv(tau + delta)
        expected = integral / (p * tau)
        got = model.weibull_cost_ratio(tau, age, model.Terms(delta, m), k)
        assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("x", "rounded"),
    [(0.0, 0.0), (123456.0, 123500.0), (0.00123456, 0.001235), (-98765.4, -98770.0), (1.0, 1.0)],
)
def test_weibull_inputs_are_rounded_to_four_significant_digits(x, rounded) -> None:
    """So that decisions a few seconds apart reuse the cached optimum."""
    assert model._round_sig(x) == rounded


def test_ages_equal_to_four_digits_share_one_interval_and_others_do_not() -> None:
    terms, k = model.Terms(22.0, 43945.0), 0.7
    same = {model.weibull_interval(a, terms, k) for a in (12341.0, 12344.0, 12338.0)}
    assert len(same) == 1
    assert model.weibull_interval(12310.0, terms, k) != model.weibull_interval(12340.0, terms, k)


def _survival_quad(age: float, window: float, lam: float, k: float) -> float:
    """∫₀^w S(a+x)/S(a) dx by adaptive quadrature, split where the hazard at the age
    says the integrand has fallen by e, e^10 and e^100 (so no decay is stepped over)."""
    from scipy.integrate import quad

    ha = (age / lam) ** k
    hazard = k / lam * (age / lam) ** (k - 1) if age > 0 else 1 / lam
    points = [c / hazard for c in (1, 10, 100) if c / hazard < window]
    integral, _ = quad(
        lambda x: math.exp(ha - ((age + x) / lam) ** k),
        0,
        window,
        epsabs=0,
        epsrel=1e-13,
        limit=500,
        points=points or None,
    )
    return integral


@pytest.mark.parametrize("k", [0.7, 2.0, 20.0])
@pytest.mark.parametrize("hazard", [650.0, 705.0, 800.0, 3000.0])
def test_the_cost_ratio_holds_past_a_cumulative_hazard_of_700(k, hazard) -> None:
    """Where e^H(a) no longer fits a float (a wearing-out job, shape 2, 26.5 scales old)
    the integral must not collapse to 0: it is the mean time to the next failure."""
    m = 43945.0
    lam = model.weibull_scale(m, k)
    age = lam * hazard ** (1 / k)
    rate = k / lam * hazard ** ((k - 1) / k)  # the hazard at that age, per second
    for tau in (0.5 / rate, 5 / rate):
        window = tau + 0.01 / rate
        p = math.exp(hazard - ((age + window) / lam) ** k)
        expected = _survival_quad(age, window, lam, k) / (p * tau)
        got = model.weibull_cost_ratio(tau, age, model.Terms(0.01 / rate, m), k)
        assert got == pytest.approx(expected, rel=1e-8)


def test_a_wearing_out_job_saves_more_often_the_older_it_gets() -> None:
    """Shape 2: the hazard grows with age, so the interval shrinks steadily; it must not
    jump to the search's upper bound once the cumulative hazard passes 700 (26.5 scales)."""
    delta, m = 22.0, 43945.0
    lam = model.weibull_scale(m, 2.0)
    terms = model.Terms(delta, m)
    taus = [model.weibull_interval(f * lam, terms, 2.0) for f in (5, 20, 26, 26.6, 27, 30, 40)]
    assert taus == sorted(taus, reverse=True)
    assert taus[-1] < model.daly_interval(delta, m)


def test_the_survival_integral_keeps_its_precision_right_after_a_failure() -> None:
    """At age 0 a short window's integral is the difference of two lower incomplete
    gammas near 0; taken from the upper ones (both near 1) it would keep ~7 digits."""
    for k in (0.7, 2.0, 3.0):
        lam = model.weibull_scale(40000.0, k)
        for window in (1e-3, 1e-2, 1.0, 10.0):
            expected = _survival_quad(0.0, window, lam, k)
            assert model._survival_integral(0.0, window, lam, k) == pytest.approx(
                expected, rel=1e-12
            )


@pytest.mark.parametrize(
    ("age", "delta", "m", "restart"),
    [(0.0, 2.0, 500.0, None), (0.0, 30.0, 20000.0, None), (60.0, 22.0, 43950.0, 300.0)],
)
def test_the_weibull_interval_minimises_the_cost_ratio(age, delta, m, restart) -> None:
    """Against an independent, tighter search; no restart given means a free restart."""
    from scipy.optimize import minimize_scalar

    r = 0.0 if restart is None else restart
    res = minimize_scalar(
        lambda lt: model.weibull_cost_ratio(
            math.exp(lt), age, model.Terms(delta, m, restart_s=r), 0.7
        ),
        bounds=(math.log(1e-3), math.log(20 * m)),
        method="bounded",
        options={"xatol": 1e-9},
    )
    kwargs = {} if restart is None else {"restart_s": restart}
    got = model.weibull_interval(age, model.Terms(delta, m, **kwargs), 0.7)
    assert got == pytest.approx(math.exp(res.x), rel=1e-3)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (8.0, "8 s"),
        (119.0, "119 s"),
        (1668.0, "27.8 min"),
        (175_000.0, "48.6 h"),
        (3_600_000.0, "1000 h"),  # 1000 h itself in whole hours: 3 figures say 1e+03 h
        (1.824e8, "50667 h"),
        (math.inf, "never"),
    ],
)
def test_a_reason_says_a_duration_without_exponent_notation(seconds: float, text: str) -> None:
    assert model.duration_text(seconds) == text
