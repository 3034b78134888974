"""A daemon that dies while it sends a round's decision: the ranks still agree.

A daemon runs the agreement rounds of a job whose ranks have no runtime of their own.
It sends a decision to each rank in turn; SIGKILLed in between (or before zmq wrote
every queued message), one rank has the commit and the others hold at the round's
step until they give it up: a suite run in two processes saw one rank of three apply
a plan the others never did (tests/daemon/test_job_agreement.py). With the state
database as the rounds' memory, the decision is written before it is sent, and the
next daemon sends it first to every rank that comes back.

The real registry, rounds, state database and each rank's own side of the rounds
(:class:`~adaptd.client.agreement.daemon_rounds.DaemonRounds`); the "death" is the
send function raising after the first decision went out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptd.client.agreement.daemon_rounds import DaemonRounds
from adaptd.core.snapshot import Decision
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.rounds import Agreements, StoredRounds
from adaptd.daemon.stats import DaemonStats
from adaptd.protocol import job as p
from adaptd.state.store import Store

WORLD = 3
JOB = "crash"


class Died(Exception):
    """The daemon's process ended here."""


class Daemon:
    """One daemon's life: its registry and rounds, with or without the database."""

    def __init__(
        self, db: Path | None, ranks: list[DaemonRounds], die_after_decides=None, lost_acks=()
    ):
        self.store = Store.open(db) if db is not None else None
        memory = StoredRounds(self.store) if self.store is not None else None
        self.ranks = ranks
        self.steps = {r.rank: 100 for r in ranks}
        self.die_after_decides = die_after_decides
        self.decides = 0
        self.lost_acks = set(lost_acks)  # ranks whose answer never reaches this daemon
        self.registry = Registry()
        self.agreements = Agreements(send=self.send, stats=DaemonStats(), memory=memory)
        self.job = None

    def send(self, rank, msg: p.DaemonMessage, now: float) -> None:
        side = self.ranks[rank.rank]
        if isinstance(msg, p.Propose):
            ack = side.on_propose(msg, self.steps[rank.rank])
            if rank.rank not in self.lost_acks:
                self.agreements.on_ack(self.job, ack, now)
        elif isinstance(msg, p.Decide):
            if self.die_after_decides is not None and self.decides == self.die_after_decides:
                raise Died
            self.decides += 1
            side.on_decide(msg)

    def hello_all(self, now: float) -> None:
        for r in self.ranks:
            hello = p.Hello(v=p.VERSION, job=JOB, rank=r.rank, world_size=WORLD,
                            resumed_from=100, agreement="daemon")  # fmt: skip
            self.job, rank, _ = self.registry.hello(f"id-{r.rank}".encode(), hello, now)
            self.agreements.on_hello(self.job, rank, now)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def plan(every: int) -> Decision:
    return Decision(next_step=1000, every_steps=every, reason="test", policy="fixed")


def committed(side: DaemonRounds) -> list[tuple[int, int | None]]:
    """(at_step, every_steps) of each plan this rank committed."""
    return [(c.at_step, c.every_steps) for c in side.ledger.pending if c.action == "plan"]


def crash_mid_decision(db: Path | None) -> list[DaemonRounds]:
    ranks = [DaemonRounds(JOB, r) for r in range(WORLD)]
    first = Daemon(db, ranks, die_after_decides=1)  # rank 0 hears the commit, then death
    first.hello_all(0.0)
    with pytest.raises(Died):
        first.agreements.want_plan(first.job, plan(7), 1.0)
    assert [committed(r) for r in ranks] == [[(committed(ranks[0])[0][0], 7)], [], []]
    assert ranks[1].open is not None and ranks[2].open is not None  # holding at its step
    first.close()  # SIGKILL: nothing more is written
    second = Daemon(db, ranks)  # the ranks come back to the restarted daemon
    second.hello_all(3.0)
    second.close()
    return ranks


def test_a_decision_one_rank_heard_before_the_daemon_died_reaches_the_others(tmp_path):
    ranks = crash_mid_decision(tmp_path / "adaptd.sqlite3")
    assert all(r.open is None for r in ranks)
    assert committed(ranks[1]) == committed(ranks[2]) == committed(ranks[0])
    assert committed(ranks[0])[0][1] == 7


def test_without_the_database_the_same_death_leaves_the_ranks_apart():
    """What the memory is for: the same crash with none (a daemon embedded by a test)."""
    ranks = crash_mid_decision(None)
    assert committed(ranks[0]) != committed(ranks[1])


def test_a_round_proposed_and_never_decided_is_given_up_by_every_rank(tmp_path):
    db = tmp_path / "adaptd.sqlite3"
    ranks = [DaemonRounds(JOB, r) for r in range(WORLD)]
    # rank 2's answer is on its way when the daemon dies: the round is never decided
    first = Daemon(db, ranks, lost_acks={2})
    first.hello_all(0.0)
    first.agreements.want_plan(first.job, plan(7), 1.0)
    held = ranks[0].open
    assert held is not None and all(r.open == held for r in ranks)
    first.close()
    second = Daemon(db, ranks)
    second.hello_all(3.0)
    second.agreements.want_plan(second.job, plan(9), 4.0)  # its first proposal
    # numbered after the round the dead daemon proposed: never taken for that one
    rounds = [[(k.round, k.commit) for k in r.ledger.rounds] for r in ranks]
    assert rounds[0] == rounds[1] == rounds[2], rounds
    assert [c for c in rounds[0] if c[0] == held.round] == [(held.round, False)]
    assert all(committed(r) and committed(r)[-1][1] == 9 for r in ranks)
    second.close()


def test_the_memory_reads_back_what_it_wrote_and_survives_a_damaged_row(tmp_path):
    store = Store.open(tmp_path / "adaptd.sqlite3")
    memory = StoredRounds(store)
    assert memory.load("j") == (0, None)
    decided = p.Decide(v=p.VERSION, job="j", round=4, commit=True, reason="", retry_from=None)
    memory.save("j", 6, decided)
    nxt, back = memory.load("j")
    assert nxt == 6 and back is not None and (back.round, back.commit) == (4, True)
    store.set_param(StoredRounds.SCOPE, "j", {"next": "six"})
    store.flush()
    assert memory.load("j") == (0, None)
    store.close()
