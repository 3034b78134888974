"""Hang detection's pure decision (adaptd/core/stall.py) as tables, and the daemon's
watch (adaptd/daemon/jobs/stall_watch.py) fed a seeded heavy-tailed job through the
real registry: no false abort over thousands of steps, a hang found within its bound,
the culprit named from the process table and the heartbeats."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from adaptd import events as ev
from adaptd.core import stall
from adaptd.core.stall import StallFacts, StallLimits
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.stall_watch import StallWatch, unseen
from adaptd.protocol import job as p
from adaptd.telemetry.host import process_info

LIMITS = StallLimits()


def facts(**kw: object) -> StallFacts:
    base: dict[str, object] = {"silent_s": 0.0, "steps_done": 100, "step_s": 0.05,
                               "longest_s": 0.08, "restart_s": 30.0, "unsaved_s": 60.0}  # fmt: skip
    return StallFacts(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "f", "limits", "threshold", "stalled", "said"),
    [
        ("off", facts(silent_s=1e6), StallLimits(enabled=False), None, False, "off"),
        ("a round holds", facts(silent_s=1e6, holding="an agreement round"), LIMITS, None,
         False, "agreement round"),
        ("first steps", facts(silent_s=1e6, steps_done=1), LIMITS, None, False, "compiling"),
        ("no step time: the cap", facts(step_s=None, silent_s=299), LIMITS, 300.0, False, "cap"),
        ("past the cap", facts(step_s=None, silent_s=301), LIMITS, 300.0, True, "no step for"),
        ("fast steps: the floor", facts(silent_s=6.9), LIMITS, 7.0, False, "floor"),
        ("fast steps, past the floor", facts(silent_s=7.5), LIMITS, 7.0, True, "floor"),
        ("a floor of its own", facts(silent_s=3.5), StallLimits(3.0, 60.0), 3.0, True, "floor"),
        # evaluations at 30x a step seen: the spread is 1.45 s; p = 0.05/90, k = 42.4
        ("evals seen: the model", facts(longest_s=1.5, silent_s=30), LIMITS,
         0.05 + 1.45 * math.sqrt(90 / 0.05 - 1), False, "model"),
        ("a huge spread: the cap", facts(longest_s=100.0, silent_s=301), LIMITS, 300.0, True,
         "cap"),
    ],
)  # fmt: skip
def test_the_threshold_table(case, f, limits, threshold, stalled, said) -> None:
    v = stall.decide(f, limits)
    if threshold is None:
        assert v.threshold_s is None, case
    else:
        assert v.threshold_s == pytest.approx(threshold), (case, v)
    assert v.stalled is stalled, (case, v)
    assert said in v.reason, (case, v.reason)


def test_a_costlier_false_abort_waits_longer_and_a_wider_spread_too() -> None:
    """The threshold grows with what a false abort costs (restart + unsaved work) and
    with the spread of healthy waits, never with the GPUs (both costs scale with them)."""
    base = facts(longest_s=1.0)
    t = lambda f: stall.threshold(f, LIMITS)[0]  # noqa: E731
    assert t(facts(longest_s=1.0, unsaved_s=600.0)) > t(base)
    assert t(facts(longest_s=2.0)) > t(base)
    assert t(facts(longest_s=1.0, gpus=16384)) == t(base)
    assert "16384 GPU-s/s" in stall.threshold(facts(longest_s=1.0, gpus=16384), LIMITS)[1]


@pytest.mark.parametrize(
    ("floor", "cap", "named"),
    [(0, 300, "stall_floor_s = 0"), (-1.0, 300, "stall_floor_s = -1.0"),
     (math.nan, 300, "stall_floor_s = nan"), (math.inf, 300, "stall_floor_s = inf"),
     ("10", 300, "stall_floor_s = '10'"), (True, 300, "stall_floor_s = True"),
     (10, 0.0, "stall_cap_s = 0.0"), (10, None, "stall_cap_s = None"),
     (20, 10, "stall_cap_s = 10 is below stall_floor_s = 20")],
)  # fmt: skip
def test_bad_limits_are_refused_naming_the_value(floor, cap, named) -> None:
    with pytest.raises(ValueError) as err:
        StallLimits(floor, cap)
    assert named in str(err.value)


# ------------------------------------------------------------------ the watch


class Job2:
    """A 2-rank job of this daemon (coordination agreement, rank 0 says hello here;
    ``here``: the ranks connected to this daemon, the others on another host)."""

    def __init__(self, pid: int = 0, here: tuple[int, ...] = (0, 1)) -> None:
        self.events: list[ev.Event] = []
        self.sent: list[tuple[bytes, p.Message]] = []
        self.reg = Registry(emit=self.events.append)
        self.watch = StallWatch(self.reg.table, send=lambda who, m: self.sent.append((who, m))
                                or True, emit=self.events.append)  # fmt: skip
        self.ranks = []
        for r in here:
            hello = p.Hello(v=p.VERSION, job="j", rank=r, world_size=2, pid=pid, gpus=8)
            self.job, rank, _ = self.reg.hello(bytes([r]), hello, 0.0)
            self.ranks.append(rank)
        assert self.job.decides

    def steps(self, step: int, count: int, mean: float, slowest: float, now: float) -> None:
        for r in self.ranks:
            msg = p.Steps(v=p.VERSION, job="j", rank=r.rank, step=step, count=count,
                          mean_s=mean, max_s=slowest, warmup=step <= count)  # fmt: skip
            self.reg.steps(self.job, r, msg, now)
            self.watch.steps(self.job, msg, now)

    def beat(self, rank: int, step: int, now: float, holding: str = "") -> None:
        msg = p.Beat(v=p.VERSION, job="j", rank=rank, step=step, holding=holding)  # type: ignore[arg-type]
        (seen,) = [r for r in self.ranks if r.rank == rank]
        self.watch.beat(self.job, seen, bytes([10 + rank]), msg, now)

    def stalls(self) -> list[ev.JobStalled]:
        return [e for e in self.events if isinstance(e, ev.JobStalled)]


def heavy_tailed(seed: int, steps: int) -> list[float]:
    """Step times: lognormal around 50 ms, a slow first step (20 s: compiling), an
    evaluation every 100 steps taking 30x a step, and one 10 s stall of the input
    pipeline (step 1500)."""
    rng = random.Random(seed)
    out = [rng.lognormvariate(math.log(0.05), 0.3) for _ in range(steps)]
    out[0] = 20.0
    for k in range(100, steps, 100):
        out[k] = 30 * 0.05
    out[1500] = 10.0
    return out


def run(job: Job2, times: list[float], report_s: float = 1.0, save_every: int = 200) -> float:
    """Feed ``times`` as the hook would (a report a second, beats a second), ticking the
    watch every second; returns the clock at the end."""
    now, step, batch, slowest, last_report, next_tick = 0.0, 0, [], 0.0, 0.0, 1.0
    for dt in times:
        end = now + dt
        while next_tick <= end:  # the daemon's tick and the beats during the step
            for r in job.ranks:
                job.beat(r.rank, step, next_tick)
            job.watch.tick(next_tick)
            next_tick += 1.0
        now, step = end, step + 1
        batch.append(dt)
        slowest = max(slowest, dt)
        if step % save_every == 0:
            job.job.tracker.on_save_requested(now, step)
        if now - last_report >= report_s:
            job.steps(step, len(batch), sum(batch) / len(batch), slowest, now)
            batch, slowest, last_report = [], 0.0, now
    return now


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_false_abort_on_heavy_tailed_steps(seed: int) -> None:
    """2,500 steps with the heavy tail of :func:`heavy_tailed`: never taken for a hang."""
    job = Job2()
    run(job, heavy_tailed(seed, 2500))
    assert job.stalls() == [], job.stalls()[0].reason
    verdict, _ = job.watch.verdict("j")  # type: ignore[misc]
    assert verdict.threshold_s is not None and verdict.threshold_s > 10.0, verdict


def test_a_hang_is_found_within_its_threshold_and_answered_to_every_beat() -> None:
    """Steady steps, then no step while both ranks beat: stalled once the silence passes
    the threshold (the floor here), an event, an Abort on every beat from then on; the
    culprit is unknown (every rank beats, no process to look at)."""
    job = Job2()
    end = run(job, [0.05] * 400)
    t = end
    while not job.stalls():
        t += 1.0
        for r in (0, 1):
            job.beat(r, 400, t)
        job.watch.tick(t)
        assert t - end < 30, "no stall found"
    (stalled,) = job.stalls()
    assert stalled.threshold_s == 7.0 and 7.0 < stalled.silent_s <= 9.0, stalled
    assert stalled.culprit is None and "not known" in stalled.reason
    aborts = [(who, m) for who, m in job.sent if isinstance(m, p.Abort)]
    assert {who for who, _ in aborts} == {b"\x0a", b"\x0b"}
    job.sent.clear()
    job.beat(1, 400, t + 1)  # a rank that comes back is told again
    assert [m for _, m in job.sent] == [aborts[0][1]]


@pytest.mark.parametrize(
    ("world_size", "here", "said"),
    [
        (2, [0, 1], "every rank seen here is alive and beating: the cause is not known"),
        (2, [0], "no rank on this host (rank 0) is gone, stopped, silent or on a GPU that "
                 "reported an XID, and rank 1 on other hosts cannot be seen from here: "
                 "the cause is not known"),
        (4, [2, 0], "no rank on this host (ranks 0, 2) is gone, stopped, silent or on a GPU "
                    "that reported an XID, and ranks 1, 3 on other hosts cannot be seen "
                    "from here: the cause is not known"),
    ],
)  # fmt: skip
def test_no_culprit_seen_says_which_ranks_this_host_cannot_see(world_size, here, said) -> None:
    assert unseen(world_size, here) == said


def test_a_hang_of_a_two_host_job_says_the_other_host_cannot_be_seen() -> None:
    """The chief's daemon sees only rank 0 (rank 1 beats to its own daemon): rank 0
    beating on is no culprit, rank 1 not beating here is no "heartbeat stopped" (it
    never beat here), and the reason says rank 1 cannot be seen from here."""
    job = Job2(here=(0,))
    end = run(job, [0.05] * 400)
    t = end
    while not job.stalls():
        t += 1.0
        job.beat(0, 400, t)
        job.watch.tick(t)
        assert t - end < 30, "no stall found"
    (stalled,) = job.stalls()
    assert stalled.culprit is None, stalled
    assert "rank 1 on other hosts cannot be seen from here" in stalled.reason, stalled.reason


def test_a_save_in_its_blocking_part_is_no_hang() -> None:
    job = Job2()
    end = run(job, [0.05] * 400)
    for k in range(1, 60):
        job.beat(0, 400, end + k, holding="save")
        job.beat(1, 400, end + k)
        job.watch.tick(end + k)
    assert job.stalls() == []
    verdict, _ = job.watch.verdict("j")  # type: ignore[misc]
    assert "blocking part" in verdict.reason


def test_the_culprit_is_the_rank_whose_heartbeat_stopped() -> None:
    job = Job2()
    end = run(job, [0.05] * 400)
    t = end
    while not job.stalls():
        t += 1.0
        job.beat(0, 400, t)  # rank 1 beats no more
        job.watch.tick(t)
    assert job.stalls()[0].culprit == 1 and "heartbeat stopped" in job.stalls()[0].reason


def test_the_culprit_is_the_stopped_process() -> None:
    """A real process SIGSTOPped: its state is T, so it is named."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while (info := process_info(child.pid)) is None or info.status != "stopped":
            assert time.monotonic() < deadline, info
            time.sleep(0.01)
        job = Job2(pid=child.pid)
        for r in job.ranks:
            r.start_time = process_info(child.pid).start_time  # type: ignore[union-attr]
        w = job.watch._watched(job.job, 0.0)
        rank, why = job.watch.culprit(job.job, w, 0.0)
        assert rank == 0 and "stopped (T)" in why, why
    finally:
        child.kill()
        child.wait(10)


def test_the_daemon_takes_a_jobs_limits_from_its_config() -> None:
    """``[jobs."PATTERN"]`` floor, cap and switch reach the watch's limits; no entry:
    the defaults (None)."""
    from adaptd.config import loader
    from adaptd.daemon.service_parts import stall_limits

    cfg = loader.loads('[jobs."train-*"]\nstall_floor_s = 3\nhang_detection = false\n')
    assert stall_limits(cfg, "train-1") == StallLimits(3.0, 300.0, enabled=False)
    assert stall_limits(cfg, "other") is None


def test_a_rank_that_stopped_in_a_save_holds_nothing() -> None:
    """Rank 1's last beat came from a save's blocking part, then it beat no more (it
    stopped there): that stale beat does not hold the job; the hang is found and rank 1
    named. (Before: the job was held for good, and TensorFlow's heartbeat freed the
    survivor after 10 s.)"""
    job = Job2()
    end = run(job, [0.05] * 400)
    job.beat(1, 400, end + 0.5, holding="save")
    t = end
    while not job.stalls():
        t += 1.0
        job.beat(0, 400, t)
        job.watch.tick(t)
        assert t - end < 30, job.watch.verdict("j")
    assert job.stalls()[0].culprit == 1


def test_a_round_holds_only_while_every_rank_is_in_the_hook() -> None:
    """Every rank holding for a round: not judged. Rank 1 holding for a round that
    rank 0 (outside the hook, asleep in its step) does not answer: a hang, rank 0
    named. (Before: the round's own timeout, 2 x 30 s, bounded the detection.)"""
    job = Job2()
    end = run(job, [0.05] * 400)
    for k in range(1, 30):
        for r in (0, 1):
            job.beat(r, 400, end + k, holding="round")
        job.watch.tick(end + k)
    assert job.stalls() == []
    t = end + 30
    while not job.stalls():
        t += 1.0
        job.beat(0, 400, t)
        job.beat(1, 400, t, holding="round")
        job.watch.tick(t)
        assert t - end < 60, job.watch.verdict("j")
    (stalled,) = job.stalls()
    assert stalled.culprit == 0 and "agreement round it does not answer" in stalled.reason


def test_the_culprit_is_the_rank_whose_gpu_reported_an_xid() -> None:
    """Every rank beats, no process is stopped: the rank whose GPU's newest sample
    carries an XID (NVML, here the snapshot a sampler would give) is named."""
    from adaptd.core.snapshot import GpuSample, Snapshot

    job = Job2()
    job.ranks[0].pid, job.ranks[1].pid = 101, 202
    gpus = (
        GpuSample(0, "GPU-a", pids=(101,)),
        GpuSample(1, "GPU-b", xid_events=(79,), pids=(202,)),
    )
    job.watch.snapshot = lambda: Snapshot(time=0.0, gpus=gpus)
    w = job.watch._watched(job.job, 0.0)
    for r in (0, 1):
        job.beat(r, 0, 0.0)
    assert job.watch.culprit(job.job, w, 0.5) == (1, "rank 1's GPU 1 reported XID 79")


def test_a_stopped_rank_leaves_nothing_held() -> None:
    """Rank 1 beats from a save's blocking part, but rank 0's process is stopped (T):
    the save may wait on it (a post to a stopped chief), so nothing holds the job."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while (info := process_info(child.pid)) is None or info.status != "stopped":
            assert time.monotonic() < deadline, info
            time.sleep(0.01)
        job = Job2()
        job.ranks[0].pid, job.ranks[0].start_time = child.pid, info.start_time
        end = run(job, [0.05] * 400)
        t = end
        while not job.stalls():
            t += 1.0
            job.beat(1, 400, t, holding="save")
            job.watch.tick(t)
            assert t - end < 30, job.watch.verdict("j")
        assert job.stalls()[0].culprit == 0
    finally:
        child.kill()
        child.wait(10)
