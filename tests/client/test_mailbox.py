"""The ranks' mail to the chief (client/agreement/mailbox.py) on a key-value store with the
coordination service's semantics (first writer wins, a missing key reads as None).
The real service is exercised end to end by tests/multiworker/test_hosts.py."""

from __future__ import annotations

import threading

from adaptd.client.agreement.kv import Keys
from adaptd.client.agreement.mailbox import CLOSED, GROUP, PER_COLLECT, RUNG, Mailbox
from adaptd.protocol import job as p
from client.kv_store import DictStore

V = p.VERSION
KEYS = Keys.of("mw", 0)


def cost(rank: int, step: int) -> p.SaveCost:
    return p.SaveCost(v=V, job="mw", rank=rank, step=step, blocking_s=0.5)


def test_each_ranks_mail_reaches_the_chief_in_order_once_and_is_deleted() -> None:
    store = DictStore()
    chief = Mailbox(store, KEYS, rank=0, world_size=3)
    one, two = (Mailbox(store, KEYS, rank=r, world_size=3) for r in (1, 2))
    request = p.Request(v=V, job="mw", rank=2, op="save_now", origin="host-b")
    assert one.post(cost(1, 10)) and two.post(request) and one.post(cost(1, 20))
    assert chief.collect() == 3
    assert chief.take() == [cost(1, 10), cost(1, 20), request]
    assert chief.collect() == 0 and chief.take() == []
    assert store.data == {}  # what was read is deleted
    one.post(cost(1, 30))  # the next index, not one already read
    assert chief.collect() == 1 and chief.take() == [cost(1, 30)]


def test_bad_mail_is_skipped_and_a_flood_does_not_hold_the_watcher() -> None:
    store = DictStore()
    chief = Mailbox(store, KEYS, rank=0, world_size=2)
    store.put(KEYS.mail(1, 0), "not json")
    store.put(KEYS.mail(1, 1), p.encode_json(cost(0, 5)))  # names another rank
    rank1 = Mailbox(store, KEYS, rank=1, world_size=2)
    rank1._sent = 2
    for step in range(PER_COLLECT + 3):
        rank1.post(cost(1, step))
    assert chief.collect() == PER_COLLECT - 2 and chief.bad == 2
    assert chief.collect() == 5
    assert [m.step for m in chief.take()] == list(range(PER_COLLECT + 3))


class KeptReads(DictStore):
    """Counts the reads that found no key, by key: the coordination service keeps each
    (a get that timed out) until that key is written."""

    def __init__(self) -> None:
        super().__init__()
        self.missed: dict[str, int] = {}
        self.written: set[str] = set()

    def put(self, key: str, value: str) -> bool:
        self.written.add(key)
        return super().put(key, value)

    def try_get(self, key: str) -> str | None:
        raw = super().try_get(key)
        if raw is None:
            self.written.discard(key)
            self.missed[key] = self.missed.get(key, 0) + 1
        return raw

    def kept(self) -> int:
        """Misses whose key was not written since."""
        return sum(n for key, n in self.missed.items() if key not in self.written)


def test_an_idle_chief_closes_every_bell_it_found_not_rung() -> None:
    """Issue 35: the chief looked at every group's bell twice a second and each look
    at a bell not rung stayed with the service until a rank rang it (one save later).
    Now it closes each such bell (a write, then a delete): nothing is kept."""
    store = KeptReads()
    world = 3 * GROUP
    chief = Mailbox(store, KEYS, rank=0, world_size=world)
    for _ in range(50):
        assert chief.collect() == 0
    assert sum(store.missed.values()) >= 50 * 3  # it did look
    assert store.kept() == 0, store.missed
    assert store.data == {}  # the closed bells are gone: a rank can ring them
    sender = Mailbox(store, KEYS, rank=GROUP + 1, world_size=world)
    assert sender.post(cost(GROUP + 1, 3))
    assert chief.collect() == 1 and chief.take() == [cost(GROUP + 1, 3)]


def test_a_ring_that_meets_a_closed_bell_rings_again_once_it_is_deleted() -> None:
    store = DictStore()
    chief = Mailbox(store, KEYS, rank=0, world_size=2)
    rank1 = Mailbox(store, KEYS, rank=1, world_size=2)
    bell = KEYS.bell(0)
    store.put(bell, CLOSED)  # the chief is between its close and its delete
    reopen = threading.Timer(0.01, store.delete, args=(bell,))
    reopen.start()
    try:
        assert rank1.post(cost(1, 7))
    finally:
        reopen.join()
    assert store.data[bell] == RUNG and rank1.unrung == 0
    assert chief.collect() == 1 and chief.take() == [cost(1, 7)]
