"""Runs of the engine worked out by hand on failure traces, with half-second steps (so
seconds and steps cannot be confused), a slowed write, and failures that strike during
a restart. (Found missing by ``make mutants``: the statistical checks of test_theory.py
are slow, and the fast tests used one-second steps.)"""

from __future__ import annotations

from adaptd import sim
from adaptd.policies import Fixed
from adaptd.sim.engine import RunResult


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
