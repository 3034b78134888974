"""The references the learning policies are measured against: schedules chosen with the
scenario's true figures, known in advance (``adaptd simulate --policy oracle``).

- One tier (``oracle``, ``oracle:tiers=1``): Daly's interval for the true δ and the
  MTBF of the failures no just-in-time save covers, M/(1 − ``peer_share``) (the share
  capped at :data:`adaptd.policies.tiers.MAX_COVERAGE`, as the policy caps it); without
  just-in-time saves, the oracle there has always been.
- Two tiers (``oracle`` on a scenario with ``[checkpoint.local]``, ``oracle:tiers=2``):
  the (local interval, durable cadence) of least expected waste, searched over whole
  steps on the exact steady state (:mod:`adaptd.sim.theory_tiers`) where it applies, for
  the uncovered failures; elsewhere (Weibull failures, storage phases, a trace) the
  first-order optimum of :func:`adaptd.core.multilevel.plan` with the true figures.
- ``jit=off``: the same run without just-in-time saves (``peer_share`` 0; the failure
  times and classes stay those of the seed).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from adaptd.core import multilevel
from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.daly import Daly
from adaptd.policies.interval import due_step, steps_ceil
from adaptd.policies.tiers import MAX_COVERAGE
from adaptd.sim import theory_tiers
from adaptd.sim.scenario import Scenario

__all__ = [
    "ORACLE",
    "Oracle",
    "TierOracle",
    "best_tiers",
    "oracle",
]

#: Spec of the policy that knows the scenario's true figures in advance.
ORACLE = "oracle"


@dataclass(frozen=True)
class Oracle:
    """Daly with the scenario's true δ and M, counting its interval in steps of the
    true step time: the reference the learning policies are measured against.

    Without the true step time the oracle would plan with the tracker's estimate,
    which a slow first step (a compile) distorts; it would then measure the
    estimator, not the interval.
    """

    daly: Daly
    step_time_s: float

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        return self.daly.decide(snapshot, replace(job, step_time_s=self.step_time_s))


@dataclass(frozen=True)
class TierOracle:
    """A fixed two-tier schedule: a local save every ``every_steps`` steps (counted, as
    the interval policies count, from the newest save or the resume), every
    ``durable_every``-th made durable."""

    every_steps: int
    durable_every: int
    reason: str = ""

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        return Decision(
            next_step=due_step(job, self.every_steps),
            every_steps=self.every_steps,
            durable_every=self.durable_every,
            reason=self.reason,
            policy=ORACLE,
        )


def oracle(settings: dict[str, str], scenario: Scenario) -> tuple[Oracle | TierOracle, Scenario]:
    """The oracle of ``settings`` (``tiers``: 1 or 2; ``jit``: on or off) for
    ``scenario``, and the scenario its runs play (without just-in-time saves for
    ``jit=off``). Raises :class:`~adaptd.core.policy.PolicyError` naming a bad setting."""
    unknown = set(settings) - {"tiers", "jit"}
    if unknown:
        raise PolicyError(
            f"oracle has no setting {', '.join(sorted(unknown))}; settings: tiers, jit"
        )
    jit = settings.get("jit", "on")
    if jit not in ("on", "off"):
        raise PolicyError(f"oracle: jit must be on or off, got {jit!r}")
    tiers = settings.get("tiers", "2" if scenario.local is not None else "1")
    if tiers not in ("1", "2"):
        raise PolicyError(f"oracle: tiers must be 1 or 2, got {tiers!r}")
    if tiers == "2" and scenario.local is None:
        raise PolicyError(
            f"oracle: tiers=2 needs a local tier, and scenario {scenario.name!r} has no "
            "[checkpoint.local]"
        )
    world = scenario if jit == "on" else replace(scenario, peer_share=0.0)
    if tiers == "1":
        keep = 1.0 - min(world.peer_share, MAX_COVERAGE)
        daly = Daly(save_cost_s=world.save_cost_s, mtbf_s=world.job_mtbf_s / keep)
        return Oracle(daly, world.step_time_s), world
    every, k, how = best_tiers(world)
    return TierOracle(every, k, how), world


@functools.lru_cache(maxsize=64)
def best_tiers(s: Scenario) -> tuple[int, int, str]:
    """(steps between local saves, durable every k-th, how they were found) of least
    expected waste for ``s``'s uncovered failures (the module doc)."""
    keep = 1.0 - min(s.peer_share, MAX_COVERAGE)
    uncovered = replace(s, peer_share=0.0, mtbf_gpu_hours=s.mtbf_gpu_hours / keep)
    local = s.local
    assert local is not None
    lam = 1.0 / uncovered.job_mtbf_s
    rates = multilevel.Rates(process=s.process_share * lam, host=(1 - s.process_share) * lam)
    tier1 = multilevel.Tier(local.save_cost_s, local.latency_s, local.restore_s)
    tier2 = multilevel.Tier(s.save_cost_s, s.latency_s, s.restore_s)
    if rates.process > 0:
        k0, _, tau0 = multilevel.best_every(tier1, tier2, rates)
    else:  # no process failures: every save durable
        k0, tau0 = 1, multilevel.interval_for(1, tier1, tier2, rates)
    every0 = steps_ceil(tau0, s.step_time_s) or 1
    if not theory_tiers.covers(uncovered):
        return every0, k0, "first-order optimum with the true figures"
    best = (math.inf, every0, k0)
    for k in range(max(1, k0 - max(3, k0 // 3)), k0 + max(3, k0 // 3) + 1):
        every, cost = _least(lambda e, k=k: _cost(uncovered, e, k), every0)
        best = min(best, (cost, every, k))
    return best[1], best[2], "searched on the exact steady state"


def _cost(s: Scenario, every: int, k: int) -> float:
    """Expected wall time per second of kept work (inf where the form does not apply)."""
    try:
        return 1.0 / theory_tiers.steady_state(s, every, k).goodput
    except ValueError:
        return math.inf


def _least(f, guess: int) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """The whole number x of least f(x) between ``guess``/3 and 3 × ``guess`` (f
    unimodal there): a golden-section search on integers."""
    lo, hi = max(1, guess // 3), max(3, 3 * guess)
    cache: dict[int, float] = {}

    def at(x: int) -> float:
        if x not in cache:
            cache[x] = f(x)
        return cache[x]

    while lo < hi - 2:
        a = lo + round((hi - lo) * 0.382)
        b = lo + round((hi - lo) * 0.618)
        if a == b:
            b = a + 1
        if at(a) <= at(b):
            hi = b
        else:
            lo = a
    x = min(range(lo, hi + 1), key=lambda v: (at(v), v))
    return x, at(x)
