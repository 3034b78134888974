"""The interval model: how often to save so that the least training time is wasted.

Pure functions of a few figures, no clock and no I/O, shared by the policies, the
simulator and the tests. Notation (see DESIGN.md, "The interval model"):

- ``δ`` (``save_cost_s``): what one save costs the job, blocking time plus the
  extra step time spent while the asynchronous write runs;
- ``L`` (``latency_s``): from the save call until the checkpoint is durable;
- ``M`` (``mtbf_s``): the job's mean time between failures;
- ``R`` (``restart_s``): restart-and-restore time after a failure;
- ``τ`` (``interval_s``): compute time between two saves.

scipy is imported inside the Weibull functions only, so the daemon does not pay
for it unless a Weibull policy runs.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from functools import lru_cache

__all__ = [
    "HOUR",
    "Terms",
    "async_floor",
    "check_non_negative",
    "check_positive",
    "daly_interval",
    "duration_text",
    "job_mtbf",
    "optimal_interval",
    "waste_approx",
    "waste_fraction",
    "weibull_cost_ratio",
    "weibull_interval",
    "weibull_scale",
    "young_interval",
]

#: Seconds in an hour, for the GPU-hour figures users quote.
HOUR = 3600.0


def duration_text(seconds: float) -> str:
    """A duration as a decision's reason says it: ``8 s``, ``27.8 min``, ``48.6 h``,
    ``50667 h`` (3 significant figures below 1000 h, whole hours above: never exponent
    notation, as ``M=1.824e+08s`` was); ``inf`` says ``never``."""
    if math.isinf(seconds):
        return "never"
    if seconds >= 2 * HOUR:
        return f"{seconds / HOUR:.3g} h" if seconds < 1000 * HOUR else f"{seconds / HOUR:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def check_positive(name: str, value: float) -> None:
    """Raise :class:`ValueError` naming ``name`` unless ``value`` is finite and > 0 (seconds)."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")


def check_non_negative(name: str, value: float) -> None:
    """Raise :class:`ValueError` naming ``name`` unless ``value`` is finite and >= 0 (seconds)."""
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")


def job_mtbf(gpu_mtbf_s: float, gpus: int) -> float:
    """A job's MTBF: any of its GPUs failing interrupts it, so rates add up."""
    check_positive("gpu_mtbf_s", gpu_mtbf_s)
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    return gpu_mtbf_s / gpus


def young_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = √(2δM), the first-order optimum for exponential failures.

    Raises :class:`ValueError` for a negative cost or a non-positive MTBF.
    """
    check_non_negative("save_cost_s", save_cost_s)
    check_positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * save_cost_s * mtbf_s)


def daly_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Daly (2006, eq. 37): the higher-order optimum for exponential failures.

    τ = √(2δM)·[1 + ⅓√(δ/2M) + (1/9)(δ/2M)] − δ for δ < 2M, else τ = M (saves so
    costly that the best one can do is one per expected failure).
    """
    check_non_negative("save_cost_s", save_cost_s)
    check_positive("mtbf_s", mtbf_s)
    if save_cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_cost_s / (2.0 * mtbf_s)
    return (
        math.sqrt(2.0 * save_cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_cost_s
    )


def async_floor(interval_s: float, latency_s: float | None) -> float:
    """At most one save is in flight, so saves can come no closer than ``L``."""
    if latency_s is None:
        return interval_s
    return max(interval_s, latency_s)


@dataclass(frozen=True)
class Terms:
    """The figures an interval is weighed against, validated once: δ (``save_cost_s``)
    and M (``mtbf_s``), which set the optimum, and L (``latency_s``), R (``restart_s``)
    and b (``blocking_s``: the part of δ that blocks the loop; ``None``, all of it, a
    synchronous save), which only add waste. L, R and b are keyword-only: they are
    easy to swap.

    Raises :class:`ValueError` naming the figure and the value received: δ, L, R and
    b must be finite and >= 0 seconds, M finite and > 0 (a job that never fails has no
    interval to weigh: fall back to a fixed one).
    """

    save_cost_s: float
    mtbf_s: float
    _: KW_ONLY
    latency_s: float = 0.0
    restart_s: float = 0.0
    blocking_s: float | None = None

    def __post_init__(self) -> None:
        check_non_negative("save_cost_s", self.save_cost_s)
        check_positive("mtbf_s", self.mtbf_s)
        check_non_negative("latency_s", self.latency_s)
        check_non_negative("restart_s", self.restart_s)
        if self.blocking_s is not None:
            check_non_negative("blocking_s", self.blocking_s)

    @property
    def blocked_s(self) -> float:
        """b: what a save blocks the loop for, δ unless ``blocking_s`` says less."""
        return self.save_cost_s if self.blocking_s is None else self.blocking_s


def waste_fraction(interval_s: float, terms: Terms) -> float:
    """Expected fraction of wall time wasted with a fixed interval and exponential failures.

    Exact for the model the simulator implements (failures strike during compute,
    saves and restarts alike): a checkpoint captured at the save call is durable
    ``L`` later, so a failure before that rolls back one more interval. A renewal
    argument gives the expected wall time per interval of useful work::

        E = (1 − e^(−(τ+δ)/M)) · M · e^((R + τ + max(L, b))/M)

    where ``b`` is :attr:`Terms.blocked_s`. With ``L = b = δ`` this is Daly's
    ``M·e^(R/M)·(e^((τ+δ)/M) − 1)``. L and R only scale E by a constant, so, as
    Vaidya observed, they do not move the optimal τ; they only add waste.

    Returns ``1 − τ/E`` in [0, 1]; 1.0 when the job would (numerically) never finish.
    Raises :class:`ValueError` unless ``interval_s`` is finite and > 0.
    """
    check_positive("interval_s", interval_s)
    period = interval_s + terms.save_cost_s
    lost = max(terms.latency_s, terms.blocked_s)
    exponent = (terms.restart_s + interval_s + lost) / terms.mtbf_s
    if exponent > 700:
        return 1.0
    expected = -math.expm1(-period / terms.mtbf_s) * terms.mtbf_s * math.exp(exponent)
    return min(1.0, max(0.0, 1.0 - interval_s / expected))


def waste_approx(interval_s: float, terms: Terms) -> float:
    """First-order waste per unit time, δ/τ + (τ/2 + L + R)/M: the figure to report.

    Raises :class:`ValueError` unless ``interval_s`` is finite and > 0.
    """
    check_positive("interval_s", interval_s)
    at_risk = interval_s / 2.0 + terms.latency_s + terms.restart_s
    return terms.save_cost_s / interval_s + at_risk / terms.mtbf_s


def optimal_interval(terms: Terms) -> float:
    """The τ that minimises :func:`waste_fraction` for ``terms`` exactly (exponential
    failures); only δ and M matter, L, R and b only scale the waste.

    Daly's formula approximates this; tests compare the two. Uses a golden-section
    search on log τ, so it needs no scipy. Raises :class:`ValueError` when δ is 0
    (free saves: the optimum is to save all the time, no interval).
    """
    check_positive("save_cost_s", terms.save_cost_s)
    delta, mtbf = terms.save_cost_s, terms.mtbf_s

    def cost(log_tau: float) -> float:
        tau = math.exp(log_tau)
        # minimising (e^((τ+δ)/M) − 1)/τ is minimising the waste (L, R only scale it)
        return math.expm1((tau + delta) / mtbf) / tau

    lo = math.log(max(delta, mtbf) * 1e-6)
    hi = math.log(mtbf * 10)
    return math.exp(_golden(cost, lo, hi, tol=1e-10))


def _golden(f, lo: float, hi: float, tol: float) -> float:  # type: ignore[no-untyped-def]
    g = (math.sqrt(5) - 1) / 2
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    fc, fd = f(c), f(d)
    while hi - lo > tol:
        if fc < fd:
            hi, d, fd = d, c, fc
            c = hi - g * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + g * (hi - lo)
            fd = f(d)
    return (lo + hi) / 2


# --------------------------------------------------------------------------- Weibull


def weibull_scale(mean_s: float, shape: float) -> float:
    """The scale λ that gives a Weibull(shape) distribution the mean ``mean_s``."""
    check_positive("mean_s", mean_s)
    _check_shape(shape)
    return mean_s / math.gamma(1.0 + 1.0 / shape)


def _check_shape(shape: float) -> None:
    if not shape > 0:
        raise ValueError(f"weibull shape must be > 0, got {shape!r}")


def _survival_integral(age_s: float, window_s: float, scale: float, shape: float) -> float:
    """∫₀^w S(a+x)/S(a) dx for a Weibull survival S, via regularised incomplete gammas.

    With H(t) = (t/λ)^k and s = 1/k it is (λ/k)·e^H(a)·(Γ(s, H(a)) − Γ(s, H(a+w))).
    """
    from scipy.special import gammainc, gammaincc, hyperu

    s = 1.0 / shape
    ha = (age_s / scale) ** shape
    hb = ((age_s + window_s) / scale) ** shape
    if ha > 700.0:
        # e^H(a) overflows (and Γ(s, H) underflows) past here, for a job that has
        # survived a cumulative hazard of 700: shape 2 at 26.5 scales. Tricomi's
        # U(1 − s, 1 − s, x) = e^x·Γ(s, x) keeps the product in range.
        u = hyperu(1.0 - s, 1.0 - s, ha) - math.exp(ha - hb) * hyperu(1.0 - s, 1.0 - s, hb)
        return float(scale / shape * u)
    # far in the tail the upper functions keep their precision
    diff = gammainc(s, hb) - gammainc(s, ha) if ha < s else gammaincc(s, ha) - gammaincc(s, hb)
    return float(scale / shape * math.gamma(s) * diff * math.exp(ha))


def weibull_cost_ratio(interval_s: float, age_s: float, terms: Terms, shape: float) -> float:
    """Expected wall time per second of kept work for the next interval, given the age.

    The job has run ``age_s`` since its last failure. The next segment is τ of
    compute plus δ of saving; it keeps τ if no failure strikes in it, else it loses
    the time spent plus a restart. Per segment: ``E[wall] = ∫₀^(τ+δ) S_a + (1−p)·R``
    and ``E[kept] = p·τ``, with ``S_a(x) = S(a+x)/S(a)`` and ``p = S_a(τ+δ)``; δ, M
    and R are the ``terms``' (L and b are not part of this model). For shape 1 its
    minimiser is the exact exponential optimum that Daly approximates.
    """
    scale = weibull_scale(terms.mtbf_s, shape)
    window = interval_s + terms.save_cost_s
    ha = (age_s / scale) ** shape
    hb = ((age_s + window) / scale) ** shape
    p = math.exp(ha - hb)
    if p <= 0.0:
        return math.inf
    wall = _survival_integral(age_s, window, scale, shape) + (1.0 - p) * terms.restart_s
    return wall / (p * interval_s)


@lru_cache(maxsize=4096)
def _weibull_interval_cached(age_s: float, terms: Terms, shape: float) -> float:
    from scipy.optimize import minimize_scalar

    def cost(log_tau: float) -> float:
        return weibull_cost_ratio(math.exp(log_tau), age_s, terms, shape)

    delta, mtbf = terms.save_cost_s, terms.mtbf_s
    lo = math.log(max(delta * 1e-3, 1e-3))
    hi = math.log(max(mtbf * 20.0, delta * 10.0))
    res = minimize_scalar(cost, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    return float(math.exp(res.x))


def weibull_interval(age_s: float, terms: Terms, shape: float) -> float:
    """The interval that minimises :func:`weibull_cost_ratio` for a job of age ``age_s``.

    With shape < 1 (what fleet studies observe) the hazard falls with age, so the
    result is short right after a restart and grows as the job survives; with
    shape 1 it is the exponential optimum. Computed numerically (scipy's bounded
    Brent on log τ); δ, M, R (of ``terms``) and the age are rounded to 4 significant
    digits so that repeated decisions reuse the result. Raises :class:`ValueError` for
    a negative age, a δ of 0 or a shape <= 0 (the terms were checked when made).
    """
    check_non_negative("age_s", age_s)
    check_positive("save_cost_s", terms.save_cost_s)
    _check_shape(shape)
    r = _round_sig
    rounded = Terms(r(terms.save_cost_s), r(terms.mtbf_s), restart_s=r(terms.restart_s))
    return _weibull_interval_cached(r(age_s), rounded, r(shape))


def _round_sig(x: float, digits: int = 4) -> float:
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))
