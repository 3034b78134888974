"""Ranks without a coordination runtime agree through their daemon: the rank side
(adaptd.client.agreement.daemon_rounds) against the daemon's rounds (adaptd.core.rounds), over
real ZeroMQ sockets. The test's loop plays the daemon's part with JobRounds; three
rank threads, each with its own DaemonLink, run at different speeds."""

from __future__ import annotations

import random
import threading
import time

import zmq

from adaptd.client.agreement.daemon_rounds import DaemonRounds
from adaptd.client.daemon.link import DaemonLink
from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.rounds import JobRounds
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as p

RANKS = 3
STEPS = 2500


def rank_main(endpoint: str, rank: int, out: dict, finished: list[bool]) -> None:
    link = DaemonLink(endpoint, timeout_s=5.0)
    rounds = DaemonRounds("j", rank, timeout_s=5.0)
    schedule = SaveSchedule()
    rng = random.Random(rank)
    saves: list[int] = []
    n = due = 0

    def handle(now: float) -> None:
        for msg in link.receive(now):
            if isinstance(msg, p.Propose):
                link.send(rounds.on_propose(msg, n), now)
            elif isinstance(msg, p.Decide):
                rounds.on_decide(msg)

    def wait(seconds: float) -> None:
        if link.poll(seconds):
            handle(time.monotonic())

    hello = p.Hello(v=p.VERSION, job="j", rank=rank, world_size=RANKS, agreement="daemon")
    deadline = time.monotonic() + 60
    while not link.welcomed and time.monotonic() < deadline:
        link.send(hello, time.monotonic())
        wait(0.05)
    tick = 0.0
    for _ in range(STEPS):
        time.sleep(rng.random() * 0.0008 * (1 + rank / 2))  # ranks at different speeds
        n += 1
        now = time.monotonic()
        if now >= tick or n >= due:  # the hook's slow path: a tick or a due step
            tick = now + 0.005
            handle(now)
            if n % 20 == 0:
                link.send(p.Steps(v=p.VERSION, job="j", rank=rank, step=n, count=20,
                                  mean_s=0.001), now)  # fmt: skip
            rounds.settle(n, wait)
            rounds.apply(n, schedule)
            if n >= schedule.due:
                saves.append(n)
                schedule.saved(n)
            due = rounds.bound(schedule.due)
    # done: keep answering (proposals for steps passed are refused) until every rank
    # is done, as a job's ranks stay connected until they all end
    finished[rank] = True
    while not all(finished) and time.monotonic() < deadline + 60:
        wait(0.01)
    link.send(p.Goodbye(v=p.VERSION, job="j", rank=rank, step=n), time.monotonic())
    out[rank] = {
        "saves": saves,
        "applied": [(a.round, a.action, a.at_step, a.step) for a in rounds.applied],
        "rounds": [(r.round, r.at_step, r.commit) for r in rounds.rounds],
        "stalls": rounds.stalls,
    }
    link.close(linger_ms=100)


def test_ranks_apply_every_change_the_daemon_committed_at_the_same_step(tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/d.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    rounds = JobRounds("j", RANKS, timeout_s=2.0, lead_time_s=0.02)
    peers: dict[int, bytes] = {}
    steps: dict[int, int] = {}
    out: dict[int, dict] = {}
    finished = [False] * RANKS
    threads = [
        threading.Thread(target=rank_main, args=(endpoint, r, out, finished), daemon=True)
        for r in range(RANKS)
    ]
    for t in threads:
        t.start()
    rng = random.Random(12)
    deadline = time.monotonic() + 120

    def broadcast(msg: p.Message) -> None:
        for ident in peers.values():
            router.send_multipart([ident, p.encode(msg)])

    wishes = 0
    try:
        while any(t.is_alive() for t in threads):
            assert time.monotonic() < deadline, "ranks still running after 120 s"
            now = time.monotonic()
            if router.poll(2):
                ident, frame = router.recv_multipart()
                msg = p.decode_client(frame)
                if isinstance(msg, p.Hello):
                    peers[msg.rank] = ident
                    steps[msg.rank] = 0
                    router.send_multipart(
                        [ident, p.encode(p.Welcome(v=p.VERSION, job="j", rank=msg.rank))]
                    )
                elif isinstance(msg, p.Steps):
                    steps[msg.rank] = msg.step
                elif isinstance(msg, p.Goodbye):
                    peers.pop(msg.rank, None)
                    steps.pop(msg.rank, None)
                    decision = rounds.check(now, peers.keys())
                    if decision is not None:
                        broadcast(decision)
                elif isinstance(msg, p.Ack):
                    decision = rounds.on_ack(msg, peers.keys(), now)
                    if decision is not None:
                        broadcast(decision)
            decision = rounds.check(now, peers.keys())
            if decision is not None:
                broadcast(decision)
            if len(steps) == RANKS and not any(finished) and rng.random() < 0.05:
                if rng.random() < 0.3:
                    rounds.want_save("operator")
                else:
                    rounds.want_plan(Decision(max(steps.values()) + rng.randint(1, 40),
                                              rng.choice([3, 5, 10, None])))  # fmt: skip
                wishes += 1
            if len(peers) == RANKS:
                proposal = rounds.next(now, steps, 0.001)
                if proposal is not None:
                    broadcast(proposal)
    finally:
        router.close(0)
        ctx.term()
    assert sorted(out) == list(range(RANKS))
    first = out[0]
    for r in range(1, RANKS):
        assert out[r]["applied"] == first["applied"], f"rank {r} applied other changes"
        assert out[r]["saves"] == first["saves"], f"rank {r} saved at other steps"
    for _, _, at_step, step in first["applied"]:
        assert step == at_step
    committed = [h for h in rounds.history if h[3] and h[2] <= STEPS]
    assert len(first["applied"]) == len(committed)  # each committed change applied
    assert len(committed) >= 15 and len(first["saves"]) >= 15
    assert any(not h[3] for h in rounds.history)  # some rounds were refused and retried


def proposal(round_: int, at_step: int) -> p.Propose:
    return p.Propose(v=p.VERSION, job="j", round=round_, action="save", at_step=at_step,
                     proposer=3, reason="operator")  # fmt: skip


def test_a_rank_held_for_a_decision_that_never_comes_goes_on_after_the_timeout(
    fake_clock,
) -> None:
    rounds = DaemonRounds("j", 1, timeout_s=2.0, clock=fake_clock)
    ack = rounds.on_propose(proposal(4, 7), step=5)
    assert ack.ok and rounds.bound(100) == 7
    rounds.settle(6, fake_clock.sleep)  # not there yet: no wait
    assert fake_clock.slept == []
    rounds.settle(7, fake_clock.sleep)  # the daemon died: nothing arrives
    assert 2.0 <= sum(fake_clock.slept) < 2.2
    assert rounds.bound(100) == 100 and rounds.stalls == 1
    (r,) = rounds.rounds
    assert not r.commit and "no decision from the daemon within 2s" in r.reason


def test_a_decision_while_held_releases_the_rank_and_the_change_applies() -> None:
    rounds = DaemonRounds("j", 0)
    prop = proposal(0, 10)
    rounds.on_propose(prop, step=8)
    decide = p.Decide(v=p.VERSION, job="j", round=0, commit=True)
    rounds.settle(10, lambda s: rounds.on_decide(decide))
    schedule = SaveSchedule()
    assert rounds.apply(10, schedule) is False and schedule.due == 10


def test_a_new_proposal_ends_a_round_the_daemon_gave_up_and_late_answers_are_refused() -> None:
    rounds = DaemonRounds("j", 0)
    rounds.on_propose(proposal(5, 20), step=10)
    ack = rounds.on_propose(proposal(0, 12), step=15)  # a restarted daemon's round 0
    assert not ack.ok and ack.step == 15  # already past 12
    assert [(r.round, r.commit) for r in rounds.rounds] == [(5, False)]
    assert "superseded" in rounds.rounds[0].reason
    rounds.on_decide(p.Decide(v=p.VERSION, job="j", round=5, commit=True))  # too late
    assert rounds.ledger.pending == []
