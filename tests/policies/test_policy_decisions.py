"""Every field of every built-in policy's decision, and every setting it refuses.

tests/policies/test_policies.py checks when each policy saves; these check the rest of
what it answers: the policy named in the decision (``adaptd status`` and the metrics
label by it), the interval and the expected waste it reports, the reason an operator
reads, the probe before the first measured save, and the message of each bad setting.
Found missing by ``make mutants`` (docs/testing.md).
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from adaptd.core import model
from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import (
    Decision,
    FleetSample,
    GpuSample,
    HostSample,
    JobState,
    Snapshot,
    StorageSample,
)
from adaptd.policies import (
    Budget,
    Daly,
    Fixed,
    Guards,
    IoAware,
    Opportunistic,
    Phased,
    Risk,
    Weibull,
    Young,
)
from adaptd.policies.default import Default, FleetInterval
from adaptd.policies.opportunistic import idle_util
from adaptd.policies.weibull import interval_start_age

# δ = 8 s, L = 60 s, R = 120 s, M = 175,000 s, 1 s steps; the last save at step 900.
BASE = dict(
    job="a",
    step=1000,
    time=5000.0,
    step_time_s=1.0,
    last_save_step=900,
    last_save_time=4900.0,
    save_cost_s=8.0,
    save_latency_s=60.0,
    restore_s=120.0,
    mtbf_s=175_000.0,
    time_since_failure_s=3000.0,
    pids=(7,),
)


def job(**kw) -> JobState:
    return JobState(**{**BASE, **kw})


def snap(util: float | None = 0.95, **kw) -> Snapshot:
    gpu = GpuSample(index=0, uuid="g0", util_sm=util, pids=(7,), **kw)
    return Snapshot(time=5000.0, gpus=(gpu,))


NONE = Snapshot(time=5000.0)


# ---------------------------------------------------------------------- interval policies


def young_tau(j: JobState, delta: float, m: float) -> float:
    return model.young_interval(delta, m)


def daly_tau(j: JobState, delta: float, m: float) -> float:
    return model.daly_interval(delta, m)


def weibull_tau(j: JobState, delta: float, m: float) -> float:
    terms = model.Terms(delta, m, restart_s=j.restore_s or 0.0)
    return model.weibull_interval(interval_start_age(j), terms, 0.7)


INTERVAL = [
    (Young, "young", young_tau),
    (Daly, "daly", daly_tau),
    (Weibull, "weibull", weibull_tau),
]


def expected(name: str, tau: float, delta: float, m: float, j: JobState) -> Decision:
    every = math.ceil(tau / j.step_time_s - 1e-9)
    return Decision(
        next_step=max(900 + every, j.step + 1),
        every_steps=every,
        policy=name,
        interval_s=tau,
        waste=model.waste_approx(
            tau,
            model.Terms(delta, m, latency_s=j.save_latency_s or 0.0, restart_s=j.restore_s or 0.0),
        ),
        reason="",
    )


@pytest.mark.parametrize(("cls", "name", "tau_of"), INTERVAL)
@pytest.mark.parametrize(
    "kw", [{}, {"save_latency_s": None, "restore_s": None}, {"save_cost_s": 0.0}]
)
def test_an_interval_policy_reports_its_interval_and_its_expected_waste(
    cls, name, tau_of, kw
) -> None:
    j = job(**kw)
    delta = max(j.save_cost_s, 1e-6)
    tau = tau_of(j, delta, j.mtbf_s)
    d = cls().decide(NONE, j)
    assert d.reason  # checked below, per policy
    assert d == dataclasses.replace(expected(name, tau, delta, j.mtbf_s, j), reason=d.reason)


@pytest.mark.parametrize(("cls", "name", "tau_of"), INTERVAL)
def test_pinned_figures_replace_the_job_s_own(cls, name, tau_of) -> None:
    j = job()
    d = cls(save_cost_s=2.0, mtbf_s=40_000.0).decide(NONE, j)
    tau = tau_of(j, 2.0, 40_000.0)
    assert (d.interval_s, d.waste) == (
        pytest.approx(tau),
        pytest.approx(
            model.waste_approx(tau, model.Terms(2.0, 40_000.0, latency_s=60.0, restart_s=120.0))
        ),
    )
    # only one pinned: the other is still the job's
    assert cls(save_cost_s=2.0).decide(NONE, j).interval_s == pytest.approx(
        tau_of(j, 2.0, 175_000.0)
    )
    assert cls(mtbf_s=40_000.0).decide(NONE, j).interval_s == pytest.approx(
        tau_of(j, 8.0, 40_000.0)
    )


def test_the_reasons_show_the_figures() -> None:
    j = job()
    assert Young().decide(NONE, j).reason == "Young: √(2·8s·1.75e+05s) = 1673s"
    assert Daly().decide(NONE, j).reason == "Daly: δ=8 s, M=48.6 h → every 27.8 min"
    w = Weibull().decide(NONE, j)
    assert w.reason == (
        f"Weibull k=0.7: age 48.3 min, δ=8 s, M=48.6 h → every {model.duration_text(w.interval_s)}"
    )
    assert Budget().decide(NONE, j).reason == "budget 3.50%: δ=8s → every 228.6s"


@pytest.mark.parametrize(("cls", "name", "tau_of"), INTERVAL)
@pytest.mark.parametrize(
    ("kw", "wait"),
    [
        ({"save_cost_s": None}, 300.0),  # M = 175,000 s: the probe setting
        ({"save_cost_s": None, "mtbf_s": 2000.0}, 200.0),  # a tenth of a short MTBF
        ({"save_cost_s": None, "mtbf_s": None}, 300.0),
        ({"mtbf_s": None}, 300.0),  # δ known, M not: still probing
        ({"mtbf_s": 0.0}, 300.0),
    ],
)
def test_before_the_figures_are_known_a_policy_probes(cls, name, tau_of, kw, wait) -> None:
    d = cls().decide(NONE, job(**kw))
    assert d == Decision(
        next_step=900 + int(wait),
        every_steps=int(wait),
        reason=f"no save measured yet: probing after {wait:.3g}s",
        policy=name,
        interval_s=wait,
    )
    assert cls(probe_s=50.0).decide(NONE, job(**kw)).every_steps == 50


@pytest.mark.parametrize(("cls", "name", "tau_of"), INTERVAL)
def test_without_a_step_time_a_policy_waits_and_says_why(cls, name, tau_of) -> None:
    d = cls().decide(NONE, job(step_time_s=None))
    assert (d.next_step, d.policy) == (None, name)
    assert d.reason.endswith(": waiting for a step time")


@pytest.mark.parametrize(("cls", "name", "tau_of"), INTERVAL)
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"probe_s": 0.0}, "probe_s must be > 0 seconds, got 0.0"),
        ({"save_cost_s": -1.0}, "save_cost_s must be >= 0 seconds, got -1.0"),
        ({"mtbf_s": 0.0}, "mtbf_s must be > 0 seconds, got 0.0"),
        ({"mtbf_s": math.nan}, "mtbf_s must be > 0 seconds, got nan"),
    ],
)
def test_interval_policies_refuse_bad_settings_by_name(cls, name, tau_of, kw, message) -> None:
    with pytest.raises(PolicyError, match=f"^{re.escape(f'{name}: {message}')}$"):
        cls(**kw)
    cls(save_cost_s=0.0)  # a free save is a valid pin


@pytest.mark.parametrize(
    ("kw", "age"),
    [
        ({}, 2900.0),  # 3000 s old now, the interval began 100 s ago
        ({"last_save_time": None}, 3000.0),
        ({"last_save_step": None}, 3000.0),
        ({"time_since_failure_s": None}, 0.0),
        ({"time_since_failure_s": None, "last_save_time": None}, 0.0),
        ({"time_since_failure_s": 50.0}, 0.0),  # failed since the last save
        ({"last_save_time": 5100.0}, 3000.0),  # a save dated ahead of the clock
    ],
)
def test_the_weibull_age_is_taken_at_the_start_of_the_interval(kw, age) -> None:
    assert interval_start_age(job(**kw)) == age


@pytest.mark.parametrize("shape", [0.05, 20.0])
def test_weibull_shapes_at_the_bounds_are_accepted(shape) -> None:
    assert Weibull(shape=shape).decide(NONE, job()).policy == "weibull"


@pytest.mark.parametrize("shape", [0.049, 20.01])
def test_weibull_shapes_out_of_range_are_refused(shape) -> None:
    with pytest.raises(
        PolicyError, match=rf"^weibull: shape must be in \[0.05, 20\], got {shape}$"
    ):
        Weibull(shape=shape)


def test_weibull_uses_its_shape() -> None:
    j = job()
    for k in (0.5, 1.0, 2.0):
        assert Weibull(shape=k).decide(NONE, j).interval_s == pytest.approx(
            model.weibull_interval(2900.0, model.Terms(8.0, 175_000.0, restart_s=120.0), k)
        )


# ---------------------------------------------------------------------- budget


def test_budget_saves_as_often_as_its_overhead_allows() -> None:
    d = Budget(overhead=0.05).decide(NONE, job())
    assert d == Decision(
        next_step=1060,
        every_steps=160,
        reason="budget 5.00%: δ=8s → every 160s",
        policy="budget",
        interval_s=160.0,
        waste=0.05,
    )
    assert Budget().decide(NONE, job(save_cost_s=0.0)).interval_s == pytest.approx(1e-6 / 0.035)
    probe = Budget(probe_s=40.0).decide(NONE, job(save_cost_s=None))
    assert (probe.policy, probe.interval_s, probe.waste) == ("budget", 40.0, None)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"overhead": 0.0}, "budget: overhead must be a fraction in (0, 1), e.g. 0.035, got 0.0"),
        ({"overhead": 1.0}, "budget: overhead must be a fraction in (0, 1), e.g. 0.035, got 1.0"),
        ({"probe_s": 0.0}, "budget: probe_s must be > 0 seconds, got 0.0"),
    ],
)
def test_budget_refuses_bad_settings(kw, message) -> None:
    with pytest.raises(PolicyError, match=f"^{re.escape(message)}$"):
        Budget(**kw)


# ---------------------------------------------------------------------- fixed / phased


def test_fixed_two_tiers_by_hand_only_for_a_job_with_a_local_tier() -> None:
    two = Fixed(steps=300, durable_every=4)
    d = two.decide(NONE, job(step_time_s=0.5, local_tier=True))
    assert (d.every_steps, d.durable_every) == (300, 4) and "every 4th durable" in d.reason
    assert two.decide(NONE, job(step_time_s=0.5)).durable_every is None  # one tier


def test_fixed_reports_its_grid_in_steps_and_seconds() -> None:
    assert Fixed(steps=300).decide(NONE, job(step_time_s=0.5)) == Decision(
        next_step=1200, every_steps=300, reason="every 300 steps", policy="fixed", interval_s=150.0
    )
    assert Fixed(steps=300).decide(NONE, job(step_time_s=None)).interval_s is None
    assert Fixed(seconds=90).decide(NONE, job(step_time_s=0.5)) == Decision(
        next_step=1080,
        every_steps=180,
        reason="every 90s ≈ 180 steps at 0.5s/step",
        policy="fixed",
        interval_s=90.0,
    )
    assert Fixed(seconds=90).decide(NONE, job(step_time_s=None)) == Decision(
        next_step=None, reason="every 90s: waiting for a step-time measurement", policy="fixed"
    )


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({}, "fixed: set exactly one of steps= or seconds= (got steps=None, seconds=None)"),
        (
            {"steps": 5, "seconds": 5.0},
            "fixed: set exactly one of steps= or seconds= (got steps=5, seconds=5.0)",
        ),
        ({"steps": 0}, "fixed: steps must be >= 1, got 0"),
        ({"seconds": 0.0}, "fixed: seconds must be > 0, got 0.0"),
        ({"seconds": math.nan}, "fixed: seconds must be > 0, got nan"),
        ({"steps": 5, "durable_every": 0}, "fixed: durable_every must be >= 1, got 0"),
    ],
)
def test_fixed_refuses_bad_settings(kw, message) -> None:
    with pytest.raises(PolicyError, match=f"^{re.escape(message)}$"):
        Fixed(**kw)
    Fixed(steps=1)


@pytest.mark.parametrize(
    ("step", "decision"),
    [
        (0, Decision(50, 50, reason="warm-up: every 50 steps until 1000", interval_s=25.0)),
        (930, Decision(950, 50, reason="warm-up: every 50 steps until 1000", interval_s=25.0)),
        (950, Decision(1000, 300, reason="after warm-up: every 300 steps", interval_s=150.0)),
        (999, Decision(1000, 300, reason="after warm-up: every 300 steps", interval_s=150.0)),
        (1000, Decision(1300, 300, reason="after warm-up: every 300 steps", interval_s=150.0)),
        (1299, Decision(1300, 300, reason="after warm-up: every 300 steps", interval_s=150.0)),
    ],
)
def test_phased_decisions_in_full(step, decision) -> None:
    d = Phased().decide(NONE, job(step=step, step_time_s=0.5))
    assert d == dataclasses.replace(decision, policy="phased")


def test_phased_boundary_and_unknown_step_time() -> None:
    # 940 + 50 = 990 < 1000: still the early grid; at 950 the next early save would be 1000
    assert Phased().decide(NONE, job(step=940)).next_step == 950
    assert Phased().decide(NONE, job(step=950)).every_steps == 300
    assert Phased(warmup_steps=1).decide(NONE, job(step=0)).every_steps == 300
    assert Phased().decide(NONE, job(step=10, step_time_s=None)).interval_s is None
    assert Phased().decide(NONE, job(step=1010, step_time_s=None)).interval_s is None


@pytest.mark.parametrize("name", ["warmup_steps", "early_every", "late_every"])
def test_phased_refuses_a_zero_setting_by_name(name) -> None:
    with pytest.raises(PolicyError, match=rf"^phased: {name} must be >= 1, got 0$"):
        Phased(**{name: 0})
    Phased(**{name: 1})


# ---------------------------------------------------------------------- opportunistic


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"window": 0.0}, "opportunistic: window must be a fraction in (0, 1), got 0.0"),
        ({"window": 1.0}, "opportunistic: window must be a fraction in (0, 1), got 1.0"),
        ({"idle": -0.1}, "opportunistic: idle must be in [0, 1), got -0.1"),
        ({"idle": 1.0}, "opportunistic: idle must be in [0, 1), got 1.0"),
    ],
)
def test_opportunistic_refuses_bad_settings(kw, message) -> None:
    with pytest.raises(PolicyError, match=f"^{re.escape(message)}$"):
        Opportunistic(**kw)
    Opportunistic(idle=0.0)


def test_opportunistic_saves_now_while_idle_and_says_so() -> None:
    # fixed 100 from the last save at 900: due at 1000 (grid), window 25 steps
    op = Opportunistic(inner="fixed:steps=100", window=0.25, idle=0.3)
    d = op.decide(snap(util=0.3), job(step=980))
    assert d == Decision(
        next_step=981,
        every_steps=100,
        reason="GPUs 30% busy and a save is due in 20 steps: saving now (every 100 steps)",
        policy="fixed",
        interval_s=100.0,
        tags=("opportunistic",),
    )
    assert op.decide(snap(util=0.31), job(step=980)).next_step == 1000  # busy
    assert op.decide(snap(util=0.1), job(step=974)).next_step == 1000  # 26 steps away
    assert op.decide(snap(util=0.1), job(step=975)).next_step == 976  # 25: inside
    assert op.decide(snap(util=0.1), job(step=980, save_in_flight=True)).next_step == 1000
    assert op.decide(snap(util=None), job(step=980)).next_step == 1000  # unknown: busy
    assert op.decide(NONE, job(step=980)).next_step == 1000  # no GPUs seen


def test_opportunistic_window_is_a_fraction_of_the_interval_but_at_least_a_step() -> None:
    op = Opportunistic(inner="fixed:steps=4", window=0.1)
    assert op.decide(snap(util=0.0), job(step=1002, last_save_step=1000)).next_step == 1004
    assert op.decide(snap(util=0.0), job(step=1003, last_save_step=1000)).next_step == 1004
    op = Opportunistic(inner="fixed:steps=100", window=0.5)
    assert op.decide(snap(util=0.0), job(step=950)).next_step == 951


def test_an_early_save_stands_in_for_the_due_one_but_not_a_resume() -> None:
    op = Opportunistic(inner="fixed:steps=100", window=0.25)
    # saved at 980 while idle: the grid's 1000 is skipped to 1100
    d = op.decide(snap(util=0.9), job(step=985, last_save_step=980))
    assert (d.next_step, d.reason) == (1100, "every 100 steps; taken early")
    # the anchor at the start step is a resume, not an early save
    d = op.decide(snap(util=0.9), job(step=985, last_save_step=None, start_step=980))
    assert d.next_step == 1000
    # a save exactly at the grid step before is not early
    assert op.decide(snap(util=0.9), job(step=985, last_save_step=900)).next_step == 1000
    assert op.decide(snap(util=0.9), job(step=985, last_save_step=975)).next_step == 1100
    assert op.decide(snap(util=0.9), job(step=985, last_save_step=974)).next_step == 1000


def test_opportunistic_leaves_urgent_and_empty_plans_alone() -> None:
    op = Opportunistic(inner="risk")
    urgent = op.decide(snap(util=0.0), job(urgent="operator"))
    assert urgent.urgent and urgent.reason == "requested: operator"
    assert op.decide(snap(util=0.0), job()).next_step is None


def test_idle_util_is_the_busiest_of_the_job_s_gpus() -> None:
    s = Snapshot(
        time=0.0,
        gpus=(
            GpuSample(index=0, uuid="g0", util_sm=0.2, pids=(7,)),
            GpuSample(index=1, uuid="g1", util_sm=0.6, pids=(7,)),
            GpuSample(index=2, uuid="g2", util_sm=0.9, pids=(8,)),  # another job's
        ),
    )
    assert idle_util(s, job()) == 0.6


# ---------------------------------------------------------------------- risk


def urgent(reason: str) -> Decision:
    return Decision(next_step=None, urgent=True, reason=reason, policy="risk", tags=("risk",))


def test_risk_decisions_in_full() -> None:
    r = Risk()
    assert r.decide(NONE, job(urgent="operator")) == urgent("requested: operator")
    drain = Snapshot(time=0.0, host=HostSample(draining=True))
    assert r.decide(drain, job()) == urgent("host is draining")
    assert r.decide(snap(xid_events=(79, 48, 79)), job()) == urgent("XID 48, 79 on the job's GPUs")
    never_saved = job(last_save_time=None)
    assert r.decide(snap(ecc_uncorrected=2), never_saved) == urgent(
        "GPU 0: 2 uncorrected ECC error(s)"
    )
    assert r.decide(NONE, job()) == Decision(next_step=None, reason="no risk event", policy="risk")


def test_risk_triggers_can_be_turned_off() -> None:
    drain = Snapshot(time=0.0, host=HostSample(draining=True))
    assert not Risk(on_drain=False).decide(drain, job()).urgent
    assert not Risk(on_xid=False).decide(snap(xid_events=(79,)), job()).urgent
    assert not Risk(on_ecc=False).decide(snap(ecc_uncorrected=1), job(last_save_time=None)).urgent
    # an operator's request is not a trigger to turn off
    assert Risk(on_drain=False, on_xid=False, on_ecc=False).decide(NONE, job(urgent="x")).urgent


def test_a_drain_asks_for_one_save_of_the_current_step() -> None:
    drain = Snapshot(time=0.0, host=HostSample(draining=True))
    assert not Risk().decide(drain, job(save_in_flight=True)).urgent
    assert not Risk().decide(drain, job(last_save_step=1000)).urgent


@pytest.mark.parametrize(
    ("gpu", "why"),
    [
        ({"retired_pages_pending": True}, "retired pages pending"),
        ({"remapped_rows_pending": True}, "remapped rows pending"),
    ],
)
def test_a_degraded_gpu_saves_now_then_every_few_minutes(gpu, why) -> None:
    r = Risk(degraded_every_s=120.0)
    # the last save 50 s ago: not yet; every 120 s of 1 s steps from the last save
    recent = job(last_save_time=4950.0)  # 50 s ago
    assert r.decide(snap(**gpu), recent) == Decision(
        next_step=1020,
        every_steps=120,
        reason=f"GPU 0: {why}: saving every 120s",
        policy="risk",
        interval_s=120.0,
    )
    assert r.decide(snap(**gpu), job(last_save_time=4880.0)).urgent  # exactly 120 s: due
    assert not r.decide(snap(**gpu), job(last_save_time=4881.0)).urgent
    assert r.decide(snap(**gpu), job(last_save_time=None)).urgent  # never saved
    in_flight = r.decide(snap(**gpu), job(last_save_time=None, save_in_flight=True))
    assert not in_flight.urgent and in_flight.every_steps == 120
    unknown = r.decide(snap(**gpu), job(last_save_time=4950.0, step_time_s=None))
    assert unknown == Decision(next_step=None, reason="no risk event", policy="risk")


def test_risk_refuses_a_degraded_interval_of_zero() -> None:
    with pytest.raises(PolicyError, match=r"^risk: degraded_every_s must be > 0 seconds, got 0$"):
        Risk(degraded_every_s=0)


# ---------------------------------------------------------------------- default


def test_the_fleet_interval_is_weibull_only_while_the_fleet_is_credibly_bursty() -> None:
    j = job()

    def fleet(shape: float | None, high: float | None = 0.9) -> Snapshot:
        return Snapshot(time=0.0, fleet=FleetSample(failure_shape=shape, failure_shape_high=high))

    fi = FleetInterval(probe_s=120.0)
    assert fi.decide(NONE, j) == Daly(probe_s=120.0).decide(NONE, j)
    assert fi.decide(fleet(0.6), j) == Weibull(shape=0.6).decide(NONE, j)
    assert fi.decide(fleet(0.6, high=1.0), j).policy == "daly"  # not credibly below 1
    assert fi.decide(fleet(None), j).policy == "daly"
    # the shape is clamped to what weibull accepts and rounded (one cached policy per shape)
    low = fi.decide(fleet(0.01), j)
    assert low.interval_s == Weibull(shape=0.05).decide(NONE, j).interval_s
    high = fi.decide(fleet(25.0), j)
    assert high.interval_s == Weibull(shape=20.0).decide(NONE, j).interval_s
    assert fi.decide(fleet(0.70004), j).reason.startswith("Weibull k=0.7: ")
    assert fi.decide(fleet(0.7006), j).reason.startswith("Weibull k=0.701: ")
    probe = fi.decide(fleet(0.6), job(save_cost_s=None))
    assert (probe.policy, probe.interval_s) == ("weibull", 120.0)


def test_the_default_stack_passes_its_settings_down() -> None:
    d = Default(probe_s=77.0).decide(NONE, job(save_cost_s=None))
    assert d.interval_s == 77.0
    capped = Default(max_lost_s=100.0).decide(NONE, job())
    assert capped.every_steps <= 100
    r = Default(degraded_every_s=60.0).decide(snap(retired_pages_pending=True), job())
    assert r.urgent  # the last save is 100 s old: past 60 s


# ---------------------------------------------------------------------- settings, everywhere


def test_sub_second_settings_are_valid() -> None:
    """Seconds are seconds: nothing requires a setting of a whole second or more."""
    for cls in (Young, Daly, Weibull):
        assert cls(probe_s=0.5, mtbf_s=0.5).decide(NONE, job(save_cost_s=None)).interval_s == 0.5
    assert Budget(probe_s=0.5).decide(NONE, job(save_cost_s=None)).interval_s == 0.5
    assert Fixed(seconds=0.5).decide(NONE, job(step_time_s=0.25)).every_steps == 2
    assert Risk(degraded_every_s=0.5).degraded_every_s == 0.5
    assert Guards(max_lost_s=0.5).max_lost_s == 0.5
    assert IoAware(max_defer=0.5, slot_lead_s=0.5).max_defer == 0.5


def test_a_job_with_an_mtbf_under_a_second_is_planned_not_probed() -> None:
    d = Daly().decide(NONE, job(mtbf_s=0.5))
    assert d.interval_s == pytest.approx(model.daly_interval(8.0, 0.5))
    assert Daly().decide(NONE, job(save_cost_s=None, mtbf_s=0.5)).interval_s == 0.05


def test_a_step_time_of_zero_is_no_step_time() -> None:
    assert Daly().decide(NONE, job(step_time_s=0.0)).next_step is None


@pytest.mark.parametrize(
    ("cls", "kw", "message"),
    [
        (Guards, {"max_lost_s": 0.0}, "guards: max_lost_s must be > 0 seconds, got 0.0"),
        (IoAware, {"busy": 0.0}, "io_aware: busy must be a fraction in (0, 1], got 0.0"),
        (IoAware, {"busy": 1.01}, "io_aware: busy must be a fraction in (0, 1], got 1.01"),
        (IoAware, {"max_writers": 0}, "io_aware: max_writers must be >= 1, got 0"),
        (
            IoAware,
            {"max_defer": -0.1},
            "io_aware: max_defer must be in [0, 10] intervals, got -0.1",
        ),
        (
            IoAware,
            {"max_defer": 10.5},
            "io_aware: max_defer must be in [0, 10] intervals, got 10.5",
        ),
        (
            IoAware,
            {"slot_lead_s": -1.0},
            "io_aware: slot_lead_s must be in [0, 600] seconds, got -1.0",
        ),
        (
            IoAware,
            {"slot_lead_s": 600.5},
            "io_aware: slot_lead_s must be in [0, 600] seconds, got 600.5",
        ),
    ],
)
def test_wrappers_refuse_bad_settings(cls, kw, message) -> None:
    with pytest.raises(PolicyError, match=f"^{re.escape(message)}$"):
        cls(**kw)


def test_wrapper_settings_at_their_bounds_are_accepted() -> None:
    IoAware(busy=1.0, max_defer=0.0, slot_lead_s=0.0)
    IoAware(max_defer=10.0, slot_lead_s=600.0, max_writers=1)


@pytest.mark.parametrize(
    ("cls", "name"), [(Guards, "guards"), (IoAware, "io_aware"), (Opportunistic, "opportunistic")]
)
def test_a_bad_inner_policy_is_reported_by_its_wrapper(cls, name) -> None:
    with pytest.raises(PolicyError, match=f"^{name}: inner='nope': "):
        cls(inner="nope")


class Bare:
    """A third-party policy that plans a step without stating an interval, or states an
    interval without a step."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        return self.decision


@pytest.mark.parametrize(
    "decision",
    [Decision(next_step=1500, reason="mine"), Decision(next_step=None, every_steps=500)],
)
@pytest.mark.parametrize("wrapper", [Opportunistic, IoAware])
def test_wrappers_pass_a_plan_without_an_interval_through(wrapper, decision) -> None:
    busy = Snapshot(
        time=0.0,
        gpus=(GpuSample(index=0, uuid="g0", util_sm=0.0, pids=(7,)),),
        storage=(StorageSample(target="nfs", mountpoint="/nfs", busy_fraction=1.0),),
    )
    assert wrapper(inner=Bare(decision)).decide(busy, job(storage_target="nfs")) == decision


# ---------------------------------------------------------------------- guards


def test_guards_cap_the_work_at_risk_and_say_so() -> None:
    g = Guards(inner="fixed:steps=500", max_lost_s=100.0)
    assert g.decide(NONE, job()) == Decision(
        next_step=1001,  # 900 + 100 is past: the next step
        every_steps=100,
        reason="every 500 steps; capped: at most 100s of work at risk",
        policy="fixed",
        interval_s=100.0,
    )
    assert g.decide(NONE, job(last_save_step=950)).next_step == 1050
    # a plan exactly at the cap is left alone
    exact = Guards(inner="fixed:steps=100", max_lost_s=200.0)
    assert exact.decide(NONE, job()) == Fixed(steps=100).decide(NONE, job())
    # no step time: no cap in steps to apply
    assert g.decide(NONE, job(step_time_s=None)) == Fixed(steps=500).decide(
        NONE, job(step_time_s=None)
    )


def test_guards_give_a_plan_to_a_policy_that_had_none() -> None:
    d = Guards(inner="risk", max_lost_s=100.0).decide(NONE, job(last_save_step=950))
    assert d == Decision(
        next_step=1050,
        every_steps=100,
        reason="no risk event; capped: at most 100s of work at risk",
        policy="risk",
        interval_s=100.0,
    )


def test_guards_keep_saves_a_durable_latency_apart() -> None:
    g = Guards(inner="fixed:steps=10")
    assert g.decide(NONE, job(last_save_step=995)) == Decision(
        next_step=1055,
        every_steps=60,
        reason="every 10 steps; floored: a save takes 60s to be durable",
        policy="fixed",
        interval_s=60.0,
    )
    # a plan exactly at the floor is left alone
    at = Guards(inner="fixed:steps=60").decide(NONE, job(last_save_step=950, save_latency_s=70.0))
    assert at == Fixed(steps=60).decide(NONE, job(last_save_step=950, save_latency_s=70.0))
    # a plan of a step without an interval gets the floor as its interval
    bare = Guards(inner=Bare(Decision(next_step=1001))).decide(NONE, job(last_save_step=995))
    assert (bare.next_step, bare.every_steps) == (1055, 60)


def test_guards_wait_for_the_save_in_flight_to_be_durable() -> None:
    g = Guards(inner="fixed:steps=10")
    # the save at step 950 was called 5 s ago: 55 s of its write are left
    kw = {"last_save_step": 950, "last_save_time": 4995.0}
    assert g.decide(NONE, job(**kw)).next_step == 1010  # not in flight: 950 + 60
    d = g.decide(NONE, job(save_in_flight=True, **kw))
    assert (d.next_step, d.every_steps) == (1055, 60)
    # in flight for longer than its latency: the floor from the last save only
    late = g.decide(NONE, job(save_in_flight=True, last_save_step=950, last_save_time=4900.0))
    assert late.next_step == 1010


def test_guards_give_every_reason_when_both_limits_act() -> None:
    d = Guards(inner="fixed:steps=500", max_lost_s=30.0).decide(NONE, job(last_save_step=990))
    assert d.reason == (
        "every 500 steps; capped: at most 30s of work at risk; "
        "floored: a save takes 60s to be durable"
    )
    assert (d.next_step, d.every_steps, d.interval_s) == (1050, 60, 60.0)


# ---------------------------------------------------------------------- io_aware


def storage(**kw) -> Snapshot:
    return Snapshot(time=5000.0, storage=(StorageSample(target="nfs", mountpoint="/nfs", **kw),))


def test_a_target_exactly_at_the_busy_threshold_is_busy() -> None:
    io = IoAware(inner="fixed:steps=100", busy=0.8)
    d = io.decide(storage(busy_fraction=0.8), job(step=995, storage_target="nfs"))
    assert d.next_step == 1100 and "deferred: nfs is 80% busy" in d.reason
    assert (
        io.decide(storage(busy_fraction=0.79), job(step=995, storage_target="nfs")).next_step
        == 1000
    )


def test_a_deferred_save_is_never_planned_in_the_past() -> None:
    # due at 1000, deferred at most one interval: until 1100; at step 1099 that is the next
    io = IoAware(inner="fixed:steps=100")
    d = io.decide(storage(busy_fraction=1.0), job(step=1099, storage_target="nfs"))
    assert d.next_step == 1100 and d.tags == ("deferred",)


def test_an_overdue_save_is_taken_when_the_target_clears() -> None:
    io = IoAware(inner="fixed:steps=100")
    clear = storage(busy_fraction=0.1)
    # due at 900 + 100 = 1000, and it is step 1000: the grid's next would be 1100
    d = io.decide(clear, job(step=1000, storage_target="nfs"))
    assert (d.next_step, d.reason) == (1001, "every 100 steps; storage clear, saving the overdue")
    # two steps before the grid's next: still taken now
    assert io.decide(clear, job(step=1098, storage_target="nfs")).next_step == 1099
    # the grid's next is the next step anyway: nothing to say
    assert io.decide(clear, job(step=1099, storage_target="nfs")) == Fixed(steps=100).decide(
        clear, job(step=1099, storage_target="nfs")
    )


def test_a_degraded_gpu_s_plan_is_never_in_the_past() -> None:
    # the last save (step 100) was 50 s ago: 100 + 120 is long past, so the next step
    d = Risk(degraded_every_s=120.0).decide(
        snap(retired_pages_pending=True), job(last_save_step=100, last_save_time=4950.0)
    )
    assert (d.next_step, d.every_steps) == (1001, 120)


def test_the_default_stack_passes_its_storage_settings_to_io_aware() -> None:
    due = 900 + math.ceil(model.daly_interval(8.0, 175_000.0))  # 2568

    def at(**kw) -> Snapshot:
        return storage(**kw)

    j = job(step=due - 1, storage_target="nfs")
    assert Default().decide(at(busy_fraction=0.6), j).next_step == due  # 0.6 < 0.8: not busy
    deferred = Default(busy=0.5).decide(at(busy_fraction=0.6), j)
    assert deferred.next_step > due and "deferred" in deferred.tags
    one = at(busy_fraction=0.1, writing_jobs=("other",))
    assert "deferred" in Default().decide(one, j).tags  # one other writer: the default limit
    assert Default(max_writers=2).decide(one, j).next_step == due
    every = due - 900
    half = Default(busy=0.5, max_defer=0.5).decide(at(busy_fraction=0.6), j)
    assert half.next_step == due + round(0.5 * every)
