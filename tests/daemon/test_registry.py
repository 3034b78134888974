"""The registry's bookkeeping, driven with explicit times; the pid probe with real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from adaptd import events as ev
from adaptd.core.snapshot import Decision
from adaptd.daemon.jobs.registry import ProcProbe, Registry, RegistryFull
from adaptd.daemon.server import same_saves
from adaptd.protocol import job as p

V = p.VERSION


def hello(job: str, rank: int = 0, world: int = 2, **kw) -> p.Hello:
    return p.Hello(v=V, job=job, rank=rank, world_size=world, **kw)


def steps(job: str, rank: int, step: int, count: int = 10, mean_s: float = 0.1) -> p.Steps:
    return p.Steps(v=V, job=job, rank=rank, step=step, count=count, mean_s=mean_s)


def save(job: str, rank: int, step: int, ok: bool = True, blocking: float = 0.1) -> p.SaveReport:
    return p.SaveReport(
        v=V, job=job, rank=rank, step=step, blocking_s=blocking, durable_s=1.0, bytes=1, ok=ok
    )


def test_step_from_any_rank_timings_from_the_lead_only() -> None:
    reg = Registry()
    job, r0, _ = reg.hello(b"a", hello("j", 0), 0.0)
    _, r1, kind = reg.hello(b"b", hello("j", 1), 0.0)
    assert kind == "join"
    reg.steps(job, r1, steps("j", 1, 20, mean_s=9.0), 1.0)  # rank 1 is ahead, and slow
    assert job.tracker.step == 20 and job.tracker.step_time_s is None
    reg.steps(job, r0, steps("j", 0, 15, mean_s=0.2), 2.0)
    assert job.tracker.step == 20 and job.tracker.step_time_s == pytest.approx(0.2)


def test_every_report_moves_the_daemons_view_of_the_step() -> None:
    """A save report carries the step the job is at: the view does not wait for the
    next step report (issue 11: 37 plans in a row computed at step 1)."""
    reg = Registry()
    job, r0, _ = reg.hello(b"a", hello("j", 0, world=1), 0.0)
    reg.steps(job, r0, steps("j", 0, 1, count=1, mean_s=3.0), 3.0)
    reg.save_report(job, r0, save("j", 0, 40), 3.5)
    assert job.tracker.step == 40 and r0.step == 40


def test_the_lead_ranks_warm_up_and_slowest_step_reach_the_step_time() -> None:
    reg = Registry()
    job, r0, _ = reg.hello(b"a", hello("j", 0, world=1), 0.0)
    first = p.Steps(v=V, job="j", rank=0, step=1, count=1, mean_s=3.0, max_s=3.0, warmup=True)
    reg.steps(job, r0, first, 3.0)
    assert job.tracker.step_time_s is None  # the first step is warm-up
    retrace = p.Steps(v=V, job="j", rank=0, step=51, count=50, mean_s=(2.0 + 49 * 0.02) / 50,
                      max_s=2.0)  # fmt: skip
    reg.steps(job, r0, retrace, 4.0)
    assert job.tracker.step_time_s == pytest.approx(0.02)


def test_each_saved_step_counts_once_at_the_slowest_ranks_cost_failures_always() -> None:
    reg = Registry()
    job, r0, _ = reg.hello(b"a", hello("j", 0), 0.0)
    _, r1, _ = reg.hello(b"b", hello("j", 1), 0.0)
    assert reg.save_report(job, r0, save("j", 0, 10), 1.0) is True
    assert reg.save_report(job, r1, save("j", 1, 10, blocking=5.0), 1.1) is False
    # one save of the job, whose cost δ is its slowest rank's
    assert job.tracker.saves == 1 and job.tracker.save_cost_s == pytest.approx(5.0)
    assert reg.save_report(job, r0, save("j", 0, 10, blocking=0.2), 1.2) is False
    assert job.tracker.save_cost_s == pytest.approx(5.0)  # a faster one lowers nothing
    assert reg.save_report(job, r1, save("j", 1, 20, ok=False), 2.0) is True
    assert job.tracker.failed_saves == 1 and job.tracker.last_durable_step == 10


def test_liveness_by_silence_and_all_ranks_gone() -> None:
    seen: list[ev.Event] = []
    reg = Registry(emit=seen.append, liveness_timeout_s=10)
    job, r0, _ = reg.hello(b"a", hello("j", 0), 0.0)
    _, r1, _ = reg.hello(b"b", hello("j", 1), 0.0)
    reg.steps(job, r1, steps("j", 1, 5), 8.0)
    assert reg.check(10.5) == [] and not r0.alive and r1.alive  # one rank silent: job lives
    assert reg.check(18.5) == [job] and job.state == "lost"
    lost = [e for e in seen if isinstance(e, ev.JobLost)]
    assert len(lost) == 1 and lost[0].step == 5 and lost[0].last_seen == 8.0
    assert reg.check(30.0) == []  # reported once


def test_resume_restart_and_reconnect_kinds() -> None:
    seen: list[ev.Event] = []
    reg = Registry(emit=seen.append, liveness_timeout_s=1)
    job, r0, kind = reg.hello(b"a", hello("j", 0, 1, pid=0), 0.0)
    assert kind == "new"
    assert reg.hello(b"a2", hello("j", 0, 1, pid=0), 0.1)[2] == "reconnect"
    assert reg.peer(b"a") is None  # the old connection no longer speaks for the rank
    reg.steps(job, job.ranks[0], steps("j", 0, 100), 0.5)
    reg.check(2.0)
    job, r0, kind = reg.hello(b"c", hello("j", 0, 1, resumed_from=60), 5.0)
    assert kind == "resume" and job.tracker.step == 60 and job.incarnation == 2
    reg.steps(job, r0, steps("j", 0, 61), 7.5)
    (resumed,) = [e for e in seen if isinstance(e, ev.JobResumed)]
    # from the last message (0.5), not from when the loss was noticed (2.0)
    assert (resumed.lost_at, resumed.last_seen) == (2.0, 0.5)
    assert resumed.restart_s == pytest.approx(7.0) and resumed.lost_steps == 40
    assert job.tracker.restore_s == pytest.approx(7.0)
    assert job.tracker.failures == 1 and job.tracker.last_failure_time == 0.5
    reg.goodbye(job, r0, p.Goodbye(v=V, job="j", rank=0, step=70), 8.0)
    assert job.state == "finished"
    assert reg.hello(b"d", hello("j", 0, 1, resumed_from=70), 9.0)[2] == "restart"


def test_a_save_in_flight_is_placed_on_the_plan_before_its_report() -> None:
    reg = Registry()
    job, r0, _ = reg.hello(b"a", hello("j", 0, 1), 0.0)
    job.plan = Decision(100, 100)
    reg.steps(job, r0, steps("j", 0, 90, mean_s=0.1), 9.0)
    assert job.tracker.last_save_step is None  # nothing in flight yet
    in_flight = p.Steps(v=V, job="j", rank=0, step=130, count=40, mean_s=0.1, save_in_flight=True)
    reg.steps(job, r0, in_flight, 13.0)
    t = job.tracker
    # the hook saved where the plan said (step 100), 30 steps of 0.1 s before this report
    assert (t.last_save_step, t.save_in_flight) == (100, True)
    assert t.last_save_time == pytest.approx(10.0)
    later = p.Steps(v=V, job="j", rank=0, step=150, count=20, mean_s=0.1, save_in_flight=True)
    reg.steps(job, r0, later, 15.0)  # the same save, still in flight
    assert (t.last_save_step, t.last_save_time) == (100, pytest.approx(10.0))
    reg.save_report(job, r0, save("j", 0, 100), 16.0)
    assert (t.last_save_step, t.save_in_flight, t.saves) == (100, False, 1)
    # two grid steps passed since: the save is at the newer one
    skip = p.Steps(v=V, job="j", rank=0, step=320, count=170, mean_s=0.1, save_in_flight=True)
    reg.steps(job, r0, skip, 33.0)
    assert t.last_save_step == 300
    reg.save_report(job, r0, save("j", 0, 300), 34.0)
    # no grid step passed and nothing urgent asked: not a new save (another rank may
    # still be writing the one reported)
    again = p.Steps(v=V, job="j", rank=0, step=333, count=13, mean_s=0.1, save_in_flight=True)
    reg.steps(job, r0, again, 35.0)
    assert t.last_save_step == 300
    # an urgent (off-plan) save is placed at the reported step
    reg.steps(job, r0, steps("j", 0, 340), 36.0)
    job.urgent = "operator"
    urgent = p.Steps(v=V, job="j", rank=0, step=350, count=10, mean_s=0.1, save_in_flight=True)
    reg.steps(job, r0, urgent, 37.0)
    assert t.last_save_step == 350


def test_bounds_on_ranks_and_inactive_jobs() -> None:
    reg = Registry(max_ranks=3, max_inactive_jobs=2, liveness_timeout_s=1)
    for i in range(3):
        reg.hello(bytes([i]), hello(f"j{i}", 0, 1), 0.0)
    with pytest.raises(RegistryFull, match="3 ranks"):
        reg.hello(b"x", hello("j9", 0, 1), 0.0)
    reg.check(5.0)  # all three lost; only the two most recent inactive jobs are kept
    assert len(reg) == 2


def test_proc_probe_tells_live_zombie_and_reused_pids() -> None:
    probe = ProcProbe()
    me = probe.start_time(os.getpid())
    assert me is not None and probe.alive(os.getpid(), me)
    assert not probe.alive(os.getpid(), me + 1)  # the pid now names a different process
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    started = probe.start_time(child.pid)
    assert probe.alive(child.pid, started)
    child.kill()
    # killed but not reaped: a zombie, which is gone for our purposes
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert not probe.alive(child.pid, started)
    child.wait()
    assert not probe.alive(child.pid, started)


def test_proc_probe_falls_back_to_the_pid_existing_where_procfs_hides_it() -> None:
    """With ``hidepid`` (or another pid namespace) psutil cannot read the process: the
    probe then only asks whether the pid exists, as ``kill(pid, 0)`` tells."""

    def hidden(pid: int) -> None:
        return None

    probe = ProcProbe(process=hidden)
    assert probe.start_time(os.getpid()) is None
    assert probe.alive(os.getpid(), None)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not probe.alive(child.pid, None)


@pytest.mark.parametrize(
    ("old", "new", "step", "same"),
    [
        (Decision(100, 100), Decision(200, 100), 150, True),  # the grid moved on: same saves
        (Decision(1100, 100), Decision(600, 100), 500, False),  # resumed below the old plan
        (Decision(50, 50), Decision(1300, 300), 1001, False),  # new interval
        (Decision(50, 50), Decision(100, 50, urgent=True), 60, False),
        (Decision(None), Decision(None, reason="other"), 5, True),
    ],
)
def test_same_saves(old: Decision, new: Decision, step: int, same: bool) -> None:
    assert same_saves(old, new, step) is same


@pytest.mark.parametrize(
    ("old", "new", "step", "same"),
    [
        (Decision(5800, 5800), Decision(5864, 5864), 120, True),  # re-fit: 1 % apart
        (Decision(5800, 5800), Decision(6400, 6400), 120, False),  # 10 % apart: re-plan
        (Decision(5800, 5800), Decision(5000, 5800), 120, False),  # save moved earlier
        (Decision(5800, 5800), Decision(5850, None), 120, False),  # no longer repeating
        (Decision(5800, 5800), Decision(5810, 5810, urgent=True), 120, False),
    ],
)
def test_same_saves_with_tolerance(old: Decision, new: Decision, step: int, same: bool) -> None:
    assert same_saves(old, new, step, tolerance=0.05) is same


def test_a_failure_covered_by_a_just_in_time_save_is_learned_as_covered() -> None:
    """Rank 1 dies, rank 0 saves step 12 just in time (reported, reason ``just-in-time``)
    and leaves: a job that returns resuming from 12 had its failure covered, one that
    returns from a periodic save's step did not; the policy sees the share and what a
    just-in-time save took, and the just-in-time save is no sample of the periodic δ."""
    reg = Registry(liveness_timeout_s=1)
    job, r0, _ = reg.hello(b"a", hello("j", 0), 0.0)
    _, r1, _ = reg.hello(b"b", hello("j", 1), 0.0)
    reg.save_report(job, r0, save("j", 0, 10, blocking=0.5), 0.2)
    reg.save_report(job, r1, save("j", 1, 10, blocking=0.5), 0.2)
    jit = p.SaveReport(v=V, job="j", rank=0, step=12, blocking_s=3.0, durable_s=3.0, bytes=1,
                       ok=True, reason=p.JIT_REASON)  # fmt: skip
    assert reg.save_report(job, r0, jit, 0.4) is False
    assert job.tracker.saves == 1 and job.tracker.save_cost_s == pytest.approx(0.5)
    reg.goodbye(job, r0, p.Goodbye(v=V, job="j", rank=0, step=12, reason="peer failure"), 0.5)
    reg.check(3.0)  # rank 1 silent: the job is lost
    assert job.state == "lost"
    job, r0, _ = reg.hello(b"c", hello("j", 0, resumed_from=12), 5.0)
    reg.hello(b"d", hello("j", 1, resumed_from=12), 5.0)
    t = job.tracker
    assert job.failures == job.failures_covered == 1 and (t.jit.covered, t.jit.uncovered) == (1, 0)
    state = t.state()
    assert state.jit_coverage == pytest.approx(0.5) and state.jit_save_s == pytest.approx(3.0)
    reg.steps(job, job.ranks[0], steps("j", 0, 20), 6.0)
    reg.check(9.0)  # lost again, and back from step 10 (no just-in-time save this time)
    job, _, _ = reg.hello(b"e", hello("j", 0, resumed_from=10), 10.0)
    assert job.failures == 2 and job.failures_covered == 1
    assert job.tracker.state().jit_coverage == pytest.approx(1 / 3)
