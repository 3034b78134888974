"""A job of several ranks on one daemon: every change of plan, and every save-now, is
agreed in the daemon's rounds (adaptd.core.rounds over adaptd.daemon.jobs.rounds) and taken by
every rank at the same step, whatever the timing; a rank that dies does not hold the
others, and neither does a daemon SIGKILLed and restarted mid-run.

The ranks are threads running the client's own rank side (tests/daemon/agreeing_rank.py)
against a real daemon over real ZeroMQ sockets; the operator's commands go over the
real admin socket."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq
from agreeing_rank import AgreeingRank
from daemon_helpers import DEADLINE, DaemonProc, Peer, thread_daemon

from adaptd.protocol import admin
from adaptd.protocol import job as p

RANKS = 3


def start_ranks(
    endpoint: str, job: str, steps: int, **kw
) -> tuple[list[AgreeingRank], threading.Event]:
    done = threading.Event()
    ranks = [AgreeingRank(endpoint, job, r, RANKS, steps, done=done, **kw) for r in range(RANKS)]
    for r in ranks:
        r.start()
    return ranks, done


def finish(ranks: list[AgreeingRank], done: threading.Event, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    for r in ranks:
        assert r.finished.wait(max(0.0, deadline - time.monotonic())), f"{r.name} hangs"
    done.set()
    for r in ranks:
        r.join(max(0.1, deadline - time.monotonic()))
        assert not r.is_alive(), f"{r.name} did not end"
        assert r.error is None, f"{r.name}: {r.error!r}"


def assert_agreed(ranks: list[AgreeingRank], min_saves: int) -> None:
    first = ranks[0].record
    for r in ranks:
        rec = r.record
        assert rec.plain == [], f"{r.name} got plain plans: {rec.plain[:3]}"
        assert rec.steps == first.steps
        assert rec.applied == first.applied, f"{r.name} applied other changes"
        assert rec.saves == first.saves, f"{r.name} saved at other steps"
        assert all(at == step for _, at, step in rec.applied)  # at the agreed step itself
    assert len(first.saves) >= min_saves, first.saves


def set_policy(socket: Path, job: str, spec: str) -> None:
    reply = admin.request(socket, admin.SetPolicyRequest(job=job, spec=spec), timeout_s=DEADLINE)
    assert isinstance(reply, admin.SetPolicyReply)


def save_now(socket: Path, job: str) -> None:
    reply = admin.request(socket, admin.SaveNowRequest(job=job, reason="op"), timeout_s=DEADLINE)
    assert isinstance(reply, admin.SaveNowReply) and reply.ranks == RANKS


def wait_joined(socket: Path, job: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        jobs = admin.request(socket, admin.StatusRequest(), timeout_s=DEADLINE).jobs
        info = next((j for j in jobs if j.job == job), None)
        if info is not None and len(info.ranks) == RANKS and info.step > 0:
            return
        time.sleep(0.02)  # polling the status: there is no event to wait on over the socket
    raise TimeoutError(f"job {job} did not start on the daemon")


def operate(socket: Path, job: str, changes: int, seconds: float, seed: int) -> int:
    """``changes`` random set-policy changes (and some save-now) at random moments."""
    rng = random.Random(seed)
    saves = 0
    for _ in range(changes):
        time.sleep(rng.random() * 2 * seconds / changes)  # random moments, by design
        if rng.random() < 0.1:
            save_now(socket, job)
            saves += 1
        set_policy(socket, job, f"fixed:steps={rng.randint(20, 400)}")
    return saves


def test_random_plan_changes_and_save_now_reach_every_rank_at_the_same_step(short_dir) -> None:
    sock = short_dir / "adaptd.sock"
    with thread_daemon(sock) as (d, _):
        ranks, done = start_ranks(d.endpoint, "agree", steps=4000)
        wait_joined(sock, "agree")
        operate(sock, "agree", changes=100, seconds=3.0, seed=7)
        finish(ranks, done)
        info = next(j for j in d.status().jobs if j.job == "agree")
    assert_agreed(ranks, min_saves=10)
    rounds = info.rounds
    assert info.agreement == "daemon" and info.decided_here and rounds is not None
    assert rounds.committed >= 10  # plans and saves agreed, wishes in between coalesced
    applied = ranks[0].record.applied
    assert sum(a == "save" for a, _, _ in applied) >= 1  # a save-now was taken by all
    assert d.counters["plans_sent"] == 0  # no plain plan ever went to these ranks


def test_a_rank_that_dies_mid_round_does_not_hold_the_others(short_dir) -> None:
    sock = short_dir / "adaptd.sock"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with thread_daemon(sock) as (d, _):
        peers = [Peer(zmq.Context.instance(), d.endpoint) for _ in range(RANKS)]
        try:
            for r, peer in enumerate(peers):
                pid = child.pid if r == 2 else 0  # rank 2's process is the child
                peer.send(p.Hello(v=p.VERSION, job="die", rank=r, world_size=RANKS, pid=pid,
                                  agreement="daemon"))  # fmt: skip
                peer.expect(p.Welcome)
            # every rank known: the job's plan is proposed to all three
            props = [peer.expect(p.Propose) for peer in peers]
            assert {x.round for x in props} == {0} and props[0].action == "plan"
            for r in (0, 1):
                peers[r].send(p.Ack(v=p.VERSION, job="die", rank=r, round=0, step=1, ok=True))
            assert peers[0].silent_for(0.3)  # rank 2 has not answered: no decision yet
            t0 = time.monotonic()
            child.kill()
            child.wait()
            for r in (0, 1):
                decide = peers[r].expect(p.Decide, timeout=5.0)
                assert decide.round == 0 and decide.commit  # the dead rank is not waited for
            assert time.monotonic() - t0 < 5.0  # its loss, not the round's 10 s timeout
            set_policy(sock, "die", "fixed:steps=7")  # the next round asks the live ranks only
            for r in (0, 1):
                prop = peers[r].expect(p.Propose)
                assert prop.every_steps == 7
                peers[r].send(p.Ack(v=p.VERSION, job="die", rank=r, round=prop.round, step=2,
                                    ok=True))  # fmt: skip
            for r in (0, 1):
                assert peers[r].expect(p.Decide).commit
            assert peers[2].silent_for(0.2)
        finally:
            for peer in peers:
                peer.close()
            child.kill()
            child.wait()


def test_a_rank_past_the_proposed_step_aborts_the_round_and_it_is_proposed_further_on(
    short_dir,
) -> None:
    sock = short_dir / "adaptd.sock"
    with thread_daemon(sock) as (d, _):
        peers = [Peer(zmq.Context.instance(), d.endpoint) for _ in range(2)]
        try:
            for r, peer in enumerate(peers):
                peer.send(p.Hello(v=p.VERSION, job="late", rank=r, world_size=2,
                                  agreement="daemon"))  # fmt: skip
                peer.expect(p.Welcome)
            first, other = (peer.expect(p.Propose) for peer in peers)
            assert first == other
            peers[0].send(p.Ack(v=p.VERSION, job="late", rank=0, round=0, step=1, ok=True))
            far = first.at_step + 500  # rank 1 was already past the step
            peers[1].send(p.Ack(v=p.VERSION, job="late", rank=1, round=0, step=far, ok=False))
            for peer in peers:
                decide = peer.expect(p.Decide)
                assert not decide.commit and decide.retry_from == far
            again = [peer.expect(p.Propose) for peer in peers]
            assert again[0] == again[1] and again[0].round == 1 and again[0].at_step > far
        finally:
            for peer in peers:
                peer.close()


@pytest.mark.slow
def test_a_daemon_sigkilled_and_restarted_mid_run_keeps_the_ranks_agreeing(short_dir) -> None:
    sock = short_dir / "adaptd.sock"
    d = DaemonProc(sock)
    try:
        ranks, done = start_ranks(d.endpoint, "crash", steps=5000, hold_s=2.0)
        wait_joined(sock, "crash")
        operate(sock, "crash", changes=20, seconds=1.0, seed=1)
        d.proc.kill()  # SIGKILL: whatever round was in flight is left undecided
        d.proc.wait()
        d.stop()
        d = DaemonProc(sock)  # same socket and state: the ranks come back to it
        wait_joined(sock, "crash")
        operate(sock, "crash", changes=20, seconds=1.0, seed=2)
        finish(ranks, done)
        info = d.job("crash")
    finally:
        d.stop()
    assert_agreed(ranks, min_saves=5)
    assert all(r.record.hellos >= 2 for r in ranks)  # each said hello to the new daemon
    assert info.rounds is not None and info.rounds.committed >= 1
