"""``tiers`` and the default stack's two-tier branch: job state in, decision out (issues 23
and 24), with the two-tier figures worked by hand in tests/model/test_multilevel.py."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from adaptd.core import model, multilevel
from adaptd.core.policy import PolicyError, parse
from adaptd.core.snapshot import Decision, JobState, Snapshot, StorageSample, same_saves
from adaptd.policies import Daly, Guards, IoAware, Tiers
from adaptd.policies.default import Default
from adaptd.policies.tiers import MAX_COVERAGE, failure_rates

# Case B of tests/model/test_multilevel.py (δ₁ = 1, δ₂ = 30, λ_p = 1/2000, λ_h = 1/20000:
# k = 17, τ = 63.9989 s, first-order 0.0863985) with L₁ = 2, R₁ = 120, L₂ = 60, R₂ = 600,
# which add 1/2000·(2 + 120) + 1/20000·(60 + 600) = 0.061 + 0.033 to the waste and move
# neither τ nor k. 1 s steps: every 64 steps, the next one after the save at 990.
TWO = dict(
    job="a",
    step=1000,
    time=5000.0,
    step_time_s=1.0,
    last_save_step=990,
    last_save_time=4990.0,
    save_cost_s=30.0,
    save_latency_s=60.0,
    restore_s=600.0,
    mtbf_s=1818.0,
    local_tier=True,
    local_save_cost_s=1.0,
    local_latency_s=2.0,
    local_restore_s=120.0,
    process_mtbf_s=2000.0,
    host_mtbf_s=20000.0,
    last_durable_save_step=500,
)
TAU_B = 63.99891066611057
WASTE_B = 0.08639852939924927 + 0.061 + 0.033
NONE = Snapshot(time=5000.0)


def job(**kw) -> JobState:
    return JobState(**{**TWO, **kw})


def test_two_tiers_decided_from_the_jobs_figures() -> None:
    d = Tiers().decide(NONE, job())
    assert d == Decision(
        next_step=990 + 64,
        every_steps=64,
        durable_every=17,
        policy="tiers",
        interval_s=pytest.approx(TAU_B, rel=1e-12),
        waste=pytest.approx(WASTE_B, rel=1e-9),
        reason="two tiers: local every 64 s (δ₁=1 s), durable every 17th (δ₂=30 s); uncovered "
        "failures: process every 33.3 min, host every 5.56 h → waste 18.0%",
    )
    # every 17th save of 64 steps: the one at least 1088 steps after the durable one at 500
    assert [d.durable_at(s, 500) for s in (1054, 1587, 1588, 1652)] == [False, False, True, True]


def test_without_a_local_tier_or_coverage_it_is_dalys_answer() -> None:
    j = job(local_tier=False, process_mtbf_s=None, host_mtbf_s=None, mtbf_s=10986.0)
    d, daly = Tiers().decide(NONE, j), Daly().decide(NONE, j)
    assert (d.next_step, d.every_steps, d.durable_every) == (daly.next_step, daly.every_steps, None)
    assert d.interval_s == pytest.approx(daly.interval_s, rel=1e-12)
    assert d.waste == pytest.approx(daly.waste, rel=1e-12)
    # and the default stack gives such a job exactly what it gave before
    assert Default().decide(NONE, j) == Guards(inner=IoAware(inner=Daly())).decide(NONE, j)


def test_an_unmeasured_local_save_sends_every_save_to_both_tiers() -> None:
    d = Tiers().decide(NONE, job(local_save_cost_s=None))
    tau = model.daly_interval(30.0, 1 / (1 / 2000 + 1 / 20000))
    assert (d.every_steps, d.durable_every) == (math.ceil(tau), 1)
    assert d.interval_s == pytest.approx(tau, rel=1e-12)
    assert d.reason.startswith("one tier: every ")
    assert d.reason.endswith("; no local save measured yet: saving to both tiers")


@pytest.mark.parametrize(("local", "every"), [(True, 1), (False, None)])
def test_before_any_save_it_probes_to_both_tiers(local, every) -> None:
    d = Tiers(probe_s=120.0).decide(NONE, job(save_cost_s=None, local_tier=local))
    # min(probe 120 s, a tenth of M = 181.8 s) after the save at 990
    assert (d.next_step, d.every_steps, d.durable_every, d.policy) == (1110, 120, every, "tiers")
    assert d.reason == "no save measured yet: probing after 120s"


def test_no_step_time_no_plan() -> None:
    d = Tiers().decide(NONE, job(step_time_s=None))
    assert (d.next_step, d.every_steps, d.durable_every) == (None, None, None)
    assert d.reason.endswith(": waiting for a step time")


def test_coverage_plans_for_the_uncovered_failures_and_adds_the_covered_cost() -> None:
    j = job(jit_coverage=0.75, jit_save_s=20.0)
    rates = failure_rates(j)
    # λ = (1 − 0.75)/M per class; a covered failure: half a step, the save, the restart
    # weighted by class: (120/2000 + 600/20000)/(1/2000 + 1/20000) = 163.64 s
    restart = (120 / 2000 + 600 / 20000) / (1 / 2000 + 1 / 20000)
    assert (rates.process, rates.host, rates.covered, rates.covered_cost_s) == (
        pytest.approx(0.25 / 2000),
        pytest.approx(0.25 / 20000),
        pytest.approx(0.75 * (1 / 2000 + 1 / 20000)),
        pytest.approx(0.5 + 20.0 + restart),
    )
    d = Tiers().decide(NONE, j)
    want = multilevel.plan(
        multilevel.Tier(30.0, 60.0, 600.0), rates, multilevel.Tier(1.0, 2.0, 120.0)
    )
    assert (d.interval_s, d.durable_every, d.waste) == (
        want.interval_s,
        want.durable_every,
        want.waste,
    )
    assert "(75% covered just in time)" in d.reason
    # fewer uncovered failures: longer intervals than without coverage
    assert d.interval_s > TAU_B


def test_coverage_is_capped_and_unknown_classes_are_host_failures() -> None:
    capped = failure_rates(job(jit_coverage=0.999))
    assert capped.process == pytest.approx((1 - MAX_COVERAGE) / 2000)
    assert failure_rates(job(jit_coverage=0.999), max_coverage=0.5).process == pytest.approx(
        0.5 / 2000
    )
    # classes not learned: every failure a lost host, M = mtbf_s
    r = failure_rates(job(process_mtbf_s=None, host_mtbf_s=None))
    assert (r.process, r.host, r.covered) == (0.0, 1 / 1818.0, 0.0)
    assert failure_rates(job(process_mtbf_s=None, host_mtbf_s=None, mtbf_s=None)) is None
    # an in-place restart never seen lasts as long as one from durable storage
    no_r1 = failure_rates(job(local_restore_s=None, jit_coverage=0.5))
    assert no_r1.covered_cost_s == pytest.approx(0.5 + 600.0)
    # a job with local saves but classes unknown plans one tier: no failure spares the host
    d = Tiers().decide(NONE, job(process_mtbf_s=None, host_mtbf_s=None))
    assert d.durable_every is None


def test_the_default_stack_routes_tiered_and_covered_jobs_to_tiers() -> None:
    assert Default().decide(NONE, job()).policy == "tiers"
    assert Default().decide(NONE, job(local_tier=False, jit_coverage=0.5)).policy == "tiers"
    assert Default().decide(NONE, job(local_tier=False)).policy == "daly"
    assert parse("tiers") == Tiers()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"probe_s": 0}, "tiers: probe_s must be > 0 seconds, got 0"),
        ({"max_durable_every": 0}, "tiers: max_durable_every must be >= 1, got 0"),
        ({"max_coverage": 1.0}, r"tiers: max_coverage must be a share in \[0, 1\), got 1.0"),
    ],
)
def test_bad_settings_are_named(kwargs, message) -> None:
    with pytest.raises(PolicyError, match=message):
        Tiers(**kwargs)


# ------------------------------------------------------------------ the decision


@pytest.mark.parametrize(
    ("decision", "step", "last", "durable"),
    [
        (Decision(next_step=10, every_steps=10), 10, 0, True),  # one tier: every save
        (Decision(next_step=10, every_steps=10, durable_every=3), 29, 0, False),
        (Decision(next_step=10, every_steps=10, durable_every=3), 30, 0, True),
        (Decision(next_step=10, every_steps=10, durable_every=3), 31, 0, True),  # deferred
        (Decision(next_step=10, every_steps=10, durable_every=3), 55, 30, False),
        (Decision(next_step=None, urgent=True, durable_every=3, every_steps=10), 31, 30, True),
        (Decision(next_step=40, durable_every=3), 40, 30, True),  # no grid
    ],
)
def test_which_saves_are_made_durable(decision, step, last, durable) -> None:
    assert decision.durable_at(step, last) is durable


def test_a_changed_durable_cadence_is_a_changed_plan() -> None:
    a = Decision(next_step=100, every_steps=100, durable_every=10)
    assert same_saves(a, a, 50)
    assert not same_saves(a, dataclasses.replace(a, durable_every=None), 50)
    assert not same_saves(dataclasses.replace(a, durable_every=None), a, 50)
    assert not a.same_plan(dataclasses.replace(a, durable_every=11))
    assert not same_saves(a, dataclasses.replace(a, durable_every=11), 50)
    assert same_saves(a, dataclasses.replace(a, durable_every=11), 50, tolerance=0.1)
    assert not same_saves(a, dataclasses.replace(a, durable_every=12), 50, tolerance=0.1)


def test_guards_floor_a_two_tier_plan_by_the_local_latency() -> None:
    @dataclasses.dataclass(frozen=True)
    class Every20:
        durable_every: int | None

        def decide(self, snapshot, j):
            return Decision(next_step=j.step + 1, every_steps=20, durable_every=self.durable_every)

    j = job(local_latency_s=50.0, save_latency_s=500.0, save_in_flight=False)
    two = Guards(inner=Every20(4)).decide(NONE, j)
    assert (two.next_step, two.every_steps, two.durable_every) == (1040, 50, 4)
    assert two.reason.endswith("floored: a save takes 50s to be durable")
    one = Guards(inner=Every20(None)).decide(NONE, j)
    assert (one.next_step, one.every_steps) == (1490, 500)


def test_io_aware_never_defers_a_save_that_stays_local() -> None:
    busy = Snapshot(
        time=5000.0,
        storage=(StorageSample(target="nfs", mountpoint="/nfs", busy_fraction=0.95),),
    )
    later = dict(step=2000, last_save_step=1990, storage_target="nfs")
    # the next save (2054) is local: not deferred, whatever the target's load
    local = IoAware(inner=Tiers()).decide(busy, job(**later, last_durable_save_step=1990))
    assert local.next_step == 2054 and "deferred" not in local.tags
    # 1554 steps after the durable save at 500, at least 17 × 64: due durable, deferred
    durable = IoAware(inner=Tiers()).decide(busy, job(**later))
    assert "deferred" in durable.tags and durable.next_step > 2054


def test_a_two_tier_plan_never_asks_for_saves_closer_together_than_it_states() -> None:
    policy = parse("default")
    rng = random.Random(5)
    seen = set()
    for _ in range(300):
        st = 10 ** rng.uniform(-2, 1.2)
        j = job(
            step_time_s=st,
            save_cost_s=10 ** rng.uniform(-1, 2),
            local_save_cost_s=10 ** rng.uniform(-3, 0.5),
            save_latency_s=10 ** rng.uniform(-1, 2.5),
            local_latency_s=10 ** rng.uniform(-2, 1),
            process_mtbf_s=10 ** rng.uniform(2, 6),
            host_mtbf_s=10 ** rng.uniform(3, 7),
            jit_coverage=rng.choice([0.0, 0.5, 0.9]),
            save_in_flight=rng.random() < 0.3,
        )
        d = policy.decide(NONE, j)
        seen.add(d.durable_every is None)
        if d.every_steps and d.interval_s is not None:
            assert d.every_steps * st >= d.interval_s * (1 - 1e-9), (st, d)
    assert seen == {True, False}  # both one and two tiers were chosen
