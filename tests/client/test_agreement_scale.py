"""The agreement's key-value work against the job's size, counted (not timed) at the
one store interface (:class:`adaptd.client.agreement.kv.CountingStore`): a guard that
the chief's work per round grows no faster than the job, and that an idle chief's
mail reading does not grow with every rank (docs/scale.md, "The agreement"; the
figures on the real coordination service are benchmarks/scale_agreement.py's).

The ranks are real :class:`~adaptd.client.agreement.rounds.Agreement` objects, each
with its watcher thread, in this process, on a store with the coordination service's
semantics (first writer wins, a get waits for its key)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from adaptd.client.agreement.kv import CountingStore, Keys
from adaptd.client.agreement.mailbox import (
    CALLS_PER_COLLECT,
    GROUP,
    PER_COLLECT,
    SURE_WAIT_S,
    TRIES,
    Mailbox,
)
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import Agreement, AgreementOptions
from adaptd.client.save.schedule import SaveSchedule
from adaptd.protocol import job as p
from client.kv_store import WaitingDictStore

DEADLINE_S = 20.0
ROUND_KINDS = ("proposal", "ack", "decision", "round")
WAIT = ("get", "proposal")


class Rank:
    def __init__(self, store: WaitingDictStore, rank: int, world: int) -> None:
        self.store = CountingStore(store)
        self.recorded = threading.Event()
        self.agreement = Agreement(
            self.store,
            Identity("scale", rank, world),
            position=lambda: 0,
            wake=self._wake,
            session=0,
            options=AgreementOptions(timeout_s=DEADLINE_S, slice_s=DEADLINE_S, lead_time_s=0.0),
        )

    def _wake(self) -> None:
        if self.agreement.ledger.rounds:
            self.recorded.set()


def round_ops(world: int) -> tuple[int, int]:
    """One committed save round in a job of ``world`` ranks: the chief's calls on the
    round's keys, and the most any other rank made."""
    shared = WaitingDictStore()
    ranks = [Rank(shared, r, world) for r in range(world)]
    for r in ranks:
        r.agreement.start()
    try:
        chief = ranks[0]
        before = chief.store.counts()
        chief.agreement.want_save("guard", 10)
        chief.agreement.boundary(10, SaveSchedule(), None)
        for r in ranks:
            assert r.recorded.wait(DEADLINE_S), f"rank {r.agreement.rank} saw no round"
        assert chief.agreement.rounds[0].commit, chief.agreement.rounds
        spent = chief.store.counts() - before
        others = [r.store.counts() for r in ranks[1:]]
    finally:
        for r in ranks:
            r.agreement._watcher.stop()
        shared.close()  # the watchers' waits end now, not at the end of their slices
        for r in ranks:
            r.agreement.close()

    def on_round(c: Counter[tuple[str, str]]) -> int:
        # left out: the watcher's wait for a proposal, made whenever its thread gets to it
        return sum(n for (op, kind), n in c.items() if kind in ROUND_KINDS and (op, kind) != WAIT)

    return on_round(spent), max(on_round(c) for c in others)


def test_the_chiefs_work_per_round_grows_with_the_job_and_a_ranks_does_not() -> None:
    sizes = (4, 16, 64)
    chief, rank = zip(*(round_ops(n) for n in sizes), strict=True)
    for n, ops in zip(sizes, chief, strict=True):
        # the proposal put, its own ack, one get of each rank's ack, the decision put
        # and read: N + 4, never a multiple of N (a second read per rank, a poll)
        assert ops == n + 4, (n, ops)
    # the same per rank at every size: its ack, the decision read
    assert rank == (2, 2, 2), rank


def collect_all(chief: Mailbox) -> int:
    """As the chief's watcher does: collect, and at once again while it is behind."""
    got = chief.collect()
    while chief.behind:
        got += chief.collect()
    return got


@pytest.mark.parametrize("world", [2, GROUP, 10 * GROUP + 5])
def test_an_idle_chief_makes_no_call_and_mail_still_arrives(world: int) -> None:
    """Idle, the chief's watcher looks at nothing and its listener waits on one key,
    however large the job: every get of a key not written is kept by the coordination
    service (35 KB), so an idle chief that looked grew by the hour. A ring costs one
    pass over the groups' bells and one group's counts and mail, and nothing after it,
    however long the job stays idle; the pass waits for no key that is not there but
    the bells of the groups that did not ring (the end of a rank's mail is its count,
    not a get of its next key that times out)."""
    store = CountingStore(WaitingDictStore())
    keys = Keys.of("scale", 0)
    chief = Mailbox(store, keys, rank=0, world_size=world)
    ranks = [Mailbox(store, keys, rank=r, world_size=world) for r in range(1, world)]
    assert all(m.open() for m in ranks)  # as each rank's agreement does when it starts
    groups = -(-world // GROUP)
    before = store.total()
    for _ in range(3):
        assert chief.collect() == 0
    assert store.total() == before  # no bell
    assert not chief.listen(0.0) and store.total() - before == 1  # the one key waited on
    last = ranks[-1]
    cost = p.SaveCost(v=p.VERSION, job="scale", rank=last.rank, step=7, blocking_s=0.1)
    assert last.post(cost)
    assert chief.listen(0.0)
    before, missed = store.total(), store.misses()
    assert collect_all(chief) == 1 and chief.take() == [cost]
    # the bells, the rung one taken down, each rank of that group's count, the mail
    # read and deleted: a group's worth, not the job's
    assert store.total() - before <= groups + 1 + GROUP + 2
    assert sum((store.misses() - missed).values()) == groups - 1, store.misses() - missed
    before = store.total()
    for _ in range(3):
        assert chief.collect() == 0
    assert store.total() == before and not chief.listen(0.0)  # idle again


class TriesOnly(WaitingDictStore):
    """The store, where the chief may wait on ``mail/bell/any`` and on keys that are
    there (a count of a rank that rang or was read, mail below a count): a wait for a
    count that is not there would hold the rounds, which its watcher runs too, at every
    pass. The waits for a missing key are kept in :attr:`waited`."""

    def __init__(self) -> None:
        super().__init__()
        self.waited: list[str] = []

    def get(self, key: str, timeout_s: float) -> str | None:
        if not key.endswith("/mail/bell/any") and key not in self.data:
            self.waited.append(key)
        return super().get(key, timeout_s)


@pytest.mark.parametrize("how", ["not started", "died mid-rewrite"])
def test_a_missing_count_holds_its_group_for_a_few_passes_then_not(how: str) -> None:
    """A rank whose count is not there (not started yet, or it died between its
    count's delete and put) is tried at the next TRIES passes (a busy host may have
    kept a try of a count that is there past its millisecond), then left to its own
    ring: its post writes the count before it rings. Never waited for: a CI run whose
    chief waited a second for a dead rank's count at every pass aborted rounds for
    other reasons than the dead rank's missing acknowledgement."""
    tries_only = TriesOnly()
    store = CountingStore(tries_only)
    keys = Keys.of("scale", 0)
    chief = Mailbox(store, keys, rank=0, world_size=4)
    one, two, three = (Mailbox(store, keys, rank=r, world_size=4) for r in (1, 2, 3))
    assert one.open() and three.open()
    if how == "died mid-rewrite":
        assert two.open()
        store.delete(keys.mail_sent(2))  # its post's delete went through, its put did not
    first = p.SaveCost(v=p.VERSION, job="scale", rank=1, step=1, blocking_s=0)
    assert one.post(first) and chief.listen(0.0)
    assert collect_all(chief) == 1 and chief.take() == [first]
    for _ in range(TRIES):  # rank 2's count tried again: its group rung again
        before = store.total()  # (by the chief itself: no ring of mail/bell/any needed)
        assert collect_all(chief) == 0 and store.total() > before
    before = store.total()
    assert collect_all(chief) == 0 and store.total() == before  # left to its own ring
    late = p.SaveCost(v=p.VERSION, job="scale", rank=2, step=1, blocking_s=0)
    assert two.post(late) and chief.listen(0.0)
    assert collect_all(chief) == 1 and chief.take() == [late]
    assert tries_only.waited == []  # its missing count was only ever tried


def test_mail_written_while_the_chief_reads_its_group_is_not_lost() -> None:
    shared = WaitingDictStore()
    keys = Keys.of("scale", 0)
    chief = Mailbox(shared, keys, rank=0, world_size=4)
    ranks = [Mailbox(shared, keys, rank=r, world_size=4) for r in (1, 2, 3)]

    class Interleaved:
        """The store, where rank 1 posts again once the chief has read its count."""

        def __init__(self) -> None:
            self.posted = False

        def put(self, key: str, value: str) -> bool:
            return shared.put(key, value)

        def _read(self, raw: str | None, key: str) -> str | None:
            if key == keys.mail_sent(1) and not self.posted:
                self.posted = True
                ranks[0].post(p.SaveCost(v=p.VERSION, job="scale", rank=1, step=2, blocking_s=0))
            return raw

        def get(self, key: str, timeout_s: float) -> str | None:
            return self._read(shared.get(key, timeout_s), key)

        def try_get(self, key: str) -> str | None:
            return self._read(shared.try_get(key), key)

        def delete(self, key: str) -> None:
            shared.delete(key)

    chief.store = Interleaved()
    ranks[0].post(p.SaveCost(v=p.VERSION, job="scale", rank=1, step=1, blocking_s=0))
    assert chief.listen(0.0) and chief.collect() == 1  # the second landed after the count was read
    t0 = time.monotonic()
    assert chief.listen(0.0)  # its bells rang again
    assert chief.collect() == 1  # read on the next collect
    assert [m.step for m in chief.take()] == [1, 2]
    assert time.monotonic() - t0 < DEADLINE_S


@pytest.mark.parametrize("world", [40, 10 * GROUP + 5])
def test_the_chief_reads_a_burst_of_mail_in_bounded_shares_and_all_of_it(world: int) -> None:
    """After a save every rank sends its cost; the watcher reads them between rounds,
    so one collect must stay bounded (a proposal waits for at most one), and the
    collects after it must read the rest."""
    store = CountingStore(WaitingDictStore())
    keys = Keys.of("scale", 0)
    chief = Mailbox(store, keys, rank=0, world_size=world)
    sent = []
    for r in range(1, world):
        msg = p.SaveCost(v=p.VERSION, job="scale", rank=r, step=5, blocking_s=0.1)
        assert Mailbox(store, keys, rank=r, world_size=world).post(msg)
        sent.append(msg)
    groups = -(-world // GROUP)
    assert chief.listen(0.0)
    read, collects = [], 0
    while True:
        before = store.total()
        read.extend(chief.take() if chief.collect() else [])
        collects += 1
        # the bells (a get, and a delete of each rung one), then the bound's reads and
        # deletes, over by at most one rank's share, and a bell rung again: not the job's
        bound = 2 * groups + CALLS_PER_COLLECT + 2 * PER_COLLECT + 1
        assert store.total() - before <= bound
        if not chief.behind:
            break
        assert collects < 10 * world, "the mail was never all read"
    assert sorted(read, key=lambda m: m.rank) == sent
    assert chief.collect() == 0 and not chief.behind


def test_mail_whose_read_timed_out_is_read_at_the_next_pass() -> None:
    """A read that timed out for mail below its rank's count (a host so busy that
    SURE_WAIT_S went by) leaves it unread: the chief rings the group's bell again, and a
    later pass reads it; missed twice, the third pass reads it. Without that ring it
    would wait for the rank's next message."""
    shared = CountingStore(WaitingDictStore())
    keys = Keys.of("scale", 0)
    world = GROUP + 5  # the late rank's group of 5: one collect reads it whole
    late = keys.mail(GROUP + 3, 0)

    class Busy:
        """The store, where the first two reads of rank GROUP + 3's mail time out."""

        missed = 0

        def put(self, key: str, value: str) -> bool:
            return shared.put(key, value)

        def get(self, key: str, timeout_s: float) -> str | None:
            if key == late and self.missed < 2:
                self.missed += 1
                return None
            return shared.get(key, timeout_s)

        def try_get(self, key: str) -> str | None:
            return shared.try_get(key)

        def delete(self, key: str) -> None:
            shared.delete(key)

    chief = Mailbox(Busy(), keys, rank=0, world_size=world)
    ranks = {r: Mailbox(shared, keys, rank=r, world_size=world) for r in range(1, world)}
    assert all(m.open() for m in ranks.values())
    msg = p.SaveCost(v=p.VERSION, job="scale", rank=GROUP + 3, step=5, blocking_s=0.1)
    assert ranks[GROUP + 3].post(msg)
    assert chief.listen(0.0) and collect_all(chief) == 0  # rang, counted, read: missed
    assert collect_all(chief) == 0  # its bell rung again by the chief: missed again
    assert collect_all(chief) == 1 and chief.take() == [msg]  # the third pass
    before = shared.total()
    assert collect_all(chief) == 0 and shared.total() == before  # read: nothing rings


class EveryTryMisses(WaitingDictStore):
    """A host so busy that no 1 ms try comes back in time (on the 2-core box beside four
    CPU hogs, 492 of 3,000 tries of a key that was there timed out:
    benchmarks/coordination_gets.py); a get that waits longer does."""

    def try_get(self, key: str) -> str | None:
        return None


def test_where_every_try_misses_the_mail_of_a_ring_is_still_read_at_its_pass() -> None:
    """A CI run's chief read neither the bell of the group that rang nor, later, the
    count, each a 1 ms try that timed out on its loaded box; no rank wrote again, so
    an operator's set-policy relayed from the other host was still unread 120 s on.
    The ring says who rang: that group's bell is taken down without a look and that
    rank's count waited for, as is the count of any rank read before, and the mail
    below a count."""
    store = CountingStore(EveryTryMisses())
    keys = Keys.of("scale", 0)
    world = 2 * GROUP + 5
    chief = Mailbox(store, keys, rank=0, world_size=world)
    ranks = {r: Mailbox(store, keys, rank=r, world_size=world) for r in range(1, world)}
    assert all(m.open() for m in ranks.values())
    relayed = p.Request(v=p.VERSION, job="scale", rank=GROUP + 3, op="set_policy",
                        spec="fixed:steps=7", origin="b")  # fmt: skip
    assert ranks[GROUP + 3].post(relayed)
    assert chief.listen(0.0) and collect_all(chief) == 1 and chief.take() == [relayed]
    # two ranks of one group write before the chief hears the bell: the first rang it,
    # the second's count is waited for because it was read before
    first = p.SaveCost(v=p.VERSION, job="scale", rank=GROUP + 1, step=9, blocking_s=0.1)
    again = p.SaveCost(v=p.VERSION, job="scale", rank=GROUP + 3, step=9, blocking_s=0.1)
    assert ranks[GROUP + 1].post(first) and ranks[GROUP + 3].post(again)
    assert chief.listen(0.0) and collect_all(chief) == 2
    assert sorted(chief.take(), key=lambda m: m.rank) == [first, again]
    assert not chief.listen(0.0) and collect_all(chief) == 0


def test_a_count_waited_for_is_waited_for_once_when_its_rank_died_mid_rewrite() -> None:
    """A rank whose count the chief read before is waited for, not tried; dead between
    its count's delete and put, it holds one pass for SURE_WAIT_S, once: from then on
    its count is tried (TRIES passes, then left to a ring that will not come)."""
    tries_only = TriesOnly()
    store = CountingStore(tries_only)
    keys = Keys.of("scale", 0)
    chief = Mailbox(store, keys, rank=0, world_size=4)
    one, two = (Mailbox(store, keys, rank=r, world_size=4) for r in (1, 2))
    assert one.open() and two.open()
    for r, m in ((1, one), (2, two)):
        assert m.post(p.SaveCost(v=p.VERSION, job="scale", rank=r, step=1, blocking_s=0))
    assert chief.listen(0.0) and collect_all(chief) == 2 and len(chief.take()) == 2
    store.delete(keys.mail_sent(2))  # rank 2's next post: its delete went through, no put
    t0 = time.monotonic()
    for step in range(2, 2 + TRIES + 3):
        msg = p.SaveCost(v=p.VERSION, job="scale", rank=1, step=step, blocking_s=0)
        assert one.post(msg) and chief.listen(0.0)
        assert collect_all(chief) == 1 and chief.take() == [msg]
    assert tries_only.waited == [keys.mail_sent(2)]
    assert SURE_WAIT_S <= time.monotonic() - t0 < SURE_WAIT_S + DEADLINE_S
