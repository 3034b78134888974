"""Lost jobs and resumes with real processes: SIGKILL a job's pid, then resume it."""

from __future__ import annotations

import os

import pytest
from daemon_helpers import FakeJob, Peer, thread_daemon

from adaptd import events as ev
from adaptd.protocol import job as p

V = p.VERSION


def test_sigkilled_job_is_lost_then_resume_measures_restart(daemon_proc, zctx) -> None:
    job = FakeJob(daemon_proc.endpoint, "crash-1", resumed_from=0)
    try:
        ready = job.wait_ready()
        daemon_proc.log.wait_for("event=hello", "job=crash-1", f"pid={ready['pid']}")
        info = daemon_proc.job("crash-1")
        assert info.state == "active" and info.ranks[0].pid == ready["pid"]
        job.kill()
    finally:
        job.close()
    line = daemon_proc.log.wait_for("event=job_lost", "job=crash-1")
    assert f"pid {ready['pid']} gone" in line
    lost = daemon_proc.job("crash-1")
    assert lost.state == "lost" and lost.failures == 1 and not lost.ranks[0].alive
    assert lost.step > 0
    # the job comes back from an older step (its last checkpoint) as a new process
    again = FakeJob(daemon_proc.endpoint, "crash-1", resumed_from=1)
    try:
        assert again.wait_ready()["plan_seq"] > lost.plan.seq  # a fresh plan for the new run
        line = daemon_proc.log.wait_for("event=job_resumed", "job=crash-1")
        assert "resumed_from=1" in line and f"last_step={lost.step}" in line
        info = daemon_proc.job("crash-1")
        assert info.state == "active" and info.incarnation == 2 and info.failures == 1
        assert info.restore_s is not None and 0 < info.restore_s < 30
        assert info.start_step == 1
    finally:
        again.close()


def test_events_for_loss_and_resume_in_process(short_dir, zctx) -> None:
    """The sink sees JobLost then JobResumed with consistent times and steps."""
    with thread_daemon(short_dir / "adaptd.sock") as (daemon, sink):
        job = FakeJob(daemon.endpoint, "ev-1", world_size=1)
        try:
            job.wait_ready()
            sink.wait_for(ev.JobRegistered, lambda e: e.job == "ev-1")
            job.kill()
        finally:
            job.close()
        lost = sink.wait_for(ev.JobLost, lambda e: e.job == "ev-1")
        assert lost.step > 0 and lost.last_durable_step is None and "gone" in lost.reason
        assert lost.last_seen <= lost.time
        peer = Peer(zctx, daemon.endpoint)
        peer.hello("ev-1", resumed_from=0, pid=os.getpid())
        assert not sink.of(ev.JobResumed)  # not before the first step
        peer.steps("ev-1", 1)
        resumed = sink.wait_for(ev.JobResumed, lambda e: e.job == "ev-1")
        assert resumed.lost_at == lost.time and resumed.last_step == lost.step
        assert resumed.resumed_from == 0 and resumed.lost_steps == lost.step
        # timed from the lost run's last message, not from when the loss was noticed
        assert resumed.last_seen == lost.last_seen
        assert resumed.restart_s == pytest.approx(resumed.time - lost.last_seen)
        tracker = daemon.registry.jobs["ev-1"].tracker
        assert tracker.restore_s == resumed.restart_s
        # the resume confirms the loss as one failure of the job, for its failure rate
        assert tracker.failures == 1 and tracker.failure_rate.failures == 1
        assert tracker.last_failure_time == lost.last_seen


def test_goodbye_is_not_a_failure(short_dir, zctx) -> None:
    with thread_daemon(short_dir / "adaptd.sock", tick_interval_s=0.05) as (daemon, sink):
        job = FakeJob(daemon.endpoint, "clean-1")
        try:
            job.wait_ready()
            peer = Peer(zctx, daemon.endpoint)  # a second rank that leaves cleanly
            peer.hello("clean-2", pid=os.getpid())
            peer.send(p.Goodbye(v=V, job="clean-2", rank=0, step=5, reason="done"))
            finished = sink.wait_for(ev.JobFinished, lambda e: e.job == "clean-2")
            assert finished.step == 5 and finished.reason == "done"
            job.kill()
        finally:
            job.close()
        sink.wait_for(ev.JobLost, lambda e: e.job == "clean-1")
        assert [e.job for e in sink.of(ev.JobLost)] == ["clean-1"]
        status = {j.job: j for j in daemon.status().jobs}
        assert status["clean-2"].state == "finished" and status["clean-2"].failures == 0
        # the finished job starting again is a restart, not a resume after failure
        peer.hello("clean-2", resumed_from=5)
        peer.steps("clean-2", 6)
        peer.hello("clean-2", resumed_from=5)  # reconnect: a barrier for the steps
        assert not [e for e in sink.of(ev.JobResumed) if e.job == "clean-2"]
        tracker = daemon.registry.jobs["clean-2"].tracker
        assert daemon.registry.jobs["clean-2"].incarnation == 2 and tracker.failures == 0
        assert tracker.start_step == 5 and tracker.failure_rate.failures == 0


def test_silent_rank_is_lost_and_revived_when_it_speaks(short_dir, zctx) -> None:
    kw = {"liveness_timeout_s": 0.3, "tick_interval_s": 0.05}
    with thread_daemon(short_dir / "adaptd.sock", **kw) as (daemon, sink):
        peer = Peer(zctx, daemon.endpoint)
        peer.hello("quiet-1", pid=0)  # pid unknown: only silence can tell
        lost = sink.wait_for(ev.JobLost, lambda e: e.job == "quiet-1")
        assert lost.reason.startswith("silent for")
        peer.steps("quiet-1", 3)
        revived = sink.wait_for(ev.JobRevived, lambda e: e.job == "quiet-1")
        assert revived.lost_at == lost.time
        job = daemon.registry.jobs["quiet-1"]
        assert job.state == "active" and job.failures == 0


def test_fast_restart_before_liveness_noticed(short_dir, zctx) -> None:
    """A new process says hello for a rank whose old process never said goodbye."""
    with thread_daemon(short_dir / "adaptd.sock", tick_interval_s=3600) as (daemon, sink):
        old = Peer(zctx, daemon.endpoint)
        old.hello("fast-1", pid=0, resumed_from=0)
        old.steps("fast-1", 40)
        old.hello("fast-1", pid=0)  # barrier
        new = Peer(zctx, daemon.endpoint)
        plan = new.hello("fast-1", pid=os.getpid(), resumed_from=30)
        lost = sink.wait_for(ev.JobLost, lambda e: e.job == "fast-1")
        assert "restarted as pid" in lost.reason and lost.step == 40
        assert plan.seq == 2 and plan.next_step == 50
        new.steps("fast-1", 31)
        resumed = sink.wait_for(ev.JobResumed, lambda e: e.job == "fast-1")
        assert (resumed.last_step, resumed.resumed_from) == (40, 30)
        # the old connection is no longer that rank
        old.steps("fast-1", 41)
        assert old.expect(p.Error).code == "unknown_peer"


def test_default_policy_does_not_churn_plans_on_noisy_step_times(short_dir, zctx) -> None:
    """The package default re-fits its interval to each report; ±5 % step-time noise
    must not push a new plan every second."""
    import random

    from adaptd.core.policy import DEFAULT_SPEC

    with thread_daemon(short_dir / "adaptd.sock", default_policy=DEFAULT_SPEC) as (daemon, sink):
        peer = Peer(zctx, daemon.endpoint)
        peer.hello("noisy-1", pid=0)
        rng = random.Random(7)
        for i in range(1, 61):
            peer.steps("noisy-1", i * 20, count=20, mean_s=0.05 * (1 + rng.uniform(-0.05, 0.05)))
        pushed = peer.barrier("noisy-1", pid=0)  # all 60 reports were handled
        changes = [e for e in sink.of(ev.PlanChanged) if e.job == "noisy-1"]
        assert 1 <= len(changes) <= 3, [(e.step, e.decision) for e in changes]
        assert len(pushed) == len(changes) - 1  # the first plan came with the hello
