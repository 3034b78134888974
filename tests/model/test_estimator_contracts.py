"""The estimators' documented contracts, one by one: the window and jump of a level, the
weighted median, what a step batch shows, the failure-rate posterior's closed forms, and
the tracker's bookkeeping of exposure, saves, failures and what it persists.

tests/model/test_estimators.py shows the estimators converge on realistic streams; these
pin the edges those streams do not reach (found by ``make mutants``, docs/testing.md).
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics

import pytest

from adaptd.core.estimators import (
    LEVEL_JUMP,
    PRIOR_GPU_MTBF_S,
    SAVE_WINDOW,
    STEP_JUMP,
    STEP_OUTLIER,
    STEP_WINDOW,
    FailureRate,
    JobTracker,
    LevelEstimate,
    StepTime,
    extra_time_from_util,
    steady_part,
)

# ------------------------------------------------------------------ LevelEstimate


def test_the_documented_constants() -> None:
    assert (SAVE_WINDOW, LEVEL_JUMP, STEP_WINDOW, STEP_JUMP, STEP_OUTLIER) == (5, 2.0, 5, 1.5, 3.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 1}, "window must be >= 2 observations, got 1"),
        ({"jump": 1.0}, "jump must be a factor > 1, got 1.0"),
        ({"jump": math.nan}, "jump must be a factor > 1, got nan"),
    ],
)
def test_a_level_refuses_a_window_or_jump_that_cannot_work(kwargs, message) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        LevelEstimate(**kwargs)


def test_the_smallest_window_and_jump_are_accepted() -> None:
    est = LevelEstimate(window=2, jump=1.01)
    for v in (1.0, 2.0, 3.0):
        est.add(v)
    assert est.values() == [2.0, 3.0] and est.value == 2.5


@pytest.mark.parametrize(
    ("value", "weight", "message"),
    [
        (-1.0, 1.0, "observation must be a finite number >= 0, got -1.0"),
        (math.nan, 1.0, "observation must be a finite number >= 0, got nan"),
        (math.inf, 1.0, "observation must be a finite number >= 0, got inf"),
        (1.0, 0.0, "weight must be a finite number > 0, got 0.0"),
        (1.0, math.nan, "weight must be a finite number > 0, got nan"),
        (1.0, math.inf, "weight must be a finite number > 0, got inf"),
    ],
)
def test_a_level_refuses_observations_out_of_range(value, weight, message) -> None:
    est = LevelEstimate()
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        est.add(value, weight)
    assert est.value is None and est.values() == []
    est.add(0.0)  # zero seconds is a valid observation
    assert est.value == 0.0


def test_the_window_keeps_the_newest_five() -> None:
    est = LevelEstimate()
    assert est.value is None
    for v in (9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0):  # within a factor 2 of the level: no jump
        est.add(v)
    assert est.values() == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert est.value == 4.0


@pytest.mark.parametrize(
    ("second", "third", "level"),
    [
        (19.0, 19.0, 10.0),  # 1.9x twice: inside the factor, the median holds
        (21.0, 21.0, 21.0),  # 2.1x twice: the level jumps to them
        (5.1, 5.1, 10.0),
        (4.9, 4.9, 4.9),
        (21.0, 4.9, 10.0),  # beyond on opposite sides: no jump
        # exactly at the factor is not beyond it
        (21.0, 20.0, 10.0),
        (20.0, 21.0, 10.0),
        (4.9, 5.0, 10.0),
        (5.0, 4.9, 10.0),
    ],
)
def test_a_level_jumps_only_when_two_in_a_row_sit_beyond_the_factor_on_one_side(
    second, third, level
) -> None:
    est = LevelEstimate()
    for _ in range(3):
        est.add(10.0)
    est.add(second)
    est.add(third)
    assert est.value == pytest.approx(level)


def test_a_jump_needs_a_level_of_three_observations() -> None:
    # [10, 30]: no level yet to jump from; [10, 10, 30] then 30: the level (10) jumps
    est = LevelEstimate()
    for v in (10.0, 10.0, 30.0, 30.0):
        est.add(v)
    assert est.values() == [30.0, 30.0] and est.value == 30.0
    # two observations are no level: [10, 1] and a second 1 keep the 10 in the window
    est = LevelEstimate()
    for v in (10.0, 1.0, 1.0, 10.0):
        est.add(v)
    assert est.values() == [10.0, 1.0, 1.0, 10.0] and est.value == 5.5


@pytest.mark.parametrize(
    ("obs", "median"),
    [
        ([(1.0, 1.0), (2.0, 3.0)], 2.0),
        ([(1.0, 2.0), (2.0, 2.0)], 1.5),
        ([(1.0, 1.0), (2.0, 1.0), (3.0, 2.0)], 2.5),  # half the weight on either side
        ([(3.0, 1.0), (1.0, 1.0), (2.0, 5.0)], 2.0),
        ([(1.0, 0.1), (2.0, 0.1), (3.0, 0.1)], 2.0),
    ],
)
def test_the_weighted_median_splits_the_weight_in_half(obs, median) -> None:
    est = LevelEstimate(jump=100.0)
    for v, w in obs:
        est.add(v, w)
    assert est.value == pytest.approx(median)


def test_an_observation_without_a_weight_weighs_one() -> None:
    est = LevelEstimate(jump=100.0)
    est.add(1.0)
    est.add(5.0, 1.0)
    est.add(9.0, 1.0)
    assert est.value == 5.0
    est.load([1, 2, 3])  # loaded values too: the plain median once a fourth comes
    est.add(4.0)
    assert est.value == 2.5


def test_equal_weights_give_the_plain_median() -> None:
    rng = random.Random(5)
    for n in range(1, 6):
        for _ in range(20):
            vals = [rng.choice((1.0, 2.0, 3.0, 5.0, 8.0)) for _ in range(n)]
            est = LevelEstimate(jump=100.0)
            for v in vals:
                est.add(v)
            assert est.value == statistics.median(vals)


def test_a_level_loads_the_newest_of_what_the_store_kept() -> None:
    est = LevelEstimate()
    est.load([1, 2, 3, 4, 5, 6, 7])
    assert est.values() == [3.0, 4.0, 5.0, 6.0, 7.0] and est.value == 5.0
    # the last loaded value is the previous observation of the jump rule
    est.add(16.0)
    est.add(16.0)
    assert est.value == 16.0
    est = LevelEstimate()
    est.load([5.0, 5.0, 5.0, 11.0])
    est.add(11.0)  # 11 after a loaded 11, both beyond 2 x 5: the level jumps
    assert est.value == 11.0
    est.load([])
    assert est.value is None and est.values() == []


# ------------------------------------------------------------------ steady_part / StepTime


@pytest.mark.parametrize(
    ("args", "kwargs", "part"),
    [
        ((0, 1.0), {}, None),  # no steps
        ((-3, 1.0), {}, None),
        ((10, math.nan), {}, None),
        ((10, -1.0), {}, None),
        ((10, math.inf), {}, None),
        ((10, 0.0), {}, (10, 0.0)),
        ((10, 1.0), {}, (10, 1.0)),  # slowest step not measured: all of it
        ((10, 1.0), {"warmup": True}, None),  # a warm-up not measured shows nothing
        ((10, 1.0), {"max_s": math.inf}, (10, 1.0)),  # not a measurement
        # the slowest at 5.5 s against a rest of 4.5 s / 9 = 0.5 s: 11x, left out
        ((10, 1.0), {"max_s": 5.5}, (9, 0.5)),
        # 1.4 s against 8.6 / 9 = 0.956 s: not 3x, kept
        ((10, 1.0), {"max_s": 1.4}, (10, 1.0)),
        # exactly 3x (3 s against (6 − 3) / 3 = 1 s) is not beyond it
        ((4, 1.5), {"max_s": 3.0}, (4, 1.5)),
        # a warm-up step is left out however fast
        ((4, 1.5), {"max_s": 1.5, "warmup": True}, (3, 1.5)),
        # a call of 2 steps: 8 s for 2 against (20 − 8) / 8 = 1.5 s: 2.67x per step, kept
        ((10, 2.0), {"max_s": 8.0, "max_steps": 2}, (10, 2.0)),
        ((10, 2.0), {"max_s": 10.0, "max_steps": 2}, (8, 1.25)),
        # max_steps 0 is one step; more steps than the batch is the whole batch
        ((10, 1.0), {"max_s": 5.5, "max_steps": 0}, (9, 0.5)),
        ((3, 1.0), {"max_s": 3.0, "max_steps": 5}, (3, 1.0)),
        ((3, 1.0), {"max_s": 3.0, "max_steps": 5, "warmup": True}, None),
        ((1, 4.0), {"max_s": 4.0}, (1, 4.0)),
        ((1, 4.0), {"max_s": 4.0, "warmup": True}, None),
        # a slowest step longer than the whole batch (clock skew) leaves a rest of 0 s
        ((2, 1.0), {"max_s": 5.0}, (1, 0.0)),
        # sub-second steps: 0.55 s against (1 − 0.55) / 9 = 0.05 s, left out
        ((10, 0.1), {"max_s": 0.55}, (9, 0.05)),
    ],
)
def test_what_a_step_batch_shows_of_the_pace(args, kwargs, part) -> None:
    got = steady_part(*args, **kwargs)
    if part is None:
        assert got is None
    else:
        assert got is not None and got[0] == part[0] and got[1] == pytest.approx(part[1])


def test_step_time_counts_what_it_leaves_out() -> None:
    st = StepTime()
    st.add(1, 3.0, max_s=3.0, warmup=True)  # the compile alone
    assert st.value is None and st.ignored_steps == 1
    st.add(10, 0.3, max_s=2.1)  # 2.1 s against 0.1 s: left out
    assert st.value == pytest.approx(0.1) and st.ignored_steps == 2
    st.add(0, 0.1)
    st.add(50, 0.0)  # zero-time steps teach nothing, however many
    assert st.value == pytest.approx(0.1) and st.ignored_steps == 2
    st.add(10, 0.2, warmup=True)
    assert st.ignored_steps == 12


def test_step_time_weighs_batches_by_their_steps() -> None:
    st = StepTime(jump=100.0)
    st.add(50, 0.02)
    st.add(1, 0.05)
    st.add(1, 0.05)
    assert st.value == pytest.approx(0.02)


def test_step_time_follows_a_phase_one_and_a_half_times_slower() -> None:
    st = StepTime()
    for _ in range(3):
        st.add(10, 0.1)
    st.add(10, 0.16)
    st.add(10, 0.16)
    assert st.value == pytest.approx(0.16)
    st = StepTime()
    for _ in range(3):
        st.add(10, 0.1)
    st.add(10, 0.14)
    st.add(10, 0.14)
    assert st.value == pytest.approx(0.1)


def test_step_time_loads_a_learned_value_or_nothing() -> None:
    st = StepTime()
    st.load(0.25)
    assert st.value == 0.25
    st.load(None)
    assert st.value is None


# ------------------------------------------------------------------ FailureRate


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prior_gpu_mtbf_s": math.inf}, "prior_gpu_mtbf_s must be > 0 seconds, got inf"),
        ({"prior_gpu_mtbf_s": math.nan}, "prior_gpu_mtbf_s must be > 0 seconds, got nan"),
        ({"prior_gpu_mtbf_s": -1.0}, "prior_gpu_mtbf_s must be > 0 seconds, got -1.0"),
        ({"prior_failures": 0.0}, "prior_failures must be > 0, got 0.0"),
        ({"gpu_seconds": -1.0}, "failures and gpu_seconds must be >= 0, got 0.0, -1.0"),
        ({"failures": -1.0}, "failures and gpu_seconds must be >= 0, got -1.0, 0.0"),
    ],
)
def test_a_failure_rate_refuses_impossible_figures(kwargs, message) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FailureRate(**kwargs)


def test_the_posterior_is_gamma_of_failures_and_gpu_seconds() -> None:
    fr = FailureRate(prior_gpu_mtbf_s=1000.0, prior_failures=2.0)
    assert (fr.alpha, fr.beta, fr.gpu_mtbf_s) == (2.0, 2000.0, 1000.0)
    fr.observe(3999.5)
    fr.observe(0.5)
    fr.observe(0.0)
    fr.observe(-50.0)  # no exposure to take back here
    fr.failure()
    fr.failure(3)
    fr.failure(0)
    assert (fr.failures, fr.gpu_seconds) == (4.0, 4000.0)
    assert (fr.alpha, fr.beta) == (6.0, 6000.0)
    assert fr.gpu_mtbf_s == 1000.0
    with pytest.raises(ValueError, match=r"^failure count must be >= 0, got -1$"):
        fr.failure(-1)


def test_any_positive_prior_is_accepted() -> None:
    assert FailureRate(prior_gpu_mtbf_s=0.5, prior_failures=0.01).gpu_mtbf_s == 0.5
    assert JobTracker("j", gpu_mtbf_s=0.5).mtbf_s == 0.5


def test_the_default_prior_is_one_pseudo_failure_at_llama3s_rate() -> None:
    fr = FailureRate()
    assert (fr.prior_failures, fr.failures, fr.gpu_seconds) == (1.0, 0.0, 0.0)
    assert fr.beta == PRIOR_GPU_MTBF_S


def test_credible_mtbf_has_the_closed_form_of_one_pseudo_failure() -> None:
    """With α = 1 the rate is exponential of rate β: its (1−q) quantile is −ln q / β, so
    the MTBF's q quantile is β / −ln q."""
    fr = FailureRate(prior_gpu_mtbf_s=1e6)
    for q in (0.05, 0.5, 0.95):
        assert fr.credible_mtbf_s(q) == pytest.approx(1e6 / -math.log(q), rel=1e-9)
    for q in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match=rf"^quantile must be in \(0, 1\), got {q}$"):
            fr.credible_mtbf_s(q)


def test_a_failure_rate_round_trips_every_field_and_refuses_foreign_records() -> None:
    fr = FailureRate(prior_gpu_mtbf_s=123.0, prior_failures=2.5, failures=7.0, gpu_seconds=9.5)
    d = json.loads(json.dumps(fr.to_dict()))
    assert d == {
        "version": 1,
        "prior_gpu_mtbf_s": 123.0,
        "prior_failures": 2.5,
        "failures": 7.0,
        "gpu_seconds": 9.5,
    }
    back = FailureRate.from_dict(d)
    assert back == fr
    assert all(isinstance(getattr(back, f), float) for f in d if f != "version")
    ints = FailureRate.from_dict({**d, "failures": 7, "gpu_seconds": 9})
    assert isinstance(ints.failures, float) and isinstance(ints.gpu_seconds, float)
    with pytest.raises(ValueError, match=r"^failure-rate record has version 2, expected 1; "):
        FailureRate.from_dict({**d, "version": 2})
    with pytest.raises(ValueError, match=r"has version None"):
        FailureRate.from_dict({})


# ------------------------------------------------------------------ extra_time_from_util


@pytest.mark.parametrize(
    ("before", "during", "in_flight", "extra"),
    [
        (0.8, 0.6, 10.0, 2.5),
        (0.8, 0.6, 0.0, 0.0),  # nothing in flight
        (0.8, 0.6, -1.0, 0.0),
        (0.0, 0.6, 10.0, 0.0),  # an idle GPU loses nothing (and is no division by 0)
        (-0.1, 0.6, 10.0, 0.0),
        (0.6, 0.8, 10.0, 0.0),  # busier during the write
        (0.8, 0.6, 0.5, 0.125),  # a write of half a second
    ],
)
def test_extra_time_is_the_utilisation_a_write_took(before, during, in_flight, extra) -> None:
    assert extra_time_from_util(before, during, in_flight) == pytest.approx(extra)


# ------------------------------------------------------------------ JobTracker


def test_a_new_tracker_knows_nothing_but_its_settings() -> None:
    s = JobTracker("j").state()
    assert (s.job, s.step, s.time, s.world_size, s.gpus, s.start_step) == ("j", 0, 0.0, 1, 1, 0)
    assert (s.last_save_step, s.last_save_time, s.last_durable_step) == (None, None, None)
    assert (s.save_in_flight, s.saves, s.save_cost_s, s.save_latency_s) == (False, 0, None, None)
    assert (s.restore_s, s.time_since_failure_s, s.state_bytes, s.step_time_s) == (
        None,
        None,
        None,
        None,
    )
    assert s.mtbf_s == pytest.approx(PRIOR_GPU_MTBF_S)
    t = JobTracker("k", world_size=4, gpus=0, start_step=700, state_bytes=10, gpu_mtbf_s=8e5)
    s = t.state()
    assert (s.world_size, s.gpus, s.start_step, s.step, s.state_bytes) == (4, 1, 700, 700, 10)
    assert (t.failures, t.failed_saves, t.gpu_mtbf_s, s.mtbf_s) == (0, 0, 8e5, 8e5)
    assert JobTracker("k", gpus=8, gpu_mtbf_s=8e5).mtbf_s == 1e5
    with pytest.raises(ValueError, match=r"^gpu_mtbf_s must be > 0, got 0$"):
        JobTracker("k", gpu_mtbf_s=0)


def test_a_tracker_uses_the_host_failure_rate_it_is_given() -> None:
    shared = FailureRate(prior_gpu_mtbf_s=5e5)
    a, b = JobTracker("a", failure_rate=shared), JobTracker("b", failure_rate=shared)
    a.on_failure(10.0)
    assert b.failure_rate is shared and shared.failures == 1


def test_step_reports_move_the_clock_and_step_forward_only() -> None:
    t = JobTracker("j", gpus=2)
    t.on_steps(10.0, 100, 100, 0.1, save_in_flight=True)
    t.on_steps(5.0, 50, 0, 0.0)  # late and out of order: moves nothing back
    s = t.state()
    assert (s.time, s.step, s.save_in_flight, s.step_time_s) == (10.0, 100, False, 0.1)
    t.on_steps(12.0, 120, 20, 0.1, save_in_flight=True, max_s=0.9)  # 0.9 s: an outlier
    assert t.state().save_in_flight and t.step_time_s == pytest.approx(0.1)
    assert t.time_since_failure_s() == 2.0  # its life started at the first report
    assert t.time_since_failure_s(now=25.0) == 15.0
    assert t.time_since_failure_s(now=0.0) == 0.0
    t.on_steps(13.0, 121, 1, 5.0, max_s=5.0, warmup=True)  # a warm-up batch teaches nothing
    assert t.step_time_s == pytest.approx(0.1)
    # the slowest call covered 2 steps: 8 s for 2 against 1.5 s for the rest is not 3x
    u = JobTracker("u")
    u.on_steps(1.0, 10, 10, 2.0, max_s=8.0, max_steps=2)
    assert u.step_time_s == 2.0


def test_state_takes_the_fields_the_tracker_does_not_own() -> None:
    s = JobTracker("j").state(urgent="operator", storage_target="nfs")
    assert (s.urgent, s.storage_target, s.job) == ("operator", "nfs", "j")


def test_a_restart_takes_back_only_what_this_tracker_counted() -> None:
    """The host's posterior is shared: a job's restart must not eat another job's
    exposure, whether it comes before any report, after a failure or after a resume."""
    shared = FailureRate(gpu_seconds=1000.0)
    fresh = JobTracker("a", failure_rate=shared)
    fresh.on_restart(60.0)
    assert shared.gpu_seconds == 1000.0
    failed = JobTracker("b", failure_rate=shared)
    failed.on_steps(0.0, 1, 1, 1.0)
    failed.on_steps(30.0, 2, 1, 1.0)
    failed.on_failure(40.0)
    assert shared.gpu_seconds == 1040.0
    failed.on_restart(60.0)
    assert shared.gpu_seconds == 1040.0
    resumed = JobTracker("c", failure_rate=shared)
    resumed.on_resume(100.0, 0)
    resumed.on_restart(60.0)
    assert shared.gpu_seconds == 1040.0
    resumed.on_steps(130.0, 5, 5, 1.0)
    resumed.on_restart(0.5)  # half a second down: half a GPU-second back
    assert shared.gpu_seconds == 1069.5


def test_watched_exposure_is_the_time_between_reports_times_the_gpus() -> None:
    fr = FailureRate()
    t = JobTracker("j", gpus=4, failure_rate=fr)
    t.on_steps(100.0, 1, 1, 0.1)  # the first report starts the watch
    assert fr.gpu_seconds == 0.0
    t.on_steps(150.0, 2, 1, 0.1)
    t.on_steps(140.0, 3, 1, 0.1)  # behind the watch: nothing
    assert fr.gpu_seconds == 200.0
    t.on_failure(175.0)  # up to the failure counts, then the watch stops
    assert (fr.gpu_seconds, fr.failures, t.failures) == (300.0, 1.0, 1)
    t.on_steps(500.0, 4, 1, 0.1)  # the next report restarts it
    assert fr.gpu_seconds == 300.0
    t.on_steps(510.0, 5, 1, 0.1)
    assert fr.gpu_seconds == 340.0
    t.on_failure(505.0)  # a failure dated before the last report adds nothing
    assert fr.gpu_seconds == 340.0 and fr.failures == 2.0


def test_a_restart_takes_back_at_most_the_last_report_s_exposure() -> None:
    fr = FailureRate()
    t = JobTracker("j", gpus=2, failure_rate=fr)
    t.on_steps(0.0, 1, 1, 1.0)
    t.on_steps(100.0, 2, 1, 1.0)
    t.on_steps(130.0, 3, 1, 1.0)  # 30 s since the last report: 60 GPU-seconds
    t.on_restart(50.0)  # down 50 s, but only 30 were counted
    assert fr.gpu_seconds == 200.0
    t.on_restart(50.0)  # nothing left to take back
    assert fr.gpu_seconds == 200.0
    t.on_steps(140.0, 4, 1, 1.0)
    t.on_restart(4.0)  # 20 GPU-seconds counted, 8 taken back
    assert fr.gpu_seconds == 212.0
    assert t.restore_s == 50.0  # the median of 50, 50, 4
    t.on_restart(-5.0)  # a clock step back is a restart of 0 s; two short ones: a new level
    assert t.learned()["restores_s"] == [4.0, 0.0] and t.restore_s == 2.0


def test_a_failure_stops_the_save_in_flight_and_dates_the_age() -> None:
    t = JobTracker("j")
    t.on_steps(10.0, 100, 100, 0.1)
    t.on_save_requested(11.0, 100)
    assert t.state().save_in_flight
    t.on_failure(20.0)
    assert t.state().save_in_flight is False
    assert t.last_failure_time == 20.0
    assert t.time_since_failure_s(now=50.0) == 30.0


def test_a_resume_starts_a_new_life_from_the_checkpoint() -> None:
    fr = FailureRate()
    t = JobTracker("j", gpus=2, failure_rate=fr)
    t.on_steps(10.0, 900, 900, 0.01)
    t.on_save_requested(8.0, 400)
    t.on_save_report(9.0, 400, blocking_s=0.5, durable_s=2.0)
    t.on_save_requested(10.0, 900)
    t.on_resume(30.0, 600)
    s = t.state()
    assert (s.start_step, s.step, s.time, s.save_in_flight) == (600, 600, 30.0, False)
    assert (s.last_save_step, s.last_durable_step, s.last_save_time) == (600, 400, None)
    assert t.life_start == 30.0
    t.on_steps(40.0, 610, 10, 0.01)  # the watch restarted at the resume
    assert fr.gpu_seconds == 20.0
    t.on_restart(25.0)  # only the 10 s counted since the resume are taken back
    assert fr.gpu_seconds == 0.0
    t.on_resume(5.0, 610)  # a resume dated earlier does not move the clock back
    assert t.state().time == 40.0


def test_save_reports_teach_cost_and_latency_only_when_they_succeed() -> None:
    t = JobTracker("j")
    t.on_save_requested(1.0, 100)
    assert (t.last_save_step, t.last_save_time, t.state().save_in_flight) == (100, 1.0, True)
    t.on_save_report(2.0, 100, blocking_s=1.0, durable_s=0.5, extra_step_s=0.25)
    s = t.state()
    assert (s.saves, s.save_cost_s, s.save_latency_s, s.last_durable_step) == (1, 1.25, 1.0, 100)
    assert (s.save_in_flight, s.time, s.last_save_time) == (False, 2.0, 1.0)
    t.on_save_report(2.5, 100, blocking_s=9.0, durable_s=9.0, ok=False)
    t.on_save_report(3.0, 200, blocking_s=9.0, durable_s=9.0, ok=False)
    assert (t.failed_saves, t.saves, t.save_cost_s, t.last_durable_step) == (2, 1, 1.25, 100)
    assert (t.last_save_step, t.last_save_time) == (200, 3.0)  # a report of a newer step
    t.on_save_report(4.0, 150, blocking_s=1.0, durable_s=3.0, gpu_sag_s=0.75)
    assert (t.last_save_step, t.last_save_time, t.last_durable_step) == (200, 3.0, 150)
    assert t.learned()["save_costs_s"] == [1.25, 1.75]  # the sag, larger than no extra
    t.on_save_report(5.0, 120, blocking_s=1.0, durable_s=3.0, extra_step_s=0.5, gpu_sag_s=0.25)
    assert t.learned()["save_costs_s"] == [1.25, 1.75, 1.5]
    assert t.last_durable_step == 150  # an older save does not move it back
    assert t.learned()["save_latencies_s"] == [1.0, 3.0, 3.0]


def test_a_save_of_step_0_is_durable_at_step_0() -> None:
    t = JobTracker("j")
    t.on_save_report(1.0, 0, blocking_s=1.0, durable_s=2.0)
    assert t.state().last_durable_step == 0


def test_everything_learned_round_trips_and_missing_parts_keep_their_defaults() -> None:
    t = JobTracker("j")
    for i, (cost, lat) in enumerate([(1.0, 4.0), (1.5, 5.0), (2.0, 6.0)]):
        t.on_save_report(float(i), i, blocking_s=cost, durable_s=lat)
    t.on_restart(30.0)
    t.on_restart(40.0)
    t.on_steps(1.0, 10, 10, 0.05)
    t.on_failure(2.0)
    t.on_failure(3.0)
    data = json.loads(json.dumps(t.learned()))
    assert data == {
        "version": 1,
        "save_costs_s": [1.0, 1.5, 2.0],
        "save_latencies_s": [4.0, 5.0, 6.0],
        "restores_s": [30.0, 40.0],
        "step_time_s": 0.05,
        "saves": 3,
        "failures": 2,
    }
    u = JobTracker("j")
    u.load_learned(data)
    assert u.learned() == data
    assert (u.save_cost_s, u.save_latency_s, u.restore_s, u.step_time_s) == (1.5, 5.0, 35.0, 0.05)
    v = JobTracker("j")
    v.saves, v.failures = 4, 6
    v.load_learned({"version": 1})
    assert (v.save_cost_s, v.restore_s, v.step_time_s, v.saves, v.failures) == (
        None,
        None,
        None,
        4,
        6,
    )
    v.load_learned({"version": 1, "step_time_s": "0.5", "saves": "7", "failures": 2.0})
    assert (v.step_time_s, v.saves, v.failures) == (0.5, 7, 2)
    with pytest.raises(ValueError, match=r"^learned record for job 'j' has version 2, expected 1"):
        v.load_learned({"version": 2})
