"""Failure classes and just-in-time coverage learned (adaptd/core/failure_rates.py), and the
local tier's figures in the tracker (adaptd/core/estimators.py)."""

from __future__ import annotations

import json
import math

import pytest

from adaptd.core.estimators import JobTracker
from adaptd.core.failure_rates import (
    PRIOR_GPU_MTBF_S,
    PRIOR_HOST_GPU_MTBF_S,
    PRIOR_PROCESS_MTBF_S,
    FailureClasses,
    FailureRate,
)
from adaptd.core.snapshot import JobState

DAY = 86400.0


def test_the_priors_split_llama_3s_interruptions_and_add_up_to_them() -> None:
    # 63 of 419 (software bugs 54, NCCL watchdog 7, dependencies 2) per job in 54 days
    assert math.isclose(PRIOR_PROCESS_MTBF_S, 54 * DAY / 63)
    assert round(PRIOR_PROCESS_MTBF_S / 3600, 3) == 20.571
    # the other 356 on 16,384 GPUs
    assert math.isclose(PRIOR_HOST_GPU_MTBF_S, 16384 * 54 * DAY / 356)
    # a 16,384-GPU job's two classes add up to Llama 3's own rate, 419 in 54 days
    job = 1 / (1 / PRIOR_PROCESS_MTBF_S + 16384 / PRIOR_HOST_GPU_MTBF_S)
    assert job == pytest.approx(PRIOR_GPU_MTBF_S / 16384, rel=1e-12)
    c = FailureClasses()
    assert (c.process_mtbf_s, c.host_mtbf_s(16384), c.coverage) == (
        PRIOR_PROCESS_MTBF_S,
        pytest.approx(PRIOR_HOST_GPU_MTBF_S / 16384),
        0.0,
    )


def test_the_process_class_is_per_job_and_the_host_class_per_gpu() -> None:
    c = FailureClasses(
        process=FailureRate(prior_gpu_mtbf_s=1000.0), host=FailureRate(prior_gpu_mtbf_s=8000.0)
    )
    c.observe(1000.0, gpus=8)  # a job of 8 GPUs, watched for 1000 s
    assert (c.process.gpu_seconds, c.host.gpu_seconds) == (1000.0, 8000.0)
    c.failure("process")
    c.failure("host", covered=True)
    c.failure(None)  # unknown: taken for a lost host
    # process: (1000 + 1000) / (1 + 1); host: (8000 + 8000) / (1 + 2), per job ÷ 8
    assert c.process_mtbf_s == 1000.0
    assert c.host_mtbf_s(8) == pytest.approx(16000 / 3 / 8)
    # one covered of three, one pseudo-failure uncovered: 1/4
    assert (c.covered, c.uncovered, c.coverage) == (1.0, 2.0, 0.25)
    assert c.fields(8) == {
        "process_mtbf_s": 1000.0,
        "host_mtbf_s": pytest.approx(16000 / 24),
        "jit_coverage": 0.25,
    }
    c.retract(500.0, gpus=8)
    assert (c.process.gpu_seconds, c.host.gpu_seconds) == (500.0, 4000.0)
    c.retract(1e9, gpus=8)
    assert (c.process.gpu_seconds, c.host.gpu_seconds) == (0.0, 0.0)
    c.observe(-5.0, gpus=8)
    c.retract(-5.0, gpus=8)
    assert (c.process.gpu_seconds, c.host.gpu_seconds) == (0.0, 0.0)


def test_coverage_approaches_one_as_covered_failures_keep_coming() -> None:
    c = FailureClasses()
    shares = []
    for _ in range(4):
        c.failure("host", covered=True)
        shares.append(c.coverage)
    assert shares == [1 / 2, 2 / 3, 3 / 4, 4 / 5]


def test_failure_classes_round_trip_and_refuse_bad_input() -> None:
    c = FailureClasses()
    c.observe(3600.0, gpus=4)
    c.failure("process", covered=True)
    back = FailureClasses.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c
    with pytest.raises(ValueError, match="version"):
        FailureClasses.from_dict({"version": 99})
    with pytest.raises(ValueError, match="failure kind must be one of"):
        c.failure("gpu")
    with pytest.raises(ValueError, match="prior_uncovered must be > 0, got 0"):
        FailureClasses(prior_uncovered=0)
    with pytest.raises(ValueError, match="covered and uncovered must be >= 0"):
        FailureClasses(covered=-1)


# ------------------------------------------------------------------ the tracker


def test_a_tracker_without_tiers_or_classes_states_what_it_stated_before() -> None:
    t = JobTracker("j", gpus=4)
    t.on_steps(10.0, 100, 100, 0.1)
    t.on_save_requested(10.0, 100)
    t.on_save_report(11.0, 100, blocking_s=1.0, durable_s=3.0)
    s = t.state()
    assert (s.local_tier, s.local_save_cost_s, s.local_latency_s, s.local_restore_s) == (
        False,
        None,
        None,
        None,
    )
    assert (s.process_mtbf_s, s.host_mtbf_s, s.jit_coverage, s.jit_save_s) == (
        None,
        None,
        0.0,
        None,
    )
    assert s.last_durable_save_step == 100 and s.last_durable_step == 100
    assert set(t.learned()) == {
        "version", "save_costs_s", "save_latencies_s", "restores_s", "step_time_s", "saves",
        "failures",
    }  # fmt: skip


def test_local_saves_teach_the_local_figures_and_make_nothing_durable() -> None:
    t = JobTracker("j", local_tier=True)
    t.on_steps(10.0, 100, 100, 0.1)
    t.on_save_requested(10.0, 100, durable=False)
    assert t.state().last_durable_save_step is None
    t.on_save_report(10.5, 100, blocking_s=0.25, durable_s=2.0, extra_step_s=0.5, tier="local")
    t.on_save_requested(20.0, 200, durable=True)
    t.on_save_report(20.5, 200, blocking_s=0.25, durable_s=1.0, tier="local")
    t.on_save_report(25.0, 200, blocking_s=4.0, durable_s=30.0, extra_step_s=1.0)
    s = t.state()
    assert (s.local_tier, s.local_save_cost_s, s.local_latency_s) == (True, 0.5, 1.5)
    assert (s.save_cost_s, s.save_latency_s, s.last_durable_step) == (5.0, 30.0, 200)
    assert (s.last_durable_save_step, s.durable_anchor, s.saves) == (200, 200, 3)
    # a local save reported alone leaves the durable figures where they were
    t.on_save_report(30.0, 300, blocking_s=9.0, durable_s=9.0, tier="local")
    assert (t.state().save_cost_s, t.state().last_durable_step) == (5.0, 200)
    t.on_restart(40.0, tier="local")
    t.on_restart(300.0)
    s = t.state()
    assert (s.local_restore_s, s.restore_s) == (40.0, 300.0)
    for call in (
        lambda: t.on_save_report(31.0, 300, blocking_s=1.0, durable_s=1.0, tier="tape"),
        lambda: t.on_restart(5.0, tier="tape"),
        lambda: t.on_resume(32.0, 300, tier="tape"),
    ):
        with pytest.raises(ValueError, match=r'^tier must be "durable" or "local", got \'tape\'$'):
            call()
    # what the local tier taught comes back after a daemon restart
    u = JobTracker("j", local_tier=True)
    u.load_learned(json.loads(json.dumps(t.learned())))
    assert u.learned() == t.learned()
    assert (u.state().local_save_cost_s, u.state().local_restore_s) == (0.75, 40.0)  # median


def test_a_durable_copy_lost_with_the_job_is_due_again_after_the_resume() -> None:
    t = JobTracker("j", local_tier=True)
    t.on_save_requested(1.0, 100, durable=True)
    t.on_save_report(2.0, 100, blocking_s=1.0, durable_s=1.0)  # durable at 100
    t.on_save_requested(3.0, 400, durable=True)  # its copy never completes
    t.on_save_report(3.5, 400, blocking_s=0.1, durable_s=0.5, tier="local")
    assert t.state().durable_anchor == 400
    t.on_failure(4.0, "process")
    t.on_resume(10.0, 400, tier="local")  # back in place, from the local copy of 400
    s = t.state()
    assert (s.start_step, s.last_durable_step, s.last_durable_save_step, s.durable_anchor) == (
        400,
        100,
        100,
        100,
    )
    # resumed from a save known durable (a just-in-time save made durable)
    t.on_failure(20.0, "host", covered=True)
    t.on_resume(30.0, 450, tier="durable")
    assert (t.state().last_durable_step, t.state().durable_anchor) == (450, 450)
    # without a known durable save, the cadence counts from the step resumed from
    assert JobTracker("k").state(start_step=70).durable_anchor == 70


def test_the_tracker_teaches_the_classes_its_exposure_and_failures() -> None:
    classes = FailureClasses(
        process=FailureRate(prior_gpu_mtbf_s=1000.0), host=FailureRate(prior_gpu_mtbf_s=8000.0)
    )
    t = JobTracker("j", gpus=8, failure_classes=classes)
    t.on_steps(0.0, 0, 0, 0.0)
    t.on_steps(100.0, 100, 100, 1.0)  # 100 s watched
    assert (classes.process.gpu_seconds, classes.host.gpu_seconds) == (100.0, 800.0)
    t.on_failure(150.0, "process", covered=True)  # 50 s more
    assert (classes.process.gpu_seconds, classes.host.gpu_seconds) == (150.0, 1200.0)
    assert (classes.process.failures, classes.host.failures, classes.covered) == (1.0, 0.0, 1.0)
    t.on_resume(200.0, 100)
    t.on_steps(260.0, 160, 60, 1.0)  # the first report after the restart counts 60 s
    t.on_restart(40.0)  # of which 40 were the restart: taken back
    assert (classes.process.gpu_seconds, classes.host.gpu_seconds) == (170.0, 1360.0)
    t.on_failure(300.0)  # not known: a host failure, not covered
    assert (classes.host.failures, classes.uncovered) == (1.0, 1.0)
    s = t.state()
    assert (s.process_mtbf_s, s.host_mtbf_s, s.jit_coverage) == (
        classes.process_mtbf_s,
        classes.host_mtbf_s(8),
        classes.coverage,
    )
    # a job whose failures another daemon counts teaches nothing here
    other = FailureClasses()
    u = JobTracker("k", failure_classes=other)
    u.counts_failures = False
    u.on_steps(0.0, 0, 0, 0.0)
    u.on_steps(50.0, 50, 50, 1.0)
    u.on_failure(60.0, "process")
    assert other == FailureClasses()


def test_job_state_defaults_keep_one_tier() -> None:
    s = JobState(job="j")
    assert (s.local_tier, s.last_durable_save_step, s.durable_anchor, s.jit_coverage) == (
        False,
        None,
        0,
        0.0,
    )


# ------------------------------------------------------------------ found by make mutants


def test_one_gpu_and_fractions_of_a_second_count_whole() -> None:
    c = FailureClasses()
    c.observe(0.5, gpus=1)
    c.observe(10.0, gpus=0)  # no GPU known: counted as one
    assert (c.process.gpu_seconds, c.host.gpu_seconds) == (10.5, 10.5)
    assert c.host_mtbf_s(1) == c.host.gpu_mtbf_s == c.host_mtbf_s(0)
    c.retract(0.25, gpus=1)
    assert (c.process.gpu_seconds, c.host.gpu_seconds) == (10.25, 10.25)


def test_every_count_round_trips_and_a_foreign_record_is_named() -> None:
    c = FailureClasses(covered=2.0, uncovered=3.0, prior_uncovered=0.5)
    back = FailureClasses.from_dict(json.loads(json.dumps(c.to_dict())))
    assert (back.covered, back.uncovered, back.prior_uncovered) == (2.0, 3.0, 0.5)
    with pytest.raises(ValueError) as err:
        FailureClasses.from_dict({"version": 99})
    assert str(err.value) == (
        "failure-class record has version 99, expected 1; discard it to start from the priors"
    )


def test_a_restart_in_place_is_learned_as_it_was_and_others_exposure_is_left_alone() -> None:
    t = JobTracker("j", local_tier=True)
    t.on_restart(0.5, tier="local")
    assert t.state().local_restore_s == 0.5
    # a job whose failures another daemon counts takes nothing back from a shared rate
    shared = FailureRate(gpu_seconds=1000.0)
    classes = FailureClasses()
    classes.observe(100.0, gpus=1)
    u = JobTracker("k", failure_rate=shared, failure_classes=classes)
    u.counts_failures = False
    u.on_steps(0.0, 0, 0, 0.0)
    u.on_steps(50.0, 50, 50, 1.0)
    u.on_restart(40.0)
    assert (shared.gpu_seconds, classes.process.gpu_seconds) == (1000.0, 100.0)


def test_a_foreign_failure_rate_record_is_named() -> None:
    with pytest.raises(ValueError) as err:
        FailureRate.from_dict({"version": 2})
    assert str(err.value) == (
        "failure-rate record has version 2, expected 1; discard it to start from the prior"
    )


def test_what_just_in_time_saves_taught_round_trips() -> None:
    """A daemon restart keeps the covered and uncovered failures and the just-in-time
    save durations (JitCoverage, adaptd/core/estimators.py); the policy sees the same state."""
    t = JobTracker("j", gpus=4)
    t.jit.saved(0.5)
    t.on_failure(10.0, covered=True)
    t.on_failure(20.0, covered=False)
    t.on_failure(30.0, covered=True)
    again = JobTracker("j", gpus=4)
    again.load_learned(t.learned())
    assert (again.jit.covered, again.jit.uncovered, again.jit.save_s) == (2, 1, 0.5)
    assert again.state().jit_coverage == t.state().jit_coverage == 0.5
