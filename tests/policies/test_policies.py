"""Table tests: (snapshot, job state) -> decision, for every built-in policy."""

from __future__ import annotations

import math

import pytest

from adaptd.core import model
from adaptd.core.policy import DEFAULT_SPEC, AnyPolicy, PolicyError, available, parse
from adaptd.core.snapshot import GpuSample, HostSample, JobState, Snapshot, StorageSample
from adaptd.policies import (
    Budget,
    Daly,
    Default,
    Fixed,
    Guards,
    IoAware,
    Opportunistic,
    Risk,
    Weibull,
    Young,
)
from adaptd.policies.gpus import job_gpus

T = "nfs"


def job(**kw) -> JobState:
    base = dict(
        job="a",
        step=1000,
        time=5000.0,
        step_time_s=1.0,
        last_save_step=900,
        last_save_time=4900.0,
        save_cost_s=8.0,
        save_latency_s=60.0,
        mtbf_s=175_000.0,
        storage_target=T,
        pids=(7,),
    )
    base.update(kw)
    return JobState(**base)


def snap(
    busy: float | None = 0.1,
    writing: tuple[str, ...] = (),
    max_writers: int | None = None,
    **gpu,
) -> Snapshot:
    return Snapshot(
        time=5000.0,
        gpus=(GpuSample(index=0, uuid="g0", util_sm=0.95, pids=(7,), **{**gpu}),),
        storage=(
            StorageSample(
                target=T,
                mountpoint="/nfs",
                busy_fraction=busy,
                writing_jobs=writing,
                max_writers=max_writers,
            ),
        ),
    )


DALY_STEPS = math.ceil(model.daly_interval(8.0, 175_000.0))  # 1668: whole steps covering it
DALY_HALF = math.ceil(model.daly_interval(8.0, 175_000.0) / 2.0)


@pytest.mark.parametrize(
    ("policy", "state", "next_step", "every"),
    [
        (Daly(), job(), 900 + DALY_STEPS, DALY_STEPS),
        (Daly(), job(step_time_s=2.0), 900 + DALY_HALF, DALY_HALF),
        (Daly(), job(last_save_step=None, start_step=200), 200 + DALY_STEPS, DALY_STEPS),
        (Daly(), job(step=5000), 5001, DALY_STEPS),  # overdue: save at the next step
        (Daly(), job(save_cost_s=None, last_save_step=None, step=10), 300, 300),  # cold probe
        # a failure-prone job probes within a tenth of its MTBF
        (Daly(), job(save_cost_s=None, last_save_step=None, step=10, mtbf_s=1000.0), 100, 100),
        (Daly(save_cost_s=30.0, mtbf_s=10986.0), job(), 900 + 793, 793),  # pinned (oracle)
        (Young(), job(), 900 + math.ceil(model.young_interval(8, 175e3)), 1674),
        (Budget(), job(), 900 + math.ceil(8 / 0.035), 229),
        (Budget(overhead=0.01), job(), 900 + 800, 800),
        (Fixed(steps=50), job(), 1050, 50),
    ],
)
def test_interval_policies(policy, state, next_step, every) -> None:
    d = policy.decide(snap(), state)
    assert (d.next_step, d.every_steps) == (next_step, every)
    assert d.reason and not d.urgent


def test_daly_waits_for_a_step_time() -> None:
    d = Daly().decide(snap(), job(step_time_s=None))
    assert d.next_step is None and "step time" in d.reason


def test_weibull_interval_depends_on_the_age_at_the_last_save() -> None:
    w = Weibull(shape=0.7)
    young_job = w.decide(snap(), job(time_since_failure_s=150.0))  # saved 50 s after a restart
    old_job = w.decide(snap(), job(time_since_failure_s=400_000.0))
    assert young_job.every_steps < DALY_STEPS < old_job.every_steps
    # the plan does not drift as the interval runs: same age at the last save
    later = w.decide(snap(), job(step=1500, time=5500.0, time_since_failure_s=650.0))
    assert later.next_step == young_job.next_step
    assert Weibull(shape=1.0).decide(snap(), job()).every_steps == pytest.approx(DALY_STEPS, abs=3)


@pytest.mark.parametrize(
    ("storage", "state", "next_step", "tag"),
    [
        (snap(busy=0.1), job(), 900 + DALY_STEPS, None),  # clear: inner plan
        (snap(busy=0.95), job(), 900 + 2 * DALY_STEPS, "deferred"),  # saturated: deadline
        (snap(busy=0.1, writing=("b",)), job(), 900 + 2 * DALY_STEPS, "deferred"),  # other writer
        (snap(busy=0.1, writing=("a",)), job(), 900 + DALY_STEPS, None),  # itself: not a reason
        (snap(busy=0.95), job(step=900 + 2 * DALY_STEPS), 900 + 2 * DALY_STEPS + 1, None),
        (snap(busy=None), job(storage_target=None), 900 + DALY_STEPS, None),  # unknown target
    ],
)
def test_io_aware_defers_by_a_bounded_amount(storage, state, next_step, tag) -> None:
    d = IoAware().decide(storage, state)
    assert d.next_step == next_step
    assert (tag in d.tags) if tag else ("deferred" not in d.tags)


def test_io_aware_staggers_up_to_k_writers_and_catches_up_grid_policies() -> None:
    two = snap(busy=0.1, writing=("b", "c"))
    assert "deferred" in IoAware(max_writers=2).decide(two, job()).tags
    assert "deferred" not in IoAware(max_writers=3).decide(two, job()).tags
    # the target's configured limit wins over the policy's setting, both ways
    assert (
        "deferred"
        not in IoAware(max_writers=2)
        .decide(snap(busy=0.1, writing=("b", "c"), max_writers=3), job())
        .tags
    )
    limited = IoAware(max_writers=3).decide(snap(busy=0.1, writing=("b",), max_writers=1), job())
    assert "deferred" in limited.tags and "(at most 1)" in limited.reason
    # fixed:steps=50 deferred past its grid point 950: once clear, save at the next step
    p = IoAware(inner="fixed:steps=50")
    assert p.decide(snap(busy=0.95), job(step=960)).next_step == 1000  # 950 + 50 (deadline)
    assert p.decide(snap(busy=0.1), job(step=960)).next_step == 961


@pytest.mark.parametrize(
    ("util", "state", "next_step"),
    [
        (0.1, job(step=900 + DALY_STEPS - 100), 900 + DALY_STEPS - 99),  # idle, due soon: now
        (0.9, job(step=900 + DALY_STEPS - 100), 900 + DALY_STEPS),  # busy: wait
        (0.1, job(step=1000), 900 + DALY_STEPS),  # idle but not due soon
        (0.1, job(step=900 + DALY_STEPS - 100, save_in_flight=True), 900 + DALY_STEPS),
        (None, job(step=900 + DALY_STEPS - 100), 900 + DALY_STEPS),  # unknown utilisation
    ],
)
def test_opportunistic_takes_due_saves_while_gpus_idle(util, state, next_step) -> None:
    s = Snapshot(time=0.0, gpus=(GpuSample(index=0, uuid="g", util_sm=util, pids=(7,)),))
    assert Opportunistic().decide(s, state).next_step == next_step


def test_opportunistic_early_save_stands_in_for_the_grid_one() -> None:
    s = Snapshot(time=0.0, gpus=(GpuSample(index=0, uuid="g", util_sm=0.9, pids=(7,)),))
    p = Opportunistic(inner="fixed:steps=100", window=0.25)
    # saved early at 980 while idle; the grid save at 1000 is skipped
    assert p.decide(s, job(step=985, last_save_step=980)).next_step == 1100


@pytest.mark.parametrize(
    ("snapshot", "state", "urgent", "why"),
    [
        (snap(), job(), False, "no risk"),
        (snap(), job(urgent="operator: save-now"), True, "operator"),
        (snap(xid_events=(79,)), job(), True, "XID 79"),
        (snap(xid_events=(79,)), job(save_in_flight=True), False, "no risk"),
        (snap(ecc_uncorrected=2), job(last_save_time=4000.0), True, "uncorrected ECC"),
        (snap(ecc_uncorrected=2), job(last_save_time=4900.0), False, "every 300s"),
        (snap(retired_pages_pending=True), job(last_save_time=None), True, "retired pages"),
        (snap(remapped_rows_pending=True), job(last_save_time=4000.0), True, "remapped rows"),
        (
            Snapshot(time=0.0, host=HostSample(draining=True)),
            job(),
            True,
            "draining",
        ),
        (Snapshot(time=0.0, host=HostSample(draining=True)), job(last_save_step=1000), False, ""),
        (snap(xid_events=(79,)), job(pids=(8,)), False, "no risk"),  # another job's GPU
    ],
)
def test_risk_triggers(snapshot, state, urgent, why) -> None:
    d = Risk().decide(snapshot, state)
    assert d.urgent is urgent
    assert why in d.reason


def test_gpus_are_the_jobs_by_telemetry_name_or_by_pid() -> None:
    # NVML lists a launcher's child (pid 70), not the rank's own pid 7; telemetry names
    # the job that owns it, and that GPU's XID is the job's
    child = GpuSample(index=0, uuid="g0", util_sm=0.05, pids=(70,), jobs=("a",), xid_events=(48,))
    other = GpuSample(index=1, uuid="g1", util_sm=0.05, pids=(71,), jobs=("b",), xid_events=(79,))
    s = Snapshot(time=5000.0, gpus=(child, other))
    assert job_gpus(s, job()) == (child,)
    assert job_gpus(s, job(pids=(71,))) == (child, other)
    d = Risk().decide(s, job())
    assert d.urgent and "XID 48" in d.reason
    assert not Risk().decide(Snapshot(time=5000.0, gpus=(other,)), job()).urgent
    due = 900 + DALY_STEPS
    assert Opportunistic().decide(s, job(step=due - 100)).next_step == due - 99


def test_degraded_gpu_saves_every_few_minutes() -> None:
    d = Risk(degraded_every_s=300).decide(snap(ecc_uncorrected=1), job(last_save_time=4900.0))
    assert (d.next_step, d.every_steps) == (1200, 300)


@pytest.mark.parametrize(
    ("policy", "state", "next_step"),
    [
        (Guards(max_lost_s=600), job(), 1500),  # Daly's 2566 capped at 900 + 600
        (Guards(inner="fixed:steps=10"), job(step=905), 960),  # floor: L = 60 s after 900
        (Guards(inner="fixed:steps=10", latency_floor=False), job(step=905), 910),
        # save in flight since t=4990 of a 60 s write: not before it is durable
        (
            Guards(inner="fixed:steps=10"),
            job(
                step=995,
                last_save_step=990,
                last_save_time=4990.0,
                time=5000.0,
                save_in_flight=True,
            ),
            1050,
        ),
    ],
)
def test_guards(policy, state, next_step) -> None:
    assert policy.decide(snap(), state).next_step == next_step


def test_guards_let_urgent_saves_through() -> None:
    assert Guards(inner="risk", max_lost_s=60).decide(snap(), job(urgent="drain")).urgent


def test_default_stack_composition() -> None:
    d = Default()
    assert d.decide(snap(), job()).next_step == 900 + DALY_STEPS
    assert "deferred" in d.decide(snap(busy=0.99), job()).tags
    assert d.decide(snap(xid_events=(48,)), job()).urgent
    assert d.decide(snap(busy=0.99, xid_events=(48,)), job()).urgent
    assert Default(max_lost_s=600).decide(snap(), job()).next_step == 1500
    assert DEFAULT_SPEC == "default"
    assert isinstance(parse(DEFAULT_SPEC), Default)


@pytest.mark.parametrize(
    ("spec", "check"),
    [
        ("io_aware:inner=young", lambda p: isinstance(p.policy, Young)),
        ("guards:inner=fixed:steps=50,max_lost_s=30", lambda p: p.policy == Fixed(steps=50)),
        (
            "io_aware:inner=phased:early_every=20;late_every=100,max_writers=2",
            lambda p: (p.policy.early_every, p.policy.late_every, p.max_writers) == (20, 100, 2),
        ),
        ("daly+risk", lambda p: isinstance(p, AnyPolicy)),
        ("weibull:shape=0.8", lambda p: p.shape == 0.8),
        ("budget:overhead=0.035", lambda p: p.overhead == 0.035),
    ],
)
def test_specs_build_wrappers_and_settings(spec, check) -> None:
    assert check(parse(spec))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("budget:overhead=3.5", "fraction in"),
        ("io_aware:inner=nope", "unknown policy 'nope'"),
        ("io_aware:busy=0", "busy"),
        ("weibull:shape=0", "shape"),
        ("daly:probe_s=0", "probe_s"),
        ("guards:max_lost_s=-5", "max_lost_s"),
        ("opportunistic:window=1.5", "window"),
        ("risk:degraded_every_s=0", "degraded_every_s"),
    ],
)
def test_bad_settings_say_what_is_wrong(spec, message) -> None:
    with pytest.raises(PolicyError, match=message):
        parse(spec)


def test_all_builtins_are_registered() -> None:
    names = {
        "fixed",
        "phased",
        "young",
        "daly",
        "weibull",
        "budget",
        "io_aware",
        "opportunistic",
        "risk",
        "guards",
        "default",
    }
    assert names <= set(available())


@pytest.mark.parametrize(
    "spec",
    ["daly", "young", "weibull", "budget", "default", "default:max_lost_s=90",
     "guards:max_lost_s=45", "fixed:seconds=7.5", "phased", "opportunistic", "io_aware"],
)  # fmt: skip
def test_a_plan_never_asks_for_saves_closer_together_than_the_interval_it_states(spec) -> None:
    """Seconds become the whole steps that cover them, and a wrapper that changes the
    steps states the interval it now asks for."""
    import random

    policy = parse(spec)
    rng = random.Random(11)
    for _ in range(300):
        st = 10 ** rng.uniform(-2.5, 1.2)
        state = job(
            step_time_s=st,
            save_cost_s=10 ** rng.uniform(-3, 2),
            save_latency_s=10 ** rng.uniform(-2, 2.5),
            mtbf_s=10 ** rng.uniform(2, 6),
            save_in_flight=rng.random() < 0.3,
        )
        d = policy.decide(snap(), state)
        if d.every_steps and d.interval_s is not None:
            assert d.every_steps * st >= d.interval_s * (1 - 1e-9), (spec, st, d)
