"""Step-time and save-cost accounting (pure: the times are passed in)."""

from __future__ import annotations

import pytest

from adaptd.client.save.costs import Baseline, SaveWindow, StepClock


def test_step_clock_excludes_blocked_time():
    c = StepClock(step=0, now=0.0)
    assert c.batch(0, 1.0) is None  # no step completed
    c.blocked(0.5)
    b = c.batch(10, 1.5)  # 1.5 s wall, 0.5 s of it blocked in a save
    assert (b.step, b.count) == (10, 10)
    assert b.mean_s == pytest.approx(0.1)
    b = c.batch(20, 2.5)  # the blocked time was consumed by the previous batch
    assert b.mean_s == pytest.approx(0.1)


def test_save_window_extra_time_against_baseline():
    w = SaveWindow(baseline_s=0.1, step=100, returned_at=10.0)
    assert w.extra(100, 10.05) == 0.0  # no step after the save yet
    # 3 steps took 0.45 s where the baseline says 0.3 s
    assert w.extra(103, 10.45) == pytest.approx(0.15)
    # noise that makes the steps faster than the baseline is not negative cost
    assert w.extra(103, 10.2) == 0.0
    assert SaveWindow(None, 0, 0.0).extra(5, 1.0) == 0.0  # no baseline yet


def test_baseline_between_save_windows():
    b = Baseline(step=0, now=0.0)
    b.blocked(1.0)
    assert b.close(10, 3.0) == pytest.approx(0.2)  # (3 - 1) / 10
    b.restart(12, 4.0)
    assert b.close(12, 4.0) == pytest.approx(0.2)  # no step since: keeps the last
    assert b.close(22, 5.0) == pytest.approx(0.1)


def test_step_clock_marks_the_first_batch_warm_up_and_carries_the_slowest_call():
    c = StepClock(step=0, now=0.0)
    first = c.batch(1, 3.0, slowest_s=3.0)  # the run's first step: 3 s of tracing
    assert (first.count, first.max_s, first.max_steps, first.warmup) == (1, 3.0, 1, True)
    b = c.batch(51, 4.0, slowest_s=0.03, slowest_steps=1)
    assert (b.count, b.warmup) == (50, False) and b.mean_s == pytest.approx(0.02)
    assert b.max_s == 0.03
    # a steps_per_execution call never covers more steps than its batch holds
    assert c.batch(53, 5.0, slowest_s=1.0, slowest_steps=10).max_steps == 2
