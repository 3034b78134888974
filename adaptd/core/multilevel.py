"""Two tiers chosen together: a cheap local save every τ, a durable copy of every k-th.

Pure functions of a few figures, no clock and no I/O, like :mod:`adaptd.core.model`, whose
notation this extends (DESIGN.md, "Two tiers and just-in-time saves"):

- ``local`` (:class:`Tier`): δ₁, what a save to the local tier (host memory, local
  disk) costs the job; L₁, its latency until complete there; R₁, the restart in place
  from it;
- ``durable`` (:class:`Tier`): δ₂, what making a save durable costs the job on top of
  the local save (with no local tier: what a save costs); L₂; R₂, the restart
  elsewhere from durable storage;
- ``rates`` (:class:`Rates`): λ_p and λ_h, failures per second that no just-in-time
  save covers, of the *process* class (the host and its local tier survive: restart in
  place from the newest local save) and of the *host* class (the local tier is lost:
  restart elsewhere from the newest durable save); and the covered failures (a survivor
  saved the last completed step just in time), which cost a constant whatever the
  schedule.

The expected waste per unit time of "local every τ, durable every k-th" is, to first
order (Benoit, Cavelan, Le Fèvre, Robert and Sun, "Towards optimal multi-level
checkpointing", IEEE Trans. Computers 66(7), 2017; the same objective as Di, Bouguerra,
Bautista-Gomez and Cappello, "Optimization of multi-level checkpoint model for large
scale HPC applications", IPDPS 2014)::

    W(τ, k) = (δ₁ + δ₂/k)/τ + λ_p(τ/2 + L₁ + R₁) + λ_h(kτ/2 + L₂ + R₂) + λ_c·C

For a fixed k it is convex in τ, least at τ_k = √(2(δ₁ + δ₂/k)/(λ_p + kλ_h)); over a
real k the least is at k* = √(δ₂λ_p/(δ₁λ_h)), where the waste is
√(2δ₁λ_p) + √(2δ₂λ_h) plus the restarts: Benoit et al.'s Σ√(2λ_ℓC_ℓ), Young's formula
once per tier. :func:`plan` searches the whole k of 1 … ``max_every`` with the latency
floors (Vaidya: a save cannot come before the previous one of its tier is complete,
τ ≥ L₁ and kτ ≥ L₂, which clamp the convex τ_k) and against the single tier (every save
durable, every restart from durable storage, Daly's interval: exactly
:class:`adaptd.policies.Daly`'s answer), and keeps the least waste.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from adaptd.core import model

__all__ = [
    "MAX_DURABLE_EVERY",
    "Rates",
    "Tier",
    "TierPlan",
    "best_every",
    "interval_for",
    "optimal_every",
    "plan",
    "start_every",
    "waste",
]

#: The most local saves per durable one :func:`plan` considers: with host failures
#: (nearly) absent, k* grows without bound, and a durable copy every 100 local saves
#: keeps what a host failure loses finite.
MAX_DURABLE_EVERY = 100


def _check_rate(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number >= 0 per second, got {value!r}")


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier's figures, in seconds: ``save_cost_s`` (δ), ``latency_s`` (L: from the
    save call until the copy is complete in the tier) and ``restart_s`` (R: from a
    failure until training runs again from this tier's newest save).

    Raises :class:`ValueError` naming a figure that is negative or not finite.
    """

    save_cost_s: float
    latency_s: float = 0.0
    restart_s: float = 0.0

    def __post_init__(self) -> None:
        model.check_non_negative("save_cost_s", self.save_cost_s)
        model.check_non_negative("latency_s", self.latency_s)
        model.check_non_negative("restart_s", self.restart_s)


@dataclass(frozen=True, slots=True)
class Rates:
    """Failures per second of the job that no just-in-time save covers, by class, and
    the covered ones with what each costs (``covered_cost_s``: about one step, the
    just-in-time save and the restart; it does not depend on the schedule, so it only
    adds to the waste reported).

    Raises :class:`ValueError` for a negative or infinite rate, or when no uncovered
    failure is left (the interval would be infinite: plan for some).
    """

    process: float
    host: float
    covered: float = 0.0
    covered_cost_s: float = 0.0

    def __post_init__(self) -> None:
        _check_rate("process rate", self.process)
        _check_rate("host rate", self.host)
        _check_rate("covered rate", self.covered)
        model.check_non_negative("covered_cost_s", self.covered_cost_s)
        if not self.process + self.host > 0:
            raise ValueError(
                "no uncovered failures (process and host rates both 0): the interval would "
                "be infinite; plan for at least a small share of uncovered failures"
            )

    @classmethod
    def of(
        cls,
        process_mtbf_s: float | None,
        host_mtbf_s: float,
        coverage: float = 0.0,
        covered_cost_s: float = 0.0,
    ) -> Rates:
        """Rates from the job's MTBF per class (``None``: no process failures) and the
        share of failures a just-in-time save covers (independent of the class, as the
        simulator draws them): λ = (1 − coverage)/M for each class."""
        if not 0 <= coverage < 1:
            raise ValueError(f"coverage must be a share in [0, 1), got {coverage!r}")
        model.check_positive("host_mtbf_s", host_mtbf_s)
        total = 1.0 / host_mtbf_s
        process = 0.0
        if process_mtbf_s is not None:
            model.check_positive("process_mtbf_s", process_mtbf_s)
            process = 1.0 / process_mtbf_s
            total += process
        keep = 1.0 - coverage
        return cls(
            process=keep * process,
            host=keep / host_mtbf_s,
            covered=coverage * total,
            covered_cost_s=covered_cost_s,
        )

    @property
    def uncovered(self) -> float:
        return self.process + self.host


@dataclass(frozen=True, slots=True)
class TierPlan:
    """The chosen schedule: a save every ``interval_s`` of compute; ``durable_every``
    = k, every k-th of them made durable (``None``: one tier, every save durable);
    ``waste``, the first-order expected waste fraction; ``reason``, why, for people."""

    interval_s: float
    durable_every: int | None
    waste: float
    reason: str

    @property
    def durable_interval_s(self) -> float:
        """Compute time between two durable saves."""
        return self.interval_s * (self.durable_every or 1)


def interval_for(every: int, local: Tier, durable: Tier, rates: Rates) -> float:
    """τ_k: the local interval least wasteful for ``every`` = k, with the latency floors.

    τ_k = √(2(δ₁ + δ₂/k)/(λ_p + kλ_h)), at least L₁ and L₂/k. Raises
    :class:`ValueError` for k < 1.
    """
    if every < 1:
        raise ValueError(f"durable every must be >= 1 local saves, got {every}")
    cost = max(local.save_cost_s + durable.save_cost_s / every, 1e-6)  # as Daly's δ
    risk = rates.process + every * rates.host
    tau = math.sqrt(2.0 * cost / risk)
    return max(tau, local.latency_s, durable.latency_s / every)


def waste(interval_s: float, every: int, local: Tier, durable: Tier, rates: Rates) -> float:
    """W(τ, k), the first-order expected waste per unit time (module doc)."""
    model.check_positive("interval_s", interval_s)
    if every < 1:
        raise ValueError(f"durable every must be >= 1 local saves, got {every}")
    tau = interval_s
    return (
        (local.save_cost_s + durable.save_cost_s / every) / tau
        + rates.process * (tau / 2.0 + local.latency_s + local.restart_s)
        + rates.host * (every * tau / 2.0 + durable.latency_s + durable.restart_s)
        + rates.covered * rates.covered_cost_s
    )


def optimal_every(local: Tier, durable: Tier, rates: Rates) -> float:
    """k* = √(δ₂λ_p/(δ₁λ_h)), the real k of least waste without floors (``inf`` with no
    host failures or a free local save; 0 with no process failures)."""
    num = durable.save_cost_s * rates.process
    den = local.save_cost_s * rates.host
    if den == 0:
        return math.inf if num > 0 else 1.0
    return math.sqrt(num / den)


def start_every(local: Tier, durable: Tier, rates: Rates, max_every: int) -> int:
    """Where :func:`best_every` starts: the whole k nearest D°/τ°, the real optimum of the
    floored intervals apart (τ° = max(√(2δ₁/λ_p), L₁), D° = max(√(2δ₂/λ_h), L₂)); the
    most allowed without host failures. Needs λ_p > 0."""
    if rates.host <= 0:
        return max_every
    tau0 = max(math.sqrt(2.0 * max(local.save_cost_s, 1e-9) / rates.process), local.latency_s)
    d0 = max(math.sqrt(2.0 * max(durable.save_cost_s, 1e-9) / rates.host), durable.latency_s)
    return min(max(1, round(d0 / tau0)), max_every)


def best_every(
    local: Tier,
    durable: Tier,
    rates: Rates,
    max_every: int = MAX_DURABLE_EVERY,
    start: int | None = None,
) -> tuple[int, float, float]:
    """(k, W, τ_k) of the least :func:`waste` over the k of 1 … ``max_every``, each at
    its :func:`interval_for`.

    W is jointly convex in the local and the durable interval (τ, D = kτ) and the floors
    bound each on its own (τ ≥ L₁, D ≥ L₂), so the least waste along the rays D = kτ
    falls and then rises with k: a descent from ``start`` (default
    :func:`start_every`, next to the optimum) finds it in a few steps, from any start
    (tests hold it to the whole search). Ties keep the smaller k.
    """
    if max_every < 1:
        raise ValueError(f"max_every must be >= 1, got {max_every}")

    def at(k: int) -> tuple[float, float]:
        tau = interval_for(k, local, durable, rates)
        return waste(tau, k, local, durable, rates), tau

    if start is None:
        start = start_every(local, durable, rates, max_every)
    k = min(max(1, start), max_every)
    w, tau = at(k)
    for step in (-1, 1):
        while 1 <= k + step <= max_every:
            w2, tau2 = at(k + step)
            if w2 > w or (w2 == w and step > 0):
                break
            k, w, tau = k + step, w2, tau2
    return k, w, tau


def _single(durable: Tier, rates: Rates) -> tuple[float, float, float]:
    """(Daly's τ, its first-order waste, the first-order least waste) with every save
    durable and every uncovered failure restarting from durable storage."""
    mtbf = 1.0 / rates.uncovered
    delta = max(durable.save_cost_s, 1e-6)
    tau = model.daly_interval(delta, mtbf)
    covered = rates.covered * rates.covered_cost_s
    terms = model.Terms(delta, mtbf, latency_s=durable.latency_s, restart_s=durable.restart_s)
    reported = model.waste_approx(tau, terms) + covered
    best = model.waste_approx(model.young_interval(delta, mtbf), terms) + covered
    return tau, reported, best


def plan(
    durable: Tier,
    rates: Rates,
    local: Tier | None = None,
    *,
    max_every: int = MAX_DURABLE_EVERY,
) -> TierPlan:
    """The least wasteful schedule: one tier (Daly) or local every τ_k, durable every k-th.

    Without a local tier, or without process failures (a local save then protects
    nothing a durable one does not), the answer is the single tier's: Daly's interval
    for δ₂ and M = 1/(λ_p + λ_h), ``durable_every`` None. Otherwise each k of 1 …
    ``max_every`` is weighed at its :func:`interval_for` and the single tier at
    Young's interval (both first order, so the comparison is even), and the least
    :func:`waste` wins (ties: the single tier, then the smaller k). Raises
    :class:`ValueError` for ``max_every`` < 1.
    """
    if max_every < 1:
        raise ValueError(f"max_every must be >= 1, got {max_every}")
    tau1, reported1, best1 = _single(durable, rates)
    best_k, best_w, best_tau = 0, best1, tau1
    if local is not None and rates.process > 0:
        k, w, tau = best_every(local, durable, rates, max_every)
        if w < best_w:
            best_k, best_w, best_tau = k, w, tau
    if best_k == 0:
        return TierPlan(tau1, None, reported1, _single_reason(tau1, durable, rates, reported1))
    return TierPlan(
        best_tau, best_k, best_w, _two_reason(best_tau, best_k, local, durable, rates, best_w)
    )


def _mtbf(rate: float) -> str:
    return "never" if rate <= 0 else f"every {model.duration_text(1.0 / rate)}"


def _failures(rates: Rates) -> str:
    text = f"uncovered failures: process {_mtbf(rates.process)}, host {_mtbf(rates.host)}"
    if rates.covered > 0:
        share = rates.covered / (rates.covered + rates.uncovered)
        text += f" ({share:.0%} covered just in time)"
    return text


def _single_reason(tau: float, durable: Tier, rates: Rates, w: float) -> str:
    return (
        f"one tier: every {model.duration_text(tau)} (δ={durable.save_cost_s:.3g} s); "
        f"{_failures(rates)} → waste {w:.1%}"
    )


def _two_reason(
    tau: float, k: int, local: Tier | None, durable: Tier, rates: Rates, w: float
) -> str:
    assert local is not None
    nth = "every save" if k == 1 else f"every {_ordinal(k)}"
    return (
        f"two tiers: local every {model.duration_text(tau)} (δ₁={local.save_cost_s:.3g} s), "
        f"durable {nth} (δ₂={durable.save_cost_s:.3g} s); {_failures(rates)} → waste {w:.1%}"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
