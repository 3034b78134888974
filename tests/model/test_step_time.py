"""The step time a real job deserves: real shapes replayed as the hook reports them.

Each replay turns per-step durations into the batches the hook sends (one report
about every second: count, mean, the slowest ``step()`` call and the warm-up flag
of the run's first batch) and feeds them to a :class:`JobTracker`, as the daemon's
registry and the embedded fallback do. The plans an interval policy makes from the
estimate must then state intervals the job really takes.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import pytest

from adaptd.core.estimators import JobTracker, LevelEstimate, StepTime, steady_part
from adaptd.core.snapshot import Snapshot
from adaptd.policies.daly import Daly

REPORT_S = 1.0


def batches(durations: Iterable[float], report_s: float = REPORT_S) -> Iterator[dict]:
    """The hook's step reports for steps of these durations: a batch closes at the
    first step boundary at least ``report_s`` after the previous one."""
    t = since = 0.0
    count, total, slowest, first = 0, 0.0, 0.0, True
    for step, d in enumerate(durations, start=1):
        t += d
        count += 1
        total += d
        slowest = max(slowest, d)
        if t - since >= report_s:
            yield {"time": t, "step": step, "count": count, "mean_s": total / count,
                   "max_s": slowest, "warmup": first}  # fmt: skip
            since, count, total, slowest, first = t, 0, 0.0, 0.0, False


def feed(tracker: JobTracker, reports: Iterable[dict], *, hook_fields: bool = True) -> list:
    """Feed ``reports``; returns the step-time estimate after each one. Without
    ``hook_fields`` the reports carry only what an old client sent (count, mean)."""
    out = []
    for r in reports:
        extra = {"max_s": r["max_s"], "warmup": r["warmup"]} if hook_fields else {}
        tracker.on_steps(r["time"], r["step"], r["count"], r["mean_s"], **extra)
        out.append(tracker.step_time_s)
    return out


def test_a_3s_first_step_is_warm_up_and_the_estimate_is_the_20ms_pace_at_once() -> None:
    t = JobTracker("j")
    est = feed(t, batches([3.0] + [0.02] * 600))
    assert est[0] is None  # the first report is the 3 s step alone: nothing steady yet
    assert est[1:] == [pytest.approx(0.02)] * len(est[1:])


def test_an_old_client_without_the_slowest_step_converges_on_its_second_report() -> None:
    t = JobTracker("j")
    est = feed(t, batches([3.0] + [0.02] * 600), hook_fields=False)
    assert est[0] == pytest.approx(3.0)
    # one batch of 50 steps outweighs the lone 3 s step: no hundreds of steps of poison
    assert est[1:] == [pytest.approx(0.02)] * len(est[1:])


def test_a_two_minute_compile_then_half_second_steps() -> None:
    t = JobTracker("j")
    est = feed(t, batches([120.0] + [0.5] * 100))
    assert est[0] is None
    assert est[1:] == [pytest.approx(0.5)] * len(est[1:])
    # a compile that lands in a batch with other steps (a longer report interval)
    u = JobTracker("j")
    est = feed(u, batches([120.0] + [0.5] * 400, report_s=150.0))
    assert est[0] == pytest.approx(0.5)


def test_a_retrace_mid_run_is_left_out_and_a_doubling_is_followed_in_two_reports() -> None:
    shape = [3.0] + [0.02] * 500 + [2.0] + [0.02] * 500 + [0.04] * 500
    reports = list(batches(shape))
    t = JobTracker("j")
    est = feed(t, reports)
    retrace = next(i for i, r in enumerate(reports) if r["max_s"] == 2.0)
    assert est[retrace] == pytest.approx(0.02)  # the 2 s retrace is not the pace
    slower = next(i for i, r in enumerate(reports) if r["step"] - r["count"] >= 1002)
    assert est[slower - 2] == pytest.approx(0.02)  # before the change
    assert est[slower + 1] == pytest.approx(0.04)  # the second whole report at the new pace
    assert est[-1] == pytest.approx(0.04)


def test_noisy_steps_seeded_stay_within_a_few_percent() -> None:
    rng = random.Random(20240611)
    shape = [4.0] + [rng.lognormvariate(0, 0.3) * 0.02 for _ in range(3000)]
    for i in range(100, 3000, 400):
        shape[i] = 1.5  # a retrace or an eval now and then
    truth = sum(d for d in shape[1:] if d < 1) / sum(1 for d in shape[1:] if d < 1)
    est = feed(JobTracker("j"), batches(shape))
    assert all(e == pytest.approx(truth, rel=0.06) for e in est[1:]), (truth, est)


def test_plans_from_the_estimate_state_intervals_the_job_really_takes() -> None:
    """The issue's job: a 3 s first step, then 20 ms steps, under daly with a 3 s probe.
    Every plan after the first steady report asks for a save every interval/20 ms
    steps, not every 1-4 steps."""
    policy = Daly(probe_s=3.0, mtbf_s=2000.0)
    t = JobTracker("j")
    plans = []
    for r in batches([3.0] + [0.02] * 600):
        t.on_steps(r["time"], r["step"], r["count"], r["mean_s"],
                   max_s=r["max_s"], warmup=r["warmup"])  # fmt: skip
        d = policy.decide(Snapshot(time=r["time"]), t.state())
        plans.append(d)
    assert plans[0].next_step is None and "step time" in plans[0].reason
    for d in plans[1:]:
        assert d.every_steps >= 150  # 3 s of 20 ms steps
        assert d.every_steps * 0.02 >= d.interval_s * (1 - 1e-9)


def test_steady_part_of_a_batch() -> None:
    assert steady_part(50, 0.08, max_s=3.02, warmup=True) == (49, pytest.approx(0.02))
    assert steady_part(1, 3.0, max_s=3.0, warmup=True) is None
    assert steady_part(10, 0.5, warmup=True) is None  # warm-up not separable
    assert steady_part(10, 0.5) == (10, 0.5)
    # the slowest step is only left out when it is an outlier
    assert steady_part(50, 0.021, max_s=0.04) == (50, 0.021)
    # a steps_per_execution call of 10 steps that traced: all 10 go
    assert steady_part(30, (2.0 + 20 * 0.02) / 30, max_s=2.0, max_steps=10) == (
        20,
        pytest.approx(0.02),
    )
    assert steady_part(0, 0.0) is None


def test_weighted_level_keeps_the_plain_median_for_equal_weights() -> None:
    a = LevelEstimate()
    for v in (5.0, 1.0, 3.0, 2.0):
        a.add(v)
    assert a.value == 2.5
    a.add(4.0)
    assert a.value == 3.0
    b = LevelEstimate()
    b.add(3.0, weight=1)
    b.add(0.02, weight=50)
    assert b.value == 0.02
    with pytest.raises(ValueError, match="weight"):
        b.add(1.0, weight=0)


def test_the_step_time_counts_what_it_left_out_and_reloads() -> None:
    st = StepTime()
    st.add(1, 3.0, max_s=3.0, warmup=True)
    st.add(51, (2.0 + 50 * 0.02) / 51, max_s=2.0)
    assert st.ignored_steps == 2 and st.value == pytest.approx(0.02)
    t = JobTracker("j")
    t.on_steps(1.0, 50, 50, 0.25)
    u = JobTracker("j")
    u.load_learned(t.learned())
    assert u.step_time_s == 0.25
    u.on_steps(2.0, 100, 50, 0.5)  # one fresh batch outweighs the remembered figure
    assert u.step_time_s == 0.5
