"""The agreement's watcher thread: one round after another on the shared store.

For round ``k`` it waits for the proposal, has its owner (:class:`~adaptd.client.
agreement.Agreement`) answer it (which holds the training thread at the proposed
step when the answer is yes), writes the answer; as the proposer, collects every
rank's answer (in threads of :data:`ACKS_PER_READER` ranks in a larger job) and writes
the decision; then waits for the decision, aborting the
round itself after twice the timeout (first writer wins, so every rank reads one
outcome), and hands it to its owner. Every wait in a round is sliced, so :meth:`stop`
is noticed within a slice (between rounds, within a tick and a slice: *Ticks*). After
every round, and after a wait in which no proposal came, it runs ``between`` (the
chief reads the other ranks' mail there: :mod:`adaptd.client.agreement.mailbox`), a
bounded share at a time (after a round too: rounds back to back would otherwise
leave no wait without a proposal, and the mail would wait for them to stop): while
``between`` says there is more, the watcher looks for
a proposal for :data:`BRIEF_S` only, then calls it again, so a proposal waits for at
most one share of the mail, however many ranks wrote.

**Ticks.** A get that timed out on a key not written yet stays in TensorFlow's
coordination service, and in the client, until that key is written (about 35 KB per
get between the two; measured by benchmarks/coordination_gets.py). A rank waiting for
the next proposal in slices left two of them a second, so between two rounds the
chief's process grew by about 110 MB per rank and hour. So while no proposal comes, the
chief writes :data:`~adaptd.client.agreement.kv.TICK` as the key every rank waits on
once :data:`TICK_S` went by, which ends every rank's waits on it, and every rank then
waits on the round's next proposal key (:meth:`~adaptd.client.agreement.kv.Keys.proposal`).
A proposer whose key a tick took tries the next one. Any rank ticks itself after
:data:`LATE_TICK_S` without one (the chief stopped or gone), so no rank's waits pile up
either. A round's ticks go with its keys when the next round commits.

A timed-out get also leaves 88 bytes of Python objects in TensorFlow's client for good,
its key written or not (benchmarks/coordination_gets.py; a get that returns a value
leaves none). So a wait for a proposal ends at a write, not at its deadline
(:meth:`RoundWatcher._idle_wait_s`): the chief's when its own tick is due, another
rank's a slice after the chief's next tick is due. While the chief ticks, only its own
get times out, once a tick; waits in half-second slices timed out once or twice a
second in every rank (at 256 ranks, 64 in the chief's process: its idle growth 2.1-2.5
→ 0.2-1.0 MB a minute, docs/scale.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from adaptd.client.agreement.coordination import CoordinationError
from adaptd.client.agreement.kv import TICK, Keys, Store
from adaptd.core import agreement as rules
from adaptd.protocol import job as p

log = logging.getLogger("adaptd.client")

#: The proposer reads a round's acknowledgements in threads of this many ranks each,
#: at most :data:`MAX_ACK_READERS` of them: each read is a get of about a round trip
#: to the service, and one thread reading every rank's in turn adds a round trip per
#: rank to the round (docs/scale.md). Jobs of up to this many ranks read them in the
#: watcher thread.
ACKS_PER_READER = 16
MAX_ACK_READERS = 32


#: How long the watcher looks for a proposal between two shares of ``between``'s work.
BRIEF_S = 0.001
#: The chief writes a tick once this long went by without a proposal or a tick.
TICK_S = 1.0
#: Any other rank writes one itself once this long went by without either.
LATE_TICK_S = 3 * TICK_S


def reader_count(world_size: int) -> int:
    """How many threads read a round's acknowledgements in a job of ``world_size``."""
    return max(1, min(MAX_ACK_READERS, -(-world_size // ACKS_PER_READER)))


class Owner(Protocol):
    """What the watcher needs of the agreement it works for."""

    @property
    def round(self) -> int: ...

    def acknowledge(self, proposal: p.Propose) -> p.Ack: ...

    def record(self, k: int, proposal: p.Propose | None, decision: p.Decide | None) -> None: ...

    def stop_with(self, why: str) -> None: ...


class RoundWatcher:
    """The rounds of one session, watched for ``rank`` of ``world_size``."""

    def __init__(
        self,
        owner: Owner,
        store: Store,
        keys: Keys,
        *,
        rank: int,
        world_size: int,
        timeout_s: float,
        slice_s: float,
        between: Callable[[], bool] | None = None,
    ) -> None:
        self._owner = owner
        self._between = between
        self.store = store
        self.keys = keys
        self.rank = rank
        self.world_size = world_size
        self._timeout_s = timeout_s
        self._slice_s = slice_s
        self._stop = threading.Event()
        self._tick_after_s = TICK_S if rank == 0 else LATE_TICK_S
        #: The round the watcher waits in and how many ticks went by in it (a tuple,
        #: replaced whole: the training thread reads it to propose at the right key).
        self.at: tuple[int, int] = (0, 0)
        #: The key of the proposal the watcher last acted on, with its round.
        self.found: tuple[int, str] | None = None
        #: Ticks this rank wrote (the others' are only read).
        self.ticks_written = 0

    def stop(self) -> None:
        """Ask the thread to end (within a slice); a round in progress is aborted."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def tick_of(self, k: int) -> int:
        """How many ticks went by in round ``k`` as far as this watcher saw (0 for a
        round it is not in yet)."""
        at = self.at
        return at[1] if at[0] == k else 0

    def run(self) -> None:
        """The thread's body: one round after another until :meth:`stop`."""
        try:
            wait_s = self._slice_s
            last = time.monotonic()  # the last tick, or the round's start
            while not self._stop.is_set():
                k = self._owner.round
                if self.at[0] != k:
                    self.at, last = (k, 0), time.monotonic()
                t = self.at[1]
                key = self.keys.proposal(k, t)
                raw = self.store.get(key, wait_s if wait_s == BRIEF_S else self._idle_wait_s(last))
                wait_s = self._slice_s
                # (BRIEF_S of slack: the service counts a wait in whole milliseconds)
                if raw is None and time.monotonic() - last >= self._tick_after_s - BRIEF_S:
                    # end every rank's waits on the key: each left with the service
                    # stays there until the key is written (the module's *Ticks*)
                    if self.store.put(key, TICK):
                        self.ticks_written += 1
                    raw = self.store.get(key, self._slice_s)  # ours, or a proposal
                if raw is None or raw == TICK:
                    if raw is not None:
                        self.at, last = (k, t + 1), time.monotonic()
                    if self._between is not None and self._between():
                        wait_s = BRIEF_S  # more to do between rounds: look, then go on
                    continue
                self.found = (k, key)
                self._round_of(k, raw)
                # and a share after every round: proposals that come back to back, each
                # before the chief's tick was due (a plan that changes every second, on
                # a loaded box), left no wait without one, and the chief's mail (an
                # operator's request relayed by another rank, the ranks' costs) waited
                # until they stopped (a 2-host test: 81 rounds in 120 s, none read)
                if self._between is not None and self._between():
                    wait_s = BRIEF_S
        except CoordinationError as exc:
            self._owner.stop_with(str(exc))
        except Exception as exc:  # a bug must not leave a rank held at a gate forever
            log.exception("adaptd agreement watcher failed")
            self._owner.stop_with(f"{type(exc).__name__}: {exc}")

    def _idle_wait_s(self, last: float) -> float:
        """How long one get for the next proposal waits, ``last`` being when this
        watcher saw the last tick (or its round begin).

        A get that times out costs memory even after its key is written (the module's
        *Ticks*), so between rounds a wait ends at a write, not at its deadline: the
        chief's when its own next tick is due (it writes it then); another rank's a
        slice after the chief's next tick is due, so that while the chief ticks, their
        gets never time out. After that (the chief late, stopped or gone) a slice at a
        time, up to their own tick at :data:`LATE_TICK_S`. Either way :meth:`stop` is
        noticed within :data:`TICK_S` and a slice."""
        now = time.monotonic()
        if self.rank == 0:
            return max(BRIEF_S, last + TICK_S - now)
        return max(self._slice_s, last + TICK_S + self._slice_s - now)

    def _round_of(self, k: int, raw: str) -> None:
        try:
            proposal = p.decode_rank(raw)
            if not isinstance(proposal, p.Propose) or proposal.round != k:
                raise p.ProtocolError("invalid", f"round {k} holds no proposal for it")
        except p.ProtocolError as exc:
            # unreadable: answer no, so the proposer (if any) aborts; the round ends
            # with whatever decision is written
            log.warning("round %d: bad proposal (%s)", k, exc)
            proposal = None
        if proposal is not None:
            ack = self._owner.acknowledge(proposal)
            self.store.put(self.keys.ack(k, self.rank), p.encode_json(ack))
            if proposal.proposer == self.rank:
                self._decide(proposal)
            decision = self._await_decision(proposal)
        else:
            decision = None
        self._owner.record(k, proposal, decision)

    def _wait_key(self, key: str, deadline: float) -> str | None:
        """The value of ``key`` once written, waiting until ``deadline`` (monotonic) in
        slices; None at the deadline or when closing."""
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            raw = self.store.get(key, min(self._slice_s, left))
            if raw is not None:
                return raw
        return None

    def _decide(self, proposal: p.Propose) -> None:
        k = proposal.round
        deadline = time.monotonic() + self._timeout_s
        acks: dict[int, p.Ack] = {}
        readers = reader_count(self.world_size)
        if readers == 1:
            self._read_acks(k, range(self.world_size), deadline, acks)
        else:  # the gets wait on the service with the GIL released: read side by side
            threads = [
                threading.Thread(
                    target=self._read_acks,
                    args=(k, range(j, self.world_size, readers), deadline, acks),
                    name=f"adaptd-acks-{self.rank}-{j}",
                    daemon=True,
                )
                for j in range(readers)
            ]
            for t in threads:
                t.start()
            for t in threads:  # each ends by the deadline (or within a slice of stop())
                t.join()
        decision = rules.decide(proposal, acks, self.world_size)
        self.store.put(self.keys.decision(k), p.encode_json(decision))
        if decision.commit and k > 0:
            # every rank acknowledged round k, so every rank is done with round k - 1
            self.store.delete(self.keys.round(k - 1))

    def _read_acks(
        self, k: int, ranks: Iterable[int], deadline: float, acks: dict[int, p.Ack]
    ) -> None:
        """Read the acknowledgements of ``ranks`` into ``acks`` (one get each, waiting
        until ``deadline``; past it only what is there)."""
        for r in ranks:
            if time.monotonic() < deadline:
                raw = self._wait_key(self.keys.ack(k, r), deadline)
            else:  # past the deadline: only see who did answer, for the reason
                raw = self.store.try_get(self.keys.ack(k, r))
            if raw is None:
                continue
            try:
                ack = p.decode_rank(raw)
            except p.ProtocolError as exc:
                log.warning("round %d: bad acknowledgement of rank %d (%s)", k, r, exc)
                continue
            if isinstance(ack, p.Ack) and ack.rank == r and ack.round == k:
                acks[r] = ack  # one key per rank: the readers never write the same one

    def _await_decision(self, proposal: p.Propose) -> p.Decide:
        key = self.keys.decision(proposal.round)
        raw = self._wait_key(key, time.monotonic() + 2 * self._timeout_s)
        if raw is not None:
            return self._decision_from(proposal, raw)
        why = "closing" if self._stop.is_set() else f"no decision within {2 * self._timeout_s:g}s"
        self.store.put(key, p.encode_json(rules.abort(proposal, f"rank {self.rank}: {why}")))
        # the key is there now (ours, or the first writer's): a get, not a 1 ms try_get,
        # which on a busy host can time out on a key that is there and leave this rank
        # with its own abort's reason while the others read the first writer's
        raw = self.store.get(key, self._slice_s)
        if raw is None:
            return rules.abort(proposal, why)
        return self._decision_from(proposal, raw)

    def _decision_from(self, proposal: p.Propose, raw: str) -> p.Decide:
        try:
            d = p.decode_rank(raw)
        except p.ProtocolError as exc:
            return rules.abort(proposal, f"unreadable decision ({exc})")
        if not isinstance(d, p.Decide) or d.round != proposal.round:
            return rules.abort(proposal, "the decision key holds no decision for this round")
        return d

    def force_abort(self, k: int, why: str, key: str | None = None) -> None:
        """Write an abort as round ``k``'s decision unless one is there (the training
        thread's last resort when the watcher did not settle the round). ``key``: where
        round ``k``'s proposal is, if the caller wrote it; else where the watcher found
        it (or would look next)."""
        found = self.found
        if key is None:
            key = found[1] if found is not None and found[0] == k else None
        try:
            raw = self.store.try_get(key or self.keys.proposal(k, self.tick_of(k)))
            if raw is None:
                return
            proposal = p.decode_rank(raw)
            if isinstance(proposal, p.Propose):
                self.store.put(self.keys.decision(k), p.encode_json(rules.abort(proposal, why)))
        except (CoordinationError, p.ProtocolError) as exc:
            self._owner.stop_with(f"could not abort round {k}: {exc}")


__all__ = [
    "ACKS_PER_READER",
    "BRIEF_S",
    "LATE_TICK_S",
    "MAX_ACK_READERS",
    "TICK_S",
    "Owner",
    "RoundWatcher",
    "reader_count",
]
