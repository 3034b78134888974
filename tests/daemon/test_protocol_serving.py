"""The daemon over real ZeroMQ, as a real `adaptd serve` child: hello, plans, errors, many jobs."""

from __future__ import annotations

import msgspec
import psutil
import pytest
from daemon_helpers import Peer, thread_daemon

from adaptd.core.snapshot import Snapshot
from adaptd.protocol import job as p

V = p.VERSION
# warm-up every 10 steps until 100, then every 50: a plan change at step 100
POLICY = "phased:warmup_steps=100,early_every=10,late_every=50"


def test_hello_gets_welcome_then_plan(shared_daemon, zctx) -> None:
    peer = Peer(zctx, shared_daemon.endpoint)
    peer.send(p.Hello(v=V, job="hello-1", rank=0, world_size=1, policy="fixed:steps=25"))
    welcome = peer.expect(p.Welcome)
    assert welcome.job == "hello-1" and welcome.rank == 0 and welcome.daemon_version
    plan = peer.expect(p.Plan)
    assert (plan.job, plan.seq, plan.next_step, plan.every_steps) == ("hello-1", 1, 25, 25)
    assert plan.policy == "fixed" and plan.reason == "every 25 steps"
    assert shared_daemon.log.wait_for("event=plan", "job=hello-1", "seq=1")


def test_daemon_default_policy_when_job_names_none(shared_daemon, zctx) -> None:
    # shared_daemon runs with --policy phased (daemon_helpers.PINNED)
    plan = Peer(zctx, shared_daemon.endpoint).hello("default-1")
    assert plan.policy == "phased" and (plan.next_step, plan.every_steps) == (50, 50)


def test_plan_change_is_pushed_to_all_ranks(shared_daemon, zctx) -> None:
    r0, r1 = Peer(zctx, shared_daemon.endpoint), Peer(zctx, shared_daemon.endpoint)
    first = r0.hello("push-1", 0, world_size=2, policy=POLICY)
    again = r1.hello("push-1", 1, world_size=2, policy=POLICY)
    assert first == again  # the joining rank gets the job's current plan, same seq
    assert (first.seq, first.next_step, first.every_steps) == (1, 10, 10)
    # steps inside the same grid: no new plan for anyone
    r0.steps("push-1", 35)
    assert r0.silent_for(0.3) and r1.silent_for(0.05)
    # rank 1 crosses the warm-up boundary: both ranks get plan 2
    r1.steps("push-1", 120, rank=1)
    for peer in (r0, r1):
        plan = peer.expect(p.Plan)
        assert (plan.seq, plan.next_step, plan.every_steps) == (2, 150, 50)
        assert "after warm-up" in plan.reason


def test_plan_resent_after_two_seconds_of_silence(shared_daemon, zctx) -> None:
    peer = Peer(zctx, shared_daemon.endpoint)
    plan = peer.hello("resend-1", policy="fixed:steps=1000")
    peer.steps("resend-1", 1)
    assert peer.silent_for(1.0)  # the daemon spoke to this rank less than 2 s ago: no resend
    assert peer.silent_for(1.2)  # nothing unprompted either; now over 2 s have passed
    peer.steps("resend-1", 2)
    assert peer.expect(p.Plan, timeout=2.0) == plan  # same plan, same seq


def test_any_message_after_the_keepalive_interval_is_answered(short_dir, zctx) -> None:
    # The client times silence from a send made KEEPALIVE_S after the daemon's newest
    # message (client/daemon/link.py), whatever that send is: here a JobPlan, which changes
    # nothing and needs no answer of its own. (The interval is shortened for the test.)
    with thread_daemon(short_dir / "a.sock", resend_after_s=0.3) as (d, _):
        peer = Peer(zctx, d.endpoint)
        plan = peer.hello("keep-1", policy="fixed:steps=1000")
        job_plan = p.JobPlan(v=V, job="keep-1", rank=0, at_step=0, next_step=1000, every_steps=1000)
        peer.send(job_plan)
        assert peer.silent_for(0.2)  # within the interval: not answered
        assert peer.silent_for(0.2)  # and nothing unprompted
        peer.send(job_plan)
        assert peer.expect(p.Plan, timeout=2.0) == plan
        peer.send(p.Goodbye(v=V, job="keep-1", rank=0, step=5, reason="done"))
        assert peer.silent_for(0.5)  # a goodbye is never answered


def test_unknown_peer_then_hello_works(shared_daemon, zctx) -> None:
    peer = Peer(zctx, shared_daemon.endpoint)
    peer.steps("ghost-1", 10)
    err = peer.expect(p.Error)
    assert err.code == "unknown_peer" and "hello" in err.message
    peer.send(p.Goodbye(v=V, job="ghost-1", rank=0, step=10))
    assert peer.expect(p.Error).code == "unknown_peer"
    assert peer.hello("ghost-1").seq == 1
    peer.steps("ghost-1", 11)
    assert peer.silent_for(0.3)  # accepted: no error


@pytest.mark.parametrize(
    "msg",
    [
        p.Steps(v=V, job="other-job", rank=0, step=5, count=1, mean_s=0.1),
        p.Steps(v=V, job="wrong-1", rank=1, step=5, count=1, mean_s=0.1),
        p.SaveReport(v=V, job="other-job", rank=0, step=5, blocking_s=0.1, durable_s=1, bytes=1),
        p.Hello(v=V, job="other-job"),
    ],
)
def test_wrong_job_is_refused_and_ignored(shared_daemon, zctx, msg) -> None:
    peer = Peer(zctx, shared_daemon.endpoint)
    peer.hello("wrong-1", 0, world_size=2)
    before = shared_daemon.job("wrong-1")
    peer.send(msg)
    err = peer.expect(p.Error)
    assert err.code == "wrong_job" and "wrong-1" in err.message
    after = shared_daemon.job("wrong-1")
    assert (after.step, after.saves, len(after.ranks)) == (before.step, before.saves, 1)
    assert all(j.job != "other-job" for j in shared_daemon.status().jobs)


def test_bad_policy_gets_error_and_the_default(shared_daemon, zctx) -> None:
    peer = Peer(zctx, shared_daemon.endpoint)
    peer.send(p.Hello(v=V, job="badpol-1", policy="fixed:steps=0"))
    peer.expect(p.Welcome)
    plan = peer.expect(p.Plan)
    assert plan.policy == "phased"
    err = peer.expect(p.Error)
    assert err.code == "bad_policy" and "steps must be >= 1" in err.message
    assert shared_daemon.job("badpol-1").policy == "phased"


def raw(**fields) -> bytes:
    return msgspec.msgpack.encode(fields)


BAD_FRAMES = [
    pytest.param([b"\xc1\xc1"], "malformed", "malformed", id="malformed"),
    pytest.param([b""], "malformed", "malformed", id="empty"),
    pytest.param([raw(kind="hello", v=V)], "invalid", "invalid", id="invalid-missing-job"),
    pytest.param(
        [raw(kind="plan", v=V, job="j", seq=1, next_step=1)],
        "invalid",
        "invalid",
        id="invalid-daemon-kind",
    ),
    pytest.param(
        [raw(kind="hello", v=V, job="j", rank=2, world_size=2)],
        "invalid",
        "invalid",
        id="invalid-rank-outside-world",
    ),
    pytest.param([raw(kind="hello", v=99, job="j")], "version", "version", id="version"),
    pytest.param([b"\x00" * (p.MAX_MESSAGE_BYTES + 1)], "too_large", "too_large", id="too_large"),
    pytest.param(
        [p.encode(p.Hello(v=V, job="j")), b"extra"], "malformed", "multipart", id="multipart"
    ),
]


@pytest.mark.parametrize(("frames", "code", "counter"), BAD_FRAMES)
def test_bad_frames_get_error_counted_and_daemon_serves_on(
    shared_daemon, zctx, frames, code, counter
) -> None:
    before = shared_daemon.status().daemon.rejected.get(counter, 0)
    bad = Peer(zctx, shared_daemon.endpoint)
    bad.send_raw(*frames)
    err = bad.expect(p.Error)
    assert err.code == code, err
    assert shared_daemon.status().daemon.rejected.get(counter, 0) == before + 1
    good = Peer(zctx, shared_daemon.endpoint)
    assert good.hello(f"after-{counter}-{len(frames[0])}").seq == 1


def test_frame_beyond_hard_cap_drops_only_that_peer(shared_daemon, zctx) -> None:
    from adaptd.daemon.server import HARD_MAX_FRAME

    bad = Peer(zctx, shared_daemon.endpoint)
    bad.send_raw(b"\x00" * (HARD_MAX_FRAME + 1))  # ZeroMQ cuts this peer off
    assert bad.silent_for(0.3)
    assert Peer(zctx, shared_daemon.endpoint).hello("after-hard-cap").seq == 1


def test_flood_of_bad_frames_keeps_memory_bounded(shared_daemon, zctx) -> None:
    proc = psutil.Process(shared_daemon.proc.pid)
    flood = Peer(zctx, shared_daemon.endpoint)  # never reads its error replies
    frame = b"\xc1" * 1024
    flood.send_raw(frame)
    flood.expect(p.Error)  # warm: the first reply made it
    rss0 = proc.memory_info().rss
    before = shared_daemon.status().daemon
    n = 20_000
    for _ in range(n):
        flood.send_raw(frame)
    # a good job is served while the flood is being handled
    assert Peer(zctx, shared_daemon.endpoint).hello("during-flood").seq == 1
    after = shared_daemon.status().daemon
    handled = after.rejected["malformed"] - before.rejected["malformed"]
    assert 0 < handled <= n
    grown = proc.memory_info().rss - rss0
    assert grown < 64 * 2**20, f"daemon grew by {grown / 2**20:.1f} MiB during the flood"


def test_twenty_jobs_of_two_ranks(shared_daemon, zctx) -> None:
    peers = {}
    for j in range(20):
        for r in range(2):
            peer = Peer(zctx, shared_daemon.endpoint)
            peer.send(p.Hello(v=V, job=f"many-{j}", rank=r, world_size=2, policy="fixed:steps=7"))
            peers[j, r] = peer
    for peer in peers.values():
        peer.expect(p.Welcome)
        assert peer.expect(p.Plan).next_step == 7
    plans_before = shared_daemon.status().daemon.plans_sent
    for (j, r), peer in peers.items():
        peer.steps(f"many-{j}", 10 + j, rank=r)
    for (j, r), peer in peers.items():  # a barrier: the pipe is ordered, so once the
        peer.hello(f"many-{j}", r, world_size=2)  # reconnect's reply is in, steps were handled
    jobs = {j.job: j for j in shared_daemon.status().jobs if j.job.startswith("many-")}
    assert len(jobs) == 20
    for j in range(20):
        info = jobs[f"many-{j}"]
        assert [r.rank for r in info.ranks] == [0, 1] and all(r.alive for r in info.ranks)
        step = 10 + j
        assert info.step == step and info.next_save_step == -(-step // 7) * 7
    # crossing step 7 keeps the same grid: no plan was pushed again
    assert shared_daemon.status().daemon.plans_sent == plans_before
    assert all(peer.silent_for(0.0) for peer in peers.values())
    assert shared_daemon.job("many-0").incarnation == 1  # reconnects are not restarts


def test_save_report_updates_costs_and_save_now_reaches_ranks(shared_daemon, zctx) -> None:
    from adaptd.protocol import admin

    r0, r1 = Peer(zctx, shared_daemon.endpoint), Peer(zctx, shared_daemon.endpoint)
    r0.hello("save-1", 0, world_size=2, policy="fixed:steps=10")
    r1.hello("save-1", 1, world_size=2)
    for peer, rank in ((r0, 0), (r1, 1)):  # both ranks report the same save: counted once
        peer.send(
            p.SaveReport(
                v=V,
                job="save-1",
                rank=rank,
                step=10,
                blocking_s=0.02,
                durable_s=0.5,
                bytes=1000,
                extra_step_s=0.01,
                reason="every 10 steps",
            )
        )
    shared_daemon.log.wait_for("event=save", "job=save-1", "rank=1")
    info = shared_daemon.job("save-1")
    assert info.saves == 1 and info.last_durable_step == 10
    assert info.save_cost_s == pytest.approx(0.03) and info.save_latency_s == pytest.approx(0.5)
    reply = admin.request(shared_daemon.socket, admin.SaveNowRequest(job="save-1", reason="ops"))
    assert isinstance(reply, admin.SaveNowReply) and reply.jobs == ["save-1"] and reply.ranks == 2
    for peer in (r0, r1):
        msg = peer.expect(p.SaveNow)
        assert msg.reason == "ops" and msg.job == "save-1"
    assert shared_daemon.job("save-1").urgent == "ops"
    with pytest.raises(admin.AdminError) as exc:
        admin.request(shared_daemon.socket, admin.SaveNowRequest(job="no-such-job"))
    assert exc.value.code == "unknown_job"


def test_no_second_save_is_planned_behind_one_in_flight(short_dir, zctx) -> None:
    """An interval that drifts with the step time re-plans from the save in flight.

    The hook reports its save as durable only seconds later; until then the daemon
    places it from the in-flight flag, or Daly would plan a save right behind it.
    """
    now = [1000.0]  # the daemon's clock, moved by the test: step times are exact
    kw = {"clock": lambda: now[0], "snapshot_source": lambda: Snapshot(time=now[0])}
    with thread_daemon(short_dir / "adaptd.sock", tick_interval_s=3600, **kw) as (daemon, _):
        peer = Peer(zctx, daemon.endpoint)
        assert peer.hello("drift-1", policy="daly:probe_s=20,mtbf_s=2000").next_step is None
        now[0] += 1.0
        peer.steps("drift-1", 10, count=10, mean_s=0.1)
        plan = peer.expect(p.Plan)  # probe: 20 s at 0.1 s a step
        assert (plan.next_step, plan.every_steps) == (200, 200)
        # the hook saved at step 200; steps got 30 % slower, so 20 s is fewer steps now
        now[0] += 20.0
        peer.send(
            p.Steps(
                v=V, job="drift-1", rank=0, step=205, count=195, mean_s=0.13, save_in_flight=True
            )
        )
        plan = peer.expect(p.Plan)
        assert plan.every_steps < 200 and plan.next_step == 200 + plan.every_steps
        tracker = daemon.registry.jobs["drift-1"].tracker
        assert (tracker.last_save_step, tracker.save_in_flight) == (200, True)
        # the report: δ is known, Daly's interval replaces the probe, still from step 200
        now[0] += 3.0
        peer.send(
            p.SaveReport(
                v=V,
                job="drift-1",
                rank=0,
                step=200,
                blocking_s=0.05,
                durable_s=3.0,
                bytes=1,
                extra_step_s=0.02,
            )
        )
        plan = peer.expect(p.Plan)
        assert plan.policy == "daly" and plan.next_step == 200 + plan.every_steps
