"""The key-value store a multi-worker job's ranks share, and the key names of one session.

Keys of one checkpointer's session (``adaptd/<job>/<session>/``)::

    r<k>/proposal        round k's Propose (first writer wins the round), or a tick
    r<k>/proposal/<t>    the same after t ticks went by without a proposal
    r<k>/ack/<rank>      each rank's Ack
    r<k>/decision        the Decide (first writer wins: the proposer's, or an abort by
                         a rank that waited too long)
    restore/offer/<rank> each rank's RestoreOffer
    restore/done/<rank>  each rank's Restored
    mail/<rank>/<i>      a rank's i-th message to the chief (Request, SaveCost;
                         :mod:`adaptd.client.agreement.mailbox`)
    mail/<rank>/sent     how many it has written (rewritten after each)
    mail/bell/<group>    rung by a rank of the group after it wrote mail
    mail/bell/any        rung by the same rank after its group's bell; the one key
                         the chief waits on for mail

**Ticks.** While no round is proposed, the chief writes :data:`TICK` as the key every
rank waits on, about every second (:mod:`adaptd.client.agreement.watcher`), and every
rank then waits on the next one. TensorFlow's coordination service keeps every get that
timed out on a missing key (about 35 KB between the client and the service) until
that key is written: ranks that waited for a proposal in 0.5 s slices grew the chief's
process by about 110 MB per rank and hour between two rounds (issue 35; an idle job of
2,048 ranks was killed for memory in minutes). A tick ends those waits, and between
rounds every rank's wait ends at one, not at its deadline (a timed-out get leaves 88
bytes in the client for good).

Sessions are numbered per job in each process, so the ranks' N-th checkpointers meet
(every rank of a data-parallel job creates its checkpointers in the same order).
"""

from __future__ import annotations

import itertools
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

#: What a tick writes where a proposal would go: "no round was proposed meanwhile".
TICK = "tick"

_sessions: dict[str, itertools.count[int]] = {}
_sessions_lock = threading.Lock()


def next_session(job: str) -> int:
    """The next session number of ``job`` in this process (0, 1, ...)."""
    with _sessions_lock:
        return next(_sessions.setdefault(job, itertools.count()))


class Store(Protocol):
    """What the agreement needs of a key-value store (see
    :class:`~adaptd.client.agreement.coordination.Coordination`)."""

    def put(self, key: str, value: str) -> bool: ...

    def get(self, key: str, timeout_s: float) -> str | None: ...

    def try_get(self, key: str) -> str | None: ...

    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class Keys:
    """Key names of one session."""

    prefix: str

    @classmethod
    def of(cls, job: str, session: int) -> Keys:
        return cls(f"adaptd/{job}/{session}")

    def round(self, k: int) -> str:
        return f"{self.prefix}/r{k}"

    def proposal(self, k: int, t: int = 0) -> str:
        """Where round ``k``'s proposal goes once ``t`` ticks went by without one."""
        base = f"{self.prefix}/r{k}/proposal"
        return base if t == 0 else f"{base}/{t}"

    def ack(self, k: int, rank: int) -> str:
        return f"{self.prefix}/r{k}/ack/{rank}"

    def decision(self, k: int) -> str:
        return f"{self.prefix}/r{k}/decision"

    def offer(self, rank: int) -> str:
        return f"{self.prefix}/restore/offer/{rank}"

    def restored(self, rank: int) -> str:
        return f"{self.prefix}/restore/done/{rank}"

    def mail(self, rank: int, i: int) -> str:
        return f"{self.prefix}/mail/{rank}/{i}"

    def mail_sent(self, rank: int) -> str:
        """How many messages ``rank`` has written (its next index)."""
        return f"{self.prefix}/mail/{rank}/sent"

    def bell(self, group: int) -> str:
        return f"{self.prefix}/mail/bell/{group}"

    def bells(self) -> str:
        """The bell over the groups' bells: rung after a group's, waited on by the chief."""
        return f"{self.prefix}/mail/bell/any"


#: A session key's kind, from its part after the session prefix (see the module docstring).
_KINDS = (
    (re.compile(r"r\d+/proposal(/\d+)?$"), "proposal"),
    (re.compile(r"r\d+/ack/\d+$"), "ack"),
    (re.compile(r"r\d+/decision$"), "decision"),
    (re.compile(r"r\d+$"), "round"),
    (re.compile(r"mail/"), "mail"),
    (re.compile(r"restore/"), "restore"),
)


def kind_of(key: str) -> str:
    """The kind of a session key (``proposal``, ``ack``, ``decision``, ``round`` for a
    round's whole range, ``mail``, ``restore``), or ``other``."""
    for pattern, kind in _KINDS:
        if pattern.search(key):
            return kind
    return "other"


class CountingStore:
    """A :class:`Store` that counts every call made through it, by operation and key
    kind (:func:`kind_of`), then passes it on unchanged.

    The one place the agreement's key-value work is measured (benchmarks/
    scale_agreement.py, and the suite's guard that a round's work at the chief grows
    no faster than the job): everything the agreement does to its store goes through
    this interface, so what is counted here is all of it. Thread-safe (a rank's watcher
    and training threads share their store)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._counts: Counter[tuple[str, str]] = Counter()
        self._misses: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def _count(self, op: str, key: str) -> None:
        with self._lock:
            self._counts[(op, kind_of(key))] += 1

    def _missed(self, op: str, key: str, value: str | None) -> str | None:
        if value is None:
            with self._lock:
                self._misses[(op, kind_of(key))] += 1
        return value

    def counts(self) -> Counter[tuple[str, str]]:
        """A copy of the counts so far, keyed by (operation, key kind)."""
        with self._lock:
            return Counter(self._counts)

    def misses(self) -> Counter[tuple[str, str]]:
        """The gets (and tries) among :meth:`counts` that found no key: on TensorFlow's
        coordination service each is a timed-out get, which its client and service keep
        (35 KB until the key is written, 88 bytes of the caller's for good)."""
        with self._lock:
            return Counter(self._misses)

    def total(self) -> int:
        """Every call so far."""
        with self._lock:
            return sum(self._counts.values())

    def put(self, key: str, value: str) -> bool:
        self._count("put", key)
        return self.store.put(key, value)

    def get(self, key: str, timeout_s: float) -> str | None:
        self._count("get", key)
        return self._missed("get", key, self.store.get(key, timeout_s))

    def try_get(self, key: str) -> str | None:
        self._count("try_get", key)
        return self._missed("try_get", key, self.store.try_get(key))

    def delete(self, key: str) -> None:
        self._count("delete", key)
        self.store.delete(key)


__all__ = ["CountingStore", "Keys", "Store", "kind_of", "next_session"]
