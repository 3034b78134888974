"""Estimators: convergence from cold start, following storage storms, failure-rate learning."""

from __future__ import annotations

import json
import random

import pytest

from adaptd.core.estimators import (
    PRIOR_GPU_MTBF_S,
    FailureRate,
    JobTracker,
    LevelEstimate,
    extra_time_from_util,
)


def test_save_cost_converges_from_cold_start_despite_noise_and_outliers() -> None:
    rng = random.Random(7)
    t = JobTracker("j")
    assert t.save_cost_s is None and t.state().save_cost_s is None
    for i in range(30):
        blocking = 2.0 * rng.uniform(0.9, 1.1)
        if i % 7 == 3:
            blocking = 40.0  # a lone hiccup
        t.on_save_report(
            10.0 * i, 100 * i, blocking_s=blocking, durable_s=blocking + 8, extra_step_s=0.5
        )
    assert t.save_cost_s == pytest.approx(2.5, rel=0.12)
    assert t.save_latency_s == pytest.approx(10.0, rel=0.12)


def test_level_follows_a_tenfold_storm_within_two_saves_and_recovers() -> None:
    est = LevelEstimate()
    for _ in range(5):
        est.add(5.0)
    est.add(50.0)
    assert est.value == 5.0  # one slow save is an outlier
    est.add(50.0)
    assert est.value == 50.0  # two agree: the storm is real
    est.add(52.0)
    est.add(5.0)
    assert est.value == pytest.approx(50.0, rel=0.05)
    est.add(5.1)
    assert est.value == pytest.approx(5.05)  # recovered two saves after the storm


def test_extra_time_from_gpu_utilisation_sag() -> None:
    # the seed article's cluster: utilisation 95% -> 67% while writes ran
    assert extra_time_from_util(0.95, 0.67, 10.0) == pytest.approx(10 * (1 - 0.67 / 0.95))
    assert extra_time_from_util(0.9, 0.95, 10.0) == 0.0
    t = JobTracker("j")
    t.on_save_report(1.0, 10, blocking_s=1.0, durable_s=11.0, extra_step_s=0.5, gpu_sag_s=2.0)
    assert t.save_cost_s == 3.0


def test_failure_rate_posterior_starts_at_the_llama3_prior_and_learns() -> None:
    fr = FailureRate()
    assert fr.gpu_mtbf_s == pytest.approx(PRIOR_GPU_MTBF_S)
    assert pytest.approx(50_700, rel=0.01) == PRIOR_GPU_MTBF_S / 3600
    # a fleet four times worse than the prior: 1 failure per 12,500 GPU-hours
    rng = random.Random(3)
    true_mtbf = 12_500 * 3600.0
    for _ in range(200):
        fr.observe(rng.expovariate(1 / true_mtbf))
        fr.failure()
    assert fr.gpu_mtbf_s == pytest.approx(true_mtbf, rel=0.15)
    lo, hi = fr.credible_mtbf_s(0.05), fr.credible_mtbf_s(0.95)
    assert lo < true_mtbf < hi


def test_tracker_learns_job_mtbf_from_failures_and_watched_gpu_hours() -> None:
    shared = FailureRate(prior_gpu_mtbf_s=1e6)
    t = JobTracker("j", gpus=100, failure_rate=shared)
    assert t.mtbf_s == pytest.approx(1e4)
    now = 0.0
    t.on_resume(now, 0)
    rng = random.Random(11)
    for _ in range(100):  # truth: per-GPU MTBF 2e5 s, job MTBF 2e3 s
        life = rng.expovariate(1 / 2000.0)
        steps = max(1, int(life))
        t.on_steps(now + life, t.step + steps, steps, 1.0)
        now += life
        t.on_failure(now)
        now += 60.0  # down time is not exposure
        t.on_resume(now, t.step)
        t.on_restart(60.0)
    assert t.failures == 100
    assert t.mtbf_s == pytest.approx(2000.0, rel=0.2)
    assert t.restore_s == 60.0
    assert t.state().time_since_failure_s == pytest.approx(60.0)  # the restart itself


def test_restart_gap_counted_by_a_step_report_is_taken_back() -> None:
    fr = FailureRate()
    t = JobTracker("j", gpus=8, failure_rate=fr)
    t.on_steps(0.0, 1, 1, 1.0)
    t.on_steps(100.0, 101, 100, 1.0)
    assert fr.gpu_seconds == pytest.approx(800.0)
    t.on_steps(700.0, 102, 1, 1.0)  # the daemon's path: first step after a 590 s restart
    t.on_restart(590.0)
    assert fr.gpu_seconds == pytest.approx(8 * 110.0)


def test_learned_parameters_round_trip_through_json() -> None:
    t = JobTracker("j", gpus=4)
    for i in range(4):
        t.on_save_report(i, i * 10, blocking_s=1.0 + i, durable_s=5.0, extra_step_s=0.25)
    t.on_steps(1.0, 10, 10, 0.3)
    t.on_restart(42.0)
    t.on_failure(2.0)
    data = json.loads(json.dumps(t.learned()))
    u = JobTracker("j", gpus=4)
    u.load_learned(data)
    assert (u.save_cost_s, u.save_latency_s, u.restore_s, u.step_time_s, u.failures) == (
        t.save_cost_s,
        t.save_latency_s,
        42.0,
        0.3,
        1,
    )
    fr = FailureRate.from_dict(json.loads(json.dumps(t.failure_rate.to_dict())))
    assert fr == t.failure_rate
    with pytest.raises(ValueError, match="version"):
        u.load_learned({"version": 99})
    with pytest.raises(ValueError, match="version"):
        FailureRate.from_dict({})


def test_resume_rolls_back_save_marks_and_age() -> None:
    t = JobTracker("j")
    t.on_steps(10.0, 500, 500, 0.02)
    t.on_save_requested(10.0, 500)
    t.on_save_report(11.0, 500, blocking_s=0.1, durable_s=1.0)
    t.on_save_requested(20.0, 900)
    t.on_failure(25.0)
    t.on_resume(85.0, 500)
    s = t.state()
    assert (s.step, s.start_step, s.last_save_step, s.save_in_flight) == (500, 500, 500, False)
    assert s.time_since_failure_s == pytest.approx(60.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prior_gpu_mtbf_s": 0}, "prior_gpu_mtbf_s"),
        ({"prior_failures": 0}, "prior_failures"),
        ({"failures": -1}, "failures"),
    ],
)
def test_bad_failure_rate_settings(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        FailureRate(**kwargs)
