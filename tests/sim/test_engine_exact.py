"""Runs of the engine worked out by hand on failure traces, with half-second steps (so
seconds and steps cannot be confused), a slowed write, and failures that strike during
a restart. (Found missing by ``make mutants``: the statistical checks of test_theory.py
are slow, and the fast tests used one-second steps.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from adaptd import sim
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import Policy
from adaptd.core.snapshot import (
    Decision,
    FleetSample,
    GpuSample,
    JobState,
    Snapshot,
    StorageSample,
)
from adaptd.fleet.history import FleetHistory
from adaptd.policies import Fixed
from adaptd.sim.engine import JOB, PID, TARGET, FailureClock, RunResult, _Run


def traced(trace: list[float], latency_s: float, slowdown: float) -> sim.Scenario:
    return sim.from_dict(
        {
            "job": {"steps": 3000, "step_time_s": 0.5},
            "checkpoint": {
                "blocking_s": 5.0,
                "latency_s": latency_s,
                "slowdown": slowdown,
                "restore_s": 60.0,
            },
            "failures": {"trace": trace},
        }
    )


def test_failures_during_a_restart_restart_it_again() -> None:
    # saves every 500 steps (250 s), 5 s each, durable at once: at t = 1000 the job is
    # 235 s (470 steps) past its save at step 1500 (t = 765). The restart would end at
    # 1060 but fails at 1030 (30 s), restarts until 1090, runs 10 s and fails at 1100
    # (20 steps lost), restarts 60 s more.
    r = sim.run(traced([1000.0, 1030.0, 1100.0], 5.0, 0.0), Fixed(steps=500), 0)
    assert r == RunResult(
        wall_s=1920.0,
        useful_s=1500.0,
        checkpoint_overhead_s=25.0,  # saves at 500, 1000, 1500, then 2000, 2500
        lost_work_s=235.0 + 10.0,
        restart_s=60.0 + 30.0 + 60.0,
        warmup_s=0.0,
        saves=5,
        failures=3,
    )


def test_a_failure_while_the_write_runs_loses_the_save() -> None:
    # the save at step 500 (t = 250) blocks 5 s and writes until 355 at 80% speed
    # (1.6 steps/s); at 300, 45 s into the write, the job is at step 500 + 72 and
    # nothing is durable: all 572 steps are lost, and the save cost 5 + 0.2·45 s
    r = sim.run(traced([300.0], 105.0, 0.2), Fixed(steps=500), 0)
    assert r == RunResult(
        wall_s=1985.0,
        useful_s=1500.0,
        checkpoint_overhead_s=14.0 + 5 * (5.0 + 0.2 * 100.0),
        lost_work_s=572 * 0.5,
        restart_s=60.0,
        warmup_s=0.0,
        saves=6,
        failures=1,
    )


def test_a_failure_after_the_write_keeps_the_save() -> None:
    # durable at 355: 100 s slowed (160 steps) then 45 s at full speed (90 steps)
    r = sim.run(traced([400.0], 105.0, 0.2), Fixed(steps=500), 0)
    assert (r.lost_work_s, r.checkpoint_overhead_s, r.saves) == (250 * 0.5, 5 * 25.0, 5)
    assert r.wall_s == 1500.0 + 125.0 + 125.0 + 60.0


# ------------------------------------------------------------------------------------
# Every message the tracker hears and every snapshot a policy sees, worked out by hand.
# Half-second steps with a 3 s first step (2.5 s of warm-up), saves blocking 1 s and
# durable 3 s after their call, at half speed meanwhile, and a restart of 4 s; all the
# figures are exact binary fractions, so they are compared with ==.

GPU_IDLE = (GpuSample(index=0, uuid="sim-gpu-0", util_sm=1.0, pids=(PID,)),)
GPU_WRITING = (GpuSample(index=0, uuid="sim-gpu-0", util_sm=0.5, pids=(PID,)),)


def storage(busy: float, writing: bool) -> tuple[StorageSample, ...]:
    return (
        StorageSample(
            target=TARGET,
            mountpoint="/sim",
            busy_fraction=busy,
            jobs=(JOB,),
            writing_jobs=(JOB,) if writing else (),
        ),
    )


class Told(JobTracker):
    """The real tracker, logging every input the engine gives it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []

    def on_steps(self, time, step, count, mean_s, save_in_flight=False, **kw) -> None:
        self.log.append(("steps", time, step, count, mean_s, save_in_flight, kw))
        super().on_steps(time, step, count, mean_s, save_in_flight, **kw)

    def on_save_requested(self, time, step) -> None:
        self.log.append(("requested", time, step))
        super().on_save_requested(time, step)

    def on_save_report(self, time, step, **kw) -> None:
        self.log.append(("saved", time, step, kw))
        super().on_save_report(time, step, **kw)

    def on_failure(self, time) -> None:
        self.log.append(("failure", time))
        super().on_failure(time)

    def on_resume(self, time, step) -> None:
        self.log.append(("resume", time, step))
        super().on_resume(time, step)

    def on_restart(self, restore_s) -> None:
        self.log.append(("restart", restore_s))
        super().on_restart(restore_s)


@dataclass
class Seen:
    """A policy that logs what it is shown into the tracker's log, then asks ``inner``."""

    log: list[tuple]
    inner: Policy
    fleet: FleetSample | None = None  # what every snapshot must say of the fleet

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        assert (job.job, job.storage_target, job.pids) == (JOB, TARGET, (PID,))
        assert snapshot.fleet is self.fleet
        assert job.time == snapshot.time
        self.log.append(("decide", snapshot.time, job.step, snapshot.gpus, snapshot.storage))
        return self.inner.decide(snapshot, job)


def told(scenario: sim.Scenario, policy: Policy) -> tuple[RunResult, list[tuple]]:
    r = _Run(scenario, Fixed(steps=1), 0)
    r.tracker = Told(JOB, gpus=scenario.gpus)
    r.policy = Seen(r.tracker.log, policy)
    return r.run(), r.tracker.log


def warm(trace: list[float], phases: list[dict] | None = None) -> sim.Scenario:
    return sim.from_dict(
        {
            "job": {"steps": 20, "step_time_s": 0.5, "first_step_s": 3.0},
            "checkpoint": {"blocking_s": 1.0, "latency_s": 3.0, "slowdown": 0.5, "restore_s": 4.0},
            "failures": {"trace": trace},
            "phases": phases or [],
        }
    )


FIRST = {"max_s": 3.0, "warmup": True}  # the first step of an incarnation, alone
PACE = {"max_s": 0.0, "warmup": False}
SAVED = {"blocking_s": 1.0, "durable_s": 3.0, "extra_step_s": 0.5 * 2.0}


def test_a_slowed_phase_and_a_failure_during_its_write_as_the_tracker_hears_them() -> None:
    # saves every 8 steps; from t = 10 to 20 storage is slowed: saves block 2x, write 4x
    s = warm([16.0], [{"start_s": 10.0, "end_s": 20.0, "blocking_factor": 2.0,
                       "latency_factor": 4.0}])  # fmt: skip
    idle, writing = storage(0.0, False), storage(0.0, True)
    slow_idle, slow_writing = storage(0.75, False), storage(0.75, True)  # 1 - 1/4 taken
    r, log = told(s, Fixed(steps=8))
    assert log == [
        ("resume", 0.0, 0),
        ("decide", 0.0, 0, GPU_IDLE, idle),
        # warm-up until 2.5, the first step ends at 3: reported alone, as the warm-up
        ("steps", 3.0, 1, 1, 3.0, False, FIRST),
        ("decide", 3.0, 1, GPU_IDLE, idle),
        # a second later (2 steps), the first report of the job's pace
        ("steps", 4.0, 3, 2, 0.5, False, PACE),
        ("decide", 4.0, 3, GPU_IDLE, idle),
        # step 8 at 6.5: the save blocks to 7.5 and is durable at 9.5, at half speed
        ("steps", 6.5, 8, 5, 0.5, False, PACE),
        ("requested", 6.5, 8),
        ("decide", 7.5, 8, GPU_WRITING, writing),
        ("steps", 9.5, 10, 2, 1.0, False, PACE),  # 2 s for 2 steps
        ("saved", 9.5, 8, SAVED),
        ("decide", 9.5, 10, GPU_IDLE, idle),
        # the phase begins at 10: a decision, shown the target 3/4 busy
        ("steps", 10.0, 11, 1, 0.5, False, PACE),
        ("decide", 10.0, 11, GPU_IDLE, slow_idle),
        # step 16 at 12.5: blocks 2 s, durable 12 s after the call (24.5)
        ("steps", 12.5, 16, 5, 0.5, False, PACE),
        ("requested", 12.5, 16),
        ("decide", 14.5, 16, GPU_WRITING, slow_writing),
        # the failure at 16, 1.5 s into the write (1.5 steps at half speed): step 17.5
        ("steps", 16.0, 17, 1, 1.5, True, PACE),
        ("failure", 16.0),
        # restarted at 20 (the phase is over) from step 8
        ("resume", 20.0, 8),
        ("decide", 20.0, 8, GPU_IDLE, idle),
        ("steps", 23.0, 9, 1, 3.0, False, FIRST),
        ("restart", 7.0),  # vanished at 16, heard at 23
        ("decide", 23.0, 9, GPU_IDLE, idle),
        ("steps", 24.0, 11, 2, 0.5, False, PACE),
        ("decide", 24.0, 11, GPU_IDLE, idle),
        ("steps", 26.5, 16, 5, 0.5, False, PACE),
        ("requested", 26.5, 16),
        ("decide", 27.5, 16, GPU_WRITING, writing),
        ("steps", 29.5, 18, 2, 1.0, False, PACE),
        ("saved", 29.5, 16, SAVED),
        ("decide", 29.5, 18, GPU_IDLE, idle),
    ]
    # two steps more at full speed end the run at 30.5
    assert r == RunResult(
        wall_s=30.5,
        useful_s=10.0,
        checkpoint_overhead_s=(1.0 + 0.5 * 2.0) + (2.0 + 0.5 * 1.5) + (1.0 + 0.5 * 2.0),
        lost_work_s=(17.5 - 8) * 0.5,
        restart_s=4.0,
        warmup_s=2 * 2.5,
        saves=3,
        failures=1,
    )


def test_the_run_ends_inside_a_slowed_write() -> None:
    # as above without the failure: at 14.5 the write runs until 24.5, so the last 4
    # steps take 4 s at half speed and the run ends at 18.5 with that write in flight
    s = warm([], [{"start_s": 10.0, "end_s": 20.0, "blocking_factor": 2.0,
                   "latency_factor": 4.0}])  # fmt: skip
    r, log = told(s, Fixed(steps=8))
    assert log[-1] == ("decide", 14.5, 16, GPU_WRITING, storage(0.75, True))
    assert r == RunResult(
        wall_s=18.5,
        useful_s=10.0,
        checkpoint_overhead_s=(1.0 + 0.5 * 2.0) + (2.0 + 0.5 * 4.0),
        lost_work_s=0.0,
        restart_s=0.0,
        warmup_s=2.5,
        saves=2,
        failures=0,
    )


def test_failures_while_a_save_blocks_and_during_the_warm_up() -> None:
    r, log = told(warm([7.0, 12.0]), Fixed(steps=8))
    idle = storage(0.0, False)
    assert log == [
        ("resume", 0.0, 0),
        ("decide", 0.0, 0, GPU_IDLE, idle),
        ("steps", 3.0, 1, 1, 3.0, False, FIRST),
        ("decide", 3.0, 1, GPU_IDLE, idle),
        ("steps", 4.0, 3, 2, 0.5, False, PACE),
        ("decide", 4.0, 3, GPU_IDLE, idle),
        ("steps", 6.5, 8, 5, 0.5, False, PACE),
        ("requested", 6.5, 8),
        # the failure at 7, half-way through the blocking: nothing saved, 8 steps lost
        ("failure", 7.0),
        ("resume", 11.0, 0),
        ("decide", 11.0, 0, GPU_IDLE, idle),
        # the next, 1 s into the warm-up: no step was done, none is reported
        ("failure", 12.0),
        ("resume", 16.0, 0),
        ("decide", 16.0, 0, GPU_IDLE, idle),
        ("steps", 19.0, 1, 1, 3.0, False, FIRST),
        ("restart", 7.0),  # from the last vanishing (12) to the first step heard
        ("decide", 19.0, 1, GPU_IDLE, idle),
        ("steps", 20.0, 3, 2, 0.5, False, PACE),
        ("decide", 20.0, 3, GPU_IDLE, idle),
        ("steps", 22.5, 8, 5, 0.5, False, PACE),
        ("requested", 22.5, 8),
        ("decide", 23.5, 8, GPU_WRITING, storage(0.0, True)),
        ("steps", 25.5, 10, 2, 1.0, False, PACE),
        ("saved", 25.5, 8, SAVED),
        ("decide", 25.5, 10, GPU_IDLE, idle),
        ("steps", 28.5, 16, 6, 0.5, False, PACE),
        ("requested", 28.5, 16),
        ("decide", 29.5, 16, GPU_WRITING, storage(0.0, True)),
        ("steps", 31.5, 18, 2, 1.0, False, PACE),
        ("saved", 31.5, 16, SAVED),
        ("decide", 31.5, 18, GPU_IDLE, idle),
    ]
    assert r == RunResult(
        wall_s=32.5,
        useful_s=10.0,
        checkpoint_overhead_s=0.5 + 2 * (1.0 + 0.5 * 2.0),
        lost_work_s=8 * 0.5,
        restart_s=4.0 + 4.0,
        warmup_s=2.5 + 1.0 + 2.5,
        saves=2,
        failures=2,
    )


@dataclass(frozen=True)
class OnceAtStep3:
    """Plans nothing; asks for an urgent save once step 3 is done, if none was made."""

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        urgent = job.step >= 3 and job.last_save_step is None
        return Decision(next_step=None, urgent=urgent)


def test_an_urgent_save_is_made_at_the_next_step_and_a_plan_of_none_saves_no_more() -> None:
    # no warm-up, a synchronous save (durable when the loop resumes), no failure
    s = sim.from_dict(
        {
            "job": {"steps": 20, "step_time_s": 0.5},
            "checkpoint": {"blocking_s": 1.0},
            "failures": {"trace": []},
        }
    )
    r, log = told(s, OnceAtStep3())
    idle = storage(0.0, False)
    assert log == [
        ("resume", 0.0, 0),
        ("decide", 0.0, 0, GPU_IDLE, idle),
        ("steps", 0.5, 1, 1, 0.5, False, {"max_s": 0.5, "warmup": True}),
        ("decide", 0.5, 1, GPU_IDLE, idle),
        ("steps", 1.5, 3, 2, 0.5, False, PACE),
        ("decide", 1.5, 3, GPU_IDLE, idle),  # urgent: save once step 4 is done
        ("steps", 2.0, 4, 1, 0.5, False, PACE),
        ("requested", 2.0, 4),
        ("saved", 3.0, 4, {"blocking_s": 1.0, "durable_s": 1.0, "extra_step_s": 0.0}),
        ("decide", 3.0, 4, GPU_IDLE, idle),
    ]
    assert r == RunResult(11.0, 10.0, 1.0, 0.0, 0.0, 0.0, saves=1, failures=0)


def test_a_failure_during_a_later_restart_adds_to_the_restart_time() -> None:
    # 7: in the first save's blocking (6.5 to 7.5), 8 steps lost; back at 11 from step 0.
    # 12: 1 s into the warm-up; the restart from 12 fails at 14 and ends at 18
    r, log = told(warm([7.0, 12.0, 14.0]), Fixed(steps=8))
    assert [e for e in log if e[0] in ("failure", "resume", "restart")] == [
        ("resume", 0.0, 0),
        ("failure", 7.0),
        ("resume", 11.0, 0),
        ("failure", 12.0),  # the one at 14 strikes the restart: the daemon cannot see it
        ("resume", 18.0, 0),
        ("restart", 21.0 - 12.0),
    ]
    # then as from the start: first step at 21, saves at 24.5 and 30.5, the end at 34.5
    assert r == RunResult(
        wall_s=34.5,
        useful_s=10.0,
        checkpoint_overhead_s=0.5 + 2 * (1.0 + 0.5 * 2.0),
        lost_work_s=8 * 0.5,
        restart_s=4.0 + 2.0 + 4.0,
        warmup_s=2.5 + 1.0 + 2.5,
        saves=2,
        failures=3,
    )


def test_a_failure_at_the_instant_a_blocking_or_a_restart_ends_strikes_what_follows() -> None:
    # the intervals are half-open: at 7.5 the save (blocking 6.5 to 7.5) is made and its
    # write is in flight, which the failure loses; the job restarts from step 0
    r, log = told(warm([7.5]), Fixed(steps=8))
    assert log[7:11] == [
        ("requested", 6.5, 8),
        ("decide", 7.5, 8, GPU_WRITING, storage(0.0, True)),
        ("failure", 7.5),
        ("resume", 11.5, 0),
    ]
    assert r == RunResult(28.0, 10.0, 1.0 + 2 * 2.0, 4.0, 4.0, 5.0, saves=3, failures=1)
    # at 11 the restart from 7 has ended: the job said hello, then fails again
    r, log = told(warm([7.0, 11.0]), Fixed(steps=8))
    assert [e for e in log if e[0] in ("failure", "resume")] == [
        ("resume", 0.0, 0),
        ("failure", 7.0),
        ("resume", 11.0, 0),
        ("failure", 11.0),
        ("resume", 15.0, 0),
    ]
    assert r == RunResult(31.5, 10.0, 0.5 + 2 * 2.0, 4.0, 8.0, 5.0, saves=2, failures=2)


def test_a_save_that_comes_due_during_the_write_waits_for_it_and_a_new_decision() -> None:
    # every 2 steps (1 s), but a write takes 5 s at half speed: step 4 comes due at 4,
    # before the write of step 2 is durable (6); at 6 the job is at step 6 and saves at 8
    s = sim.from_dict(
        {
            "job": {"steps": 10, "step_time_s": 0.5},
            "checkpoint": {"blocking_s": 1.0, "latency_s": 5.0, "slowdown": 0.5},
            "failures": {"trace": []},
        }
    )
    r, log = told(s, Fixed(steps=2))
    idle, writing = storage(0.0, False), storage(0.0, True)
    assert log == [
        ("resume", 0.0, 0),
        ("decide", 0.0, 0, GPU_IDLE, idle),
        ("steps", 0.5, 1, 1, 0.5, False, {"max_s": 0.5, "warmup": True}),
        ("decide", 0.5, 1, GPU_IDLE, idle),
        ("steps", 1.0, 2, 1, 0.5, False, PACE),
        ("requested", 1.0, 2),
        ("decide", 2.0, 2, GPU_WRITING, writing),
        ("steps", 3.0, 3, 1, 1.0, True, PACE),  # the report a second after the first
        ("decide", 3.0, 3, GPU_WRITING, writing),
        ("steps", 6.0, 6, 3, 1.0, False, PACE),
        ("saved", 6.0, 2, {"blocking_s": 1.0, "durable_s": 5.0, "extra_step_s": 0.5 * 4.0}),
        ("decide", 6.0, 6, GPU_IDLE, idle),
        ("steps", 7.0, 8, 2, 0.5, False, PACE),
        ("requested", 7.0, 8),
        ("decide", 8.0, 8, GPU_WRITING, writing),
    ]
    # the last 2 steps at half speed, the write of step 8 still running at the end
    assert r == RunResult(10.0, 5.0, (1.0 + 2.0) + (1.0 + 1.0), 0.0, 0.0, 0.0, 2, 0)


def test_a_phase_boundary_between_the_first_reports_keeps_the_second() -> None:
    # the target is slowed (latency x2: half its capacity taken) from 1 to 2 s, between
    # the first step's report (0.5) and the one a second later (1.5)
    s = sim.from_dict(
        {
            "job": {"steps": 10, "step_time_s": 0.5},
            "checkpoint": {"blocking_s": 1.0},
            "failures": {"trace": []},
            "phases": [{"start_s": 1.0, "end_s": 2.0, "latency_factor": 2.0}],
        }
    )
    r, log = told(s, Fixed(steps=6))
    idle, half = storage(0.0, False), storage(0.5, False)
    assert log == [
        ("resume", 0.0, 0),
        ("decide", 0.0, 0, GPU_IDLE, idle),
        ("steps", 0.5, 1, 1, 0.5, False, {"max_s": 0.5, "warmup": True}),
        ("decide", 0.5, 1, GPU_IDLE, idle),
        ("steps", 1.0, 2, 1, 0.5, False, PACE),
        ("decide", 1.0, 2, GPU_IDLE, half),
        ("steps", 1.5, 3, 1, 0.5, False, PACE),
        ("decide", 1.5, 3, GPU_IDLE, half),
        ("steps", 2.0, 4, 1, 0.5, False, PACE),
        ("decide", 2.0, 4, GPU_IDLE, idle),
        ("steps", 3.0, 6, 2, 0.5, False, PACE),
        ("requested", 3.0, 6),
        ("saved", 4.0, 6, {"blocking_s": 1.0, "durable_s": 1.0, "extra_step_s": 0.0}),
        ("decide", 4.0, 6, GPU_IDLE, idle),
    ]
    assert r == RunResult(6.0, 5.0, 1.0, 0.0, 0.0, 0.0, saves=1, failures=0)


def test_with_two_second_steps_the_second_report_is_one_step_later() -> None:
    s = sim.from_dict({"job": {"steps": 5, "step_time_s": 2.0}, "checkpoint": {"blocking_s": 1.0}})
    r, log = told(s, Fixed(steps=10))  # plans step 10: no save in a 5-step run
    idle = storage(0.0, False)
    assert log == [
        ("resume", 0.0, 0),
        ("decide", 0.0, 0, GPU_IDLE, idle),
        ("steps", 2.0, 1, 1, 2.0, False, {"max_s": 2.0, "warmup": True}),
        ("decide", 2.0, 1, GPU_IDLE, idle),
        ("steps", 4.0, 2, 1, 2.0, False, PACE),  # REPORT_S = 1 s is under one step
        ("decide", 4.0, 2, GPU_IDLE, idle),
    ]
    assert r == RunResult(10.0, 10.0, 0.0, 0.0, 0.0, 0.0, saves=0, failures=0)


def test_a_fleets_facts_reach_every_snapshot() -> None:
    s = warm([16.0])
    r = _Run(s, Fixed(steps=1), 0, FleetHistory(gpus=1004, job_gpus=8))
    assert r.fleet is not None and r.fleet.hosts == 125  # 1004 GPUs: 125 whole hosts of 8
    log: list[tuple] = []
    r.policy = Seen(log, Fixed(steps=8), fleet=r.fleet)
    r.run()
    # decisions at 0, 3, 4 (reports), 7.5, 13.5 (saves made), 9.5, 15.5 (durable), 20
    # (back from the failure at 16), 23 and 24 (its reports)
    assert [e[1] for e in log] == [0.0, 3.0, 4.0, 7.5, 9.5, 13.5, 15.5, 20.0, 23.0, 24.0]


@pytest.mark.parametrize("weibull", [False, True])
def test_the_failure_clock_adds_up_its_seeds_draws_chunk_after_chunk(weibull) -> None:
    failures = {"distribution": "weibull", "weibull_shape": 0.7} if weibull else {}
    s = sim.from_dict(
        {
            "job": {"steps": 10, "step_time_s": 1.0, "gpus": 8},
            "checkpoint": {"blocking_s": 1.0},
            "failures": {"mtbf_gpu_hours": 10.0, **failures},
        }
    )
    clock = FailureClock(s, 7)
    times = [clock.next() for _ in range(3 * FailureClock.CHUNK - 10)]  # three chunks
    rng = np.random.default_rng([7, 0xADA])
    n = len(times)
    if weibull:  # the scale for a mean of 10 h / 8 GPUs = 4500 s at shape 0.7
        gaps = 4500.0 / math.gamma(1 + 1 / 0.7) * rng.weibull(0.7, n)
    else:
        gaps = rng.exponential(4500.0, n)
    assert times == pytest.approx(np.cumsum(gaps), rel=1e-12)


def test_decisions_between_step_ends_leave_the_step_timings_whole() -> None:
    # the target is slowed from 1 to 3.25 s (latency x2: half its capacity taken), then
    # faster than usual until 5 (x0.5: nothing taken). The decisions at 1 (in the
    # warm-up) and 3.25 (mid-step) see no new step: the next reports still time whole
    # steps, the first one its 3 s
    s = warm(
        [],
        [
            {"start_s": 1.0, "end_s": 3.25, "latency_factor": 2.0},
            {"start_s": 3.25, "end_s": 5.0, "latency_factor": 0.5},
        ],
    )
    r, log = told(s, Fixed(steps=8))
    idle, half = storage(0.0, False), storage(0.5, False)
    assert log[:12] == [
        ("resume", 0.0, 0),
        ("decide", 0.0, 0, GPU_IDLE, idle),
        ("decide", 1.0, 0, GPU_IDLE, half),
        ("steps", 3.0, 1, 1, 3.0, False, FIRST),
        ("decide", 3.0, 1, GPU_IDLE, half),
        ("decide", 3.25, 1, GPU_IDLE, idle),
        ("steps", 4.0, 3, 2, 0.5, False, PACE),
        ("decide", 4.0, 3, GPU_IDLE, idle),
        ("steps", 5.0, 5, 2, 0.5, False, PACE),
        ("decide", 5.0, 5, GPU_IDLE, idle),
        ("steps", 6.5, 8, 3, 0.5, False, PACE),
        ("requested", 6.5, 8),
    ]
    # saves at steps 8 (at 6.5) and 16 (at 12.5), both after the phases; the last
    # write ends at 15.5, 2 steps before the end
    assert r == RunResult(16.5, 10.0, 2 * (1.0 + 0.5 * 2.0), 0.0, 0.0, 2.5, saves=2, failures=0)
