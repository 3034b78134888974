"""Ticks: no rank's waits for a proposal pile up in the store while no round comes;
nor do the chief's looks for mail.

TensorFlow's coordination service keeps every get that timed out on a key not written
yet, and its client too, about 35 KB between them, until the key is written
(benchmarks/coordination_gets.py measures it): ranks that waited for the next proposal
in half-second slices grew the chief's process by about 110 MB per rank and hour
between two rounds. The store here counts those gets; the ranks are real
:class:`~adaptd.client.agreement.rounds.Agreement` objects with their watcher threads.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from adaptd.client.agreement.kv import TICK, Keys
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import Agreement, AgreementOptions
from adaptd.client.agreement.watcher import LATE_TICK_S, TICK_S
from adaptd.client.save.schedule import SaveSchedule
from adaptd.protocol import job as p
from client.kv_store import DictStore, WaitingDictStore

SLICE_S = 0.25
DEADLINE_S = 20.0


class KeptGets(WaitingDictStore):
    """Counts the gets that timed out on a key not written, by key (what the
    coordination service keeps until the key is written) and by the thread that made
    them (each leaves 88 bytes of Python objects in TensorFlow's client for good)."""

    def __init__(self) -> None:
        super().__init__()
        self.timed_out: Counter[str] = Counter()
        self.timed_out_by: Counter[str] = Counter()

    def get(self, key: str, timeout_s: float) -> str | None:
        raw = super().get(key, timeout_s)
        if raw is None:
            with self._written:
                self.timed_out_by[threading.current_thread().name] += 1
                if key not in self.data:
                    self.timed_out[key] += 1
        return raw

    def kept(self) -> int:
        """The timed-out gets whose keys are still not written."""
        with self._written:
            return sum(n for key, n in self.timed_out.items() if key not in self.data)


class KeptTries(KeptGets):
    """:class:`KeptGets` whose ``try_get`` is a 1 ms get, as the coordination
    service's store has it (it has no get that does not wait): a miss is kept too."""

    def try_get(self, key: str) -> str | None:
        return self.get(key, 0.001)

    def kept_mail(self) -> int:
        with self._written:
            return sum(
                n for key, n in self.timed_out.items() if "/mail/" in key and key not in self.data
            )


def ranks(store: KeptGets, world: int, which: range) -> list[Agreement]:
    out = [
        Agreement(
            store,
            Identity("ticks", r, world),
            position=lambda: 0,
            wake=lambda: None,
            session=0,
            options=AgreementOptions(timeout_s=DEADLINE_S, slice_s=SLICE_S, lead_time_s=0.0),
        )
        for r in which
    ]
    for a in out:
        a.start()
    return out


def close(store: KeptGets, agreements: list[Agreement]) -> None:
    for a in agreements:
        a._watcher.stop()
    store.close()
    for a in agreements:
        a.close()


def idle(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)  # the idle time is what is tested


def test_idle_ranks_wait_until_a_tick_not_until_a_deadline() -> None:
    """Three ranks idle for 3.5 ticks. A get that times out leaves 88 bytes of Python
    objects in TensorFlow's client for good, its key written or not
    (benchmarks/coordination_gets.py), so between rounds a wait ends at a write: the
    other ranks' at the chief's ticks (none of their gets times out), the chief's when
    its own tick is due (one a tick). Waits in slices timed out four times a tick for
    every rank (0.25 s slices), and their keys are ticked since: at most the current
    tick's few are kept in the store."""
    store = KeptGets()
    agreements = ranks(store, 3, range(3))
    try:
        idle(3.5 * TICK_S)
        kept = store.kept()
        by = {r: store.timed_out_by[f"adaptd-agreement-{r}"] for r in range(3)}
        chief_ticks = agreements[0]._watcher.ticks_written
        others = [a._watcher.ticks_written for a in agreements[1:]]
    finally:
        close(store, agreements)
    assert chief_ticks >= 2 and others == [0, 0], (chief_ticks, others)
    # a tick late by more than a slice (a loaded machine) may end one wait early
    assert by[1] <= 1 and by[2] <= 1, by
    assert by[0] <= chief_ticks + 1, (by, chief_ticks)
    assert kept <= 3, (kept, by)


def test_without_the_chief_the_others_tick_themselves() -> None:
    """The chief's process stopped or gone: the other ranks end their own waits after
    LATE_TICK_S without a tick (first writer wins: one tick per key)."""
    store = KeptGets()
    agreements = ranks(store, 3, range(1, 3))  # ranks 1 and 2; no chief
    try:
        idle(LATE_TICK_S + 1.5)
        kept = store.kept()
        ticks = sum(a._watcher.ticks_written for a in agreements)
    finally:
        close(store, agreements)
    assert ticks >= 1
    assert kept <= 2 * (TICK_S / SLICE_S + 2), kept


def test_a_round_proposed_after_ticks_commits_at_the_key_the_ranks_wait_on() -> None:
    store = KeptGets()
    agreements = ranks(store, 2, range(2))
    recorded = threading.Event()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while agreements[1]._watcher.tick_of(0) < 2:
            assert time.monotonic() < deadline, "no tick came"
            time.sleep(0.05)
        chief = agreements[0]
        chief.want_save("after ticks", 10)
        chief.boundary(10, SaveSchedule(), None)
        while not all(a.ledger.rounds for a in agreements):
            assert time.monotonic() < deadline, "the round was never recorded"
            time.sleep(0.05)
        recorded.set()
        found = [a._watcher.found for a in agreements]
        committed = [a.rounds[0].commit for a in agreements]
    finally:
        close(store, agreements)
    assert committed == [True, True]
    keys = Keys.of("ticks", 0)
    (k, key), other = found
    assert k == 0 and key != keys.proposal(0) and other == found[0], found


def test_a_proposer_behind_the_ticks_writes_at_the_first_key_no_tick_took() -> None:
    store = DictStore()
    keys = Keys.of("ticks", 0)
    for t in range(3):
        store.put(keys.proposal(0, t), TICK)
    proposer = Agreement(store, Identity("ticks", 0, 2), position=lambda: 0, wake=lambda: None,
                         session=0)  # fmt: skip
    assert proposer._put_proposal(0, "mine") == (True, keys.proposal(0, 3))
    assert store.put(keys.proposal(1, 0), "theirs")
    assert proposer._put_proposal(1, "mine") == (False, keys.proposal(1, 0))


def test_an_idle_chief_keeps_no_look_for_mail_and_mail_still_arrives() -> None:
    """The chief's listener waits on one key for the whole job, and its watcher looks at
    the bells only after a ring: idle, nothing of the mail is kept (looking at each
    group's bell twice a second kept two gets a second, 19 MB per rank and hour at 256
    ranks). After a ring: one pass, whose gets are of keys that are there (the bell,
    the ranks' counts, the mail below them), so nothing is kept then either (the end of
    a rank's mail read as a get of its next key was kept, and so were the sweeps')."""
    store = KeptTries()
    agreements = ranks(store, 3, range(3))
    chief = agreements[0].mailbox
    try:
        idle(2.0)
        kept_idle = store.kept_mail()
        cost = p.SaveCost(v=p.VERSION, job="ticks", rank=2, step=9, blocking_s=0.1)
        assert agreements[2].mailbox.post(cost)
        deadline = time.monotonic() + DEADLINE_S
        while not chief.inbox:
            assert time.monotonic() < deadline, "the cost never reached the chief"
            time.sleep(0.02)
        idle(2.0)  # what the old sweep of that group took half a second to make
        kept_after = store.kept_mail()
        inbox = chief.take()
    finally:
        close(store, agreements)
    assert kept_idle == 0, kept_idle
    assert kept_after == 0, kept_after
    assert inbox == [cost]


def test_the_chiefs_mail_is_read_while_rounds_come_back_to_back() -> None:
    """The chief read its mail only after a wait in which no proposal came. Rounds back
    to back, each proposed before the chief's next tick was due (its embedded policy's
    plan changing every second, on a loaded box), left no such wait: an operator's
    request that another rank relayed waited for the rounds to stop (81 rounds in
    120 s, in tests/multiworker/test_hosts.py under three xdist workers). A share of
    the mail is read after every round now: the cost reaches the chief while the
    rounds go on."""
    store = KeptGets()
    agreements = ranks(store, 2, range(2))
    chief = agreements[0]
    schedule = SaveSchedule()
    arrived_after = None
    try:
        deadline = time.monotonic() + DEADLINE_S

        def one_round(i: int) -> None:
            chief.want_save(f"round {i}", 10 * i + 10)
            chief.boundary(10 * i + 10, schedule, None)
            while len(chief.ledger.rounds) <= i:
                assert time.monotonic() < deadline, f"round {i} was never recorded"
                time.sleep(0.005)

        for i in range(2):
            one_round(i)
        cost = p.SaveCost(v=p.VERSION, job="ticks", rank=1, step=9, blocking_s=0.1)
        assert agreements[1].mailbox.post(cost)
        i = 2
        stream_ends = time.monotonic() + 4 * TICK_S  # rounds back to back meanwhile
        while time.monotonic() < stream_ends:
            one_round(i)
            i += 1
            if chief.mailbox.inbox and arrived_after is None:
                arrived_after = i - 2  # rounds since the post
                break
        inbox = chief.mailbox.take()
        ticks = chief._watcher.ticks_written
    finally:
        close(store, agreements)
    assert arrived_after is not None, f"the cost was not read in {i - 2} rounds back to back"
    assert inbox == [cost]
    assert ticks == 0, ticks  # no wait without a proposal: the rounds were back to back
