"""One authority per job, job-wide figures (docs/multiworker.md).

Two daemons in this process play two hosts (their own sockets, state and host names);
a job whose ranks agree on TensorFlow's coordination service has rank 0 on host A
and rank 1 on host B, each a raw DEALER peer speaking the protocol as the hook does.
A decides the job's plan; B shows the plan the ranks report (JobPlan) and who decided
it, and relays what an operator types there to A through the job's rank (Relay, then
the chief's Request). δ of a job is its slowest rank's; a job failure counts once.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from daemon_helpers import DEADLINE, PINNED, EventLog, Peer

from adaptd import events as ev
from adaptd.commands.status import render
from adaptd.core.estimators import FailureRate, JobTracker
from adaptd.core.snapshot import GpuSample, Snapshot
from adaptd.daemon.assembly import Seams, build
from adaptd.daemon.options import DaemonOptions
from adaptd.daemon.server import Daemon
from adaptd.protocol import admin
from adaptd.protocol import job as p
from adaptd.protocol.relay_auth import RelayKey

V = p.VERSION
#: The relay key both hosts share (daemon.relay_key_file).
FLEET_SECRET = b"the fleet's shared relay secret"


@contextlib.contextmanager
def host(
    sock: Path,
    name: str,
    snapshot_source: Callable[[], Snapshot] | None = None,
    relay_key: RelayKey | None = None,
) -> Iterator[tuple[Daemon, EventLog, FailureRate]]:
    """A daemon on host ``name`` whose jobs share one failure rate, as ``adaptd serve``'s do."""
    sink = EventLog()
    rate = FailureRate()

    def tracker(msg: p.Hello) -> JobTracker:
        return JobTracker(msg.job, world_size=msg.world_size, start_step=msg.resumed_from,
                          failure_rate=rate)  # fmt: skip

    extra: dict = {} if snapshot_source is None else {"snapshot_source": snapshot_source}
    d = build(
        DaemonOptions(socket=sock, default_policy=PINNED, hostname=name, relay_key=relay_key),
        Seams(sinks=[sink], tracker_factory=tracker, **extra),
    ).start()
    try:
        yield d, sink, rate
    finally:
        d.stop()


def hello(peer: Peer, rank: int, host: str, pid: int = 0, resumed_from: int = 0) -> None:
    peer.send(p.Hello(v=V, job="mw", rank=rank, world_size=2, pid=pid, hostname=host,
                      resumed_from=resumed_from, agreement="coordination"))  # fmt: skip
    peer.expect(p.Welcome)


def job_info(d: Daemon) -> admin.JobInfo:
    return next(j for j in d.status().jobs if j.job == "mw")


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.fixture
def two_hosts(short_dir: Path):
    (short_dir / "a").mkdir()
    (short_dir / "b").mkdir()
    with (
        host(short_dir / "a" / "d.sock", "host-a", relay_key=RelayKey(FLEET_SECRET)) as a,
        host(short_dir / "b" / "d.sock", "host-b", relay_key=RelayKey(FLEET_SECRET)) as b,
    ):
        yield a, b


def test_the_chiefs_daemon_decides_the_other_shows_its_plan_and_relays_requests(
    two_hosts,
) -> None:
    (a, _, _), (b, _, _) = two_hosts
    ctx = zmq.Context.instance()
    chief, worker = Peer(ctx, a.endpoint), Peer(ctx, b.endpoint)
    try:
        hello(chief, 0, "host-a")
        first = chief.expect(p.Plan)  # A decides: its plan goes to the chief, who proposes it
        hello(worker, 1, "host-b")
        assert worker.silent_for(0.3)  # B decides nothing: no plan of its own
        info_b = job_info(b)
        assert not info_b.decided_here and info_b.decided_by == "" and info_b.plan is None
        info_a = job_info(a)
        assert info_a.decided_here and info_a.decided_by == "host-a"
        assert info_a.agreement == "coordination" and info_a.plan.policy == first.policy

        # the ranks agreed on A's plan: B shows it, and who decided it
        worker.send(p.JobPlan(v=V, job="mw", rank=1, at_step=100, next_step=100, every_steps=50,
                              policy=first.policy, reason="agreed", decided_by="host-a",
                              source="daemon"))  # fmt: skip
        worker.steps("mw", 60, rank=1)
        assert worker.silent_for(0.3)
        info_b = job_info(b)
        assert info_b.decided_by == "host-a" and info_b.plan_from_step == 100
        assert (info_b.plan.next_step, info_b.plan.every_steps) == (100, 50)
        assert info_b.next_save_step == 100
        shown = render(b.status())  # what `adaptd status` prints on B
        head, row = shown.splitlines()[3:5]
        assert "DECIDED_BY" in head and row.split()[6] == "host-a"
        assert "plan decided by host-a; agreed plan in force from step 100" in shown
        assert "here (host-a)" in render(a.status())

        # set-policy typed on B: relayed to its rank, nothing changed on B
        reply = admin.request(b.socket_path, admin.SetPolicyRequest(job="mw", spec="fixed:steps=7"),
                              timeout_s=DEADLINE)  # fmt: skip
        assert isinstance(reply, admin.SetPolicyReply) and reply.relayed_to == "host-a"
        relay = worker.expect(p.Relay)
        assert (relay.op, relay.spec, relay.origin) == ("set_policy", "fixed:steps=7", "host-b")
        assert job_info(b).policy == PINNED and "mw" not in b.job_settings
        with pytest.raises(admin.AdminError) as bad:  # a bad spec is refused where typed
            admin.request(b.socket_path, admin.SetPolicyRequest(job="mw", spec="nope"))
        assert bad.value.code == "bad_policy"

        # ... the chief hands it to A (signed by B), which applies it as if typed there
        chief.send(p.Request(v=V, job="mw", rank=0, op="set_policy", spec="fixed:steps=7",
                             origin="host-b", auth=relay.auth))  # fmt: skip
        plan = chief.expect(p.Plan)
        assert plan.every_steps == 7 and plan.policy == "fixed"
        assert job_info(a).policy == "fixed:steps=7" and a.job_settings["mw"].policy

        # save-now and pause on B are relayed too; a Request to B is refused there
        reply = admin.request(b.socket_path, admin.SaveNowRequest(job="mw", reason="op"))
        assert reply.relayed == ["mw"] and reply.ranks == 0
        assert worker.expect(p.Relay).op == "save_now"
        reply = admin.request(b.socket_path, admin.PauseRequest(job="mw", paused=True))
        assert reply.relayed == ["mw"] and reply.jobs == []
        pause = worker.expect(p.Relay)
        assert pause.op == "pause" and pause.auth and not job_info(b).paused
        worker.send(p.Request(v=V, job="mw", rank=1, op="save_now", origin="host-b"))
        error = worker.expect(p.Error)
        assert error.code == "refused" and "does not decide" in error.message
        chief.send(p.Request(v=V, job="mw", rank=0, op="pause", origin="host-b", auth=pause.auth))
        assert chief.expect(p.Plan).next_step is None and job_info(a).paused
    finally:
        chief.close()
        worker.close()


def test_delta_of_a_job_is_its_slowest_ranks_cost(two_hosts) -> None:
    (a, _, _), _ = two_hosts
    ctx = zmq.Context.instance()
    chief = Peer(ctx, a.endpoint)
    try:
        hello(chief, 0, "host-a")
        chief.expect(p.Plan)

        def report(step: int, blocking: float, **kw) -> None:
            chief.send(p.SaveReport(v=V, job="mw", rank=0, step=step, blocking_s=blocking,
                                    durable_s=blocking, bytes=1, **kw))  # fmt: skip

        # the other rank's cost, forwarded by the chief after its own report ...
        report(10, 0.1)
        chief.send(p.SaveCost(v=V, job="mw", rank=1, step=10, blocking_s=2.0, extra_step_s=0.5))
        # ... before it, and as the job's cost the chief measured over every rank
        chief.send(p.SaveCost(v=V, job="mw", rank=1, step=20, blocking_s=2.5))
        report(20, 0.1)
        report(30, 0.1, job_cost_s=2.5, slowest_rank=1)
        chief.barrier("mw", 0, world_size=2, hostname="host-a", agreement="coordination")
        info = job_info(a)
        assert info.saves == 3 and info.save_cost_s == pytest.approx(2.5)
    finally:
        chief.close()


def test_a_job_failure_counts_once_on_the_deciding_host_only(two_hosts) -> None:
    (a, sink_a, rate_a), (b, sink_b, rate_b) = two_hosts
    ctx = zmq.Context.instance()
    procs = [sleeper(), sleeper()]
    chief, worker = Peer(ctx, a.endpoint), Peer(ctx, b.endpoint)
    try:
        hello(chief, 0, "host-a", pid=procs[0].pid)
        hello(worker, 1, "host-b", pid=procs[1].pid)
        for proc in procs:  # both workers die (one would take the job down with it)
            proc.kill()
            proc.wait()
        sink_a.wait_for(ev.JobLost)
        sink_b.wait_for(ev.JobLost)
        # the job is restarted from its checkpoint: each host sees its rank come back
        hello(Peer(ctx, a.endpoint), 0, "host-a", resumed_from=5)
        hello(Peer(ctx, b.endpoint), 1, "host-b", resumed_from=5)
        assert rate_a.failures == 1  # one job failure, learned once, by the deciding host
        assert rate_b.failures == 0
        assert job_info(a).incarnation == job_info(b).incarnation == 2
    finally:
        for peer in (chief, worker):
            peer.close()
        for proc in procs:
            proc.kill()
            proc.wait()


def test_three_ranks_lost_together_are_one_failure_of_the_job(short_dir: Path) -> None:
    procs = [sleeper() for _ in range(3)]
    ctx = zmq.Context.instance()
    with host(short_dir / "d.sock", "host-a") as (d, sink, rate):
        peers = [Peer(ctx, d.endpoint) for _ in range(3)]
        try:
            for r, peer in enumerate(peers):
                peer.send(p.Hello(v=V, job="three", rank=r, world_size=3, pid=procs[r].pid,
                                  agreement="daemon"))  # fmt: skip
                peer.expect(p.Welcome)
            for proc in procs:
                proc.kill()
                proc.wait()
            sink.wait_for(ev.JobLost)
            for r in range(3):
                again = Peer(ctx, d.endpoint)
                peers.append(again)
                again.send(p.Hello(v=V, job="three", rank=r, world_size=3, resumed_from=5,
                                   agreement="daemon"))  # fmt: skip
                again.expect(p.Welcome)
            info = next(j for j in d.status().jobs if j.job == "three")
            assert rate.failures == 1 and info.failures == 1 and len(sink.of(ev.JobLost)) == 1
        finally:
            for peer in peers:
                peer.close()
            for proc in procs:
                proc.kill()
                proc.wait()


def test_an_xid_on_a_non_deciding_host_makes_its_rank_ask_for_one_urgent_save(
    short_dir: Path,
) -> None:
    """The health triggers run where the GPUs are: host B sees an XID on the GPU of its
    rank 1 and asks that rank to save now (the rank proposes one urgent save to the whole
    job, in-band); B pushes no plan of its own, and asks once per event, not per report."""
    (short_dir / "a").mkdir()
    (short_dir / "b").mkdir()
    sick = {"xid": (79,)}

    def snapshot_b() -> Snapshot:
        gpu = GpuSample(index=0, uuid="GPU-b0", xid_events=sick["xid"], pids=(os.getpid(),))
        return Snapshot(time=0.0, gpus=(gpu,))

    risky = "daly+risk"
    with (
        host(short_dir / "a" / "d.sock", "host-a") as (a, _, _),
        host(short_dir / "b" / "d.sock", "host-b", snapshot_source=snapshot_b) as (b, _, _),
    ):
        ctx = zmq.Context.instance()
        chief, worker = Peer(ctx, a.endpoint), Peer(ctx, b.endpoint)
        try:
            me = os.getpid()  # rank 1's process: alive, and on B's GPU 0
            for peer, rank, name in ((chief, 0, "host-a"), (worker, 1, "host-b")):
                peer.send(p.Hello(v=V, job="mw", rank=rank, world_size=2, pid=me,
                                  hostname=name, agreement="coordination",
                                  policy=risky))  # fmt: skip
                peer.expect(p.Welcome)
            assert chief.expect(p.Plan) is not None  # A decides; its health view is clean
            worker.steps("mw", 40, rank=1)
            urgent = worker.expect(p.SaveNow)
            assert "XID 79" in urgent.reason and "host-b" in urgent.reason
            worker.steps("mw", 50, rank=1)
            assert worker.silent_for(0.3)  # the same event is not asked for again
            sick["xid"] = ()
            worker.steps("mw", 60, rank=1)
            assert worker.silent_for(0.3)  # healthy again: no plan from B either
            sick["xid"] = (48,)
            worker.steps("mw", 70, rank=1)
            assert "XID 48" in worker.expect(p.SaveNow).reason  # a new event: asked again
            assert job_info(b).plan is None and not job_info(b).decided_here
        finally:
            chief.close()
            worker.close()
