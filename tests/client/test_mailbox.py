"""The ranks' mail to the chief (client/agreement/mailbox.py) on a key-value store with the
coordination service's semantics (first writer wins, a missing key reads as None).
The real service is exercised end to end by tests/multiworker/test_hosts.py."""

from __future__ import annotations

from adaptd.client.agreement.kv import Keys
from adaptd.client.agreement.mailbox import PER_COLLECT, Mailbox
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
    assert chief.collect() == 0  # nothing rang: nothing looked at
    assert one.post(cost(1, 10)) and two.post(request) and one.post(cost(1, 20))
    assert chief.listen(0.0) and chief.collect() == 3
    assert chief.take() == [cost(1, 10), cost(1, 20), request]
    assert not chief.listen(0.0) and chief.collect() == 0 and chief.take() == []
    # what was read is deleted, the bells taken down; the counts stay
    assert store.data == {KEYS.mail_sent(1): "2", KEYS.mail_sent(2): "1"}
    one.post(cost(1, 30))  # the next index, not one already read
    assert chief.listen(0.0) and chief.collect() == 1 and chief.take() == [cost(1, 30)]


def test_bad_mail_is_skipped_and_a_flood_does_not_hold_the_watcher() -> None:
    store = DictStore()
    chief = Mailbox(store, KEYS, rank=0, world_size=2)
    store.put(KEYS.mail(1, 0), "not json")
    store.put(KEYS.mail(1, 1), p.encode_json(cost(0, 5)))  # names another rank
    rank1 = Mailbox(store, KEYS, rank=1, world_size=2)
    rank1._sent = 2
    for step in range(PER_COLLECT + 3):
        rank1.post(cost(1, step))
    assert chief.listen(0.0)
    assert chief.collect() == PER_COLLECT - 2 and chief.bad == 2
    assert chief.collect() == 5  # its bell rung again by the chief: no ring needed
    assert [m.step for m in chief.take()] == list(range(PER_COLLECT + 3))
