"""The key-value store a multi-worker job's ranks share, and the key names of one session.

Keys of one checkpointer's session (``adaptd/<job>/<session>/``)::

    r<k>/proposal        round k's Propose (first writer wins the round)
    r<k>/ack/<rank>      each rank's Ack
    r<k>/decision        the Decide (first writer wins: the proposer's, or an abort by
                         a rank that waited too long)
    restore/offer/<rank> each rank's RestoreOffer
    restore/done/<rank>  each rank's Restored
    mail/<rank>/<i>      a rank's i-th message to the chief (Request, SaveCost;
                         :mod:`adaptd.client.agreement.mailbox`)

Sessions are numbered per job in each process, so the ranks' N-th checkpointers meet
(every rank of a data-parallel job creates its checkpointers in the same order).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Protocol

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

    def proposal(self, k: int) -> str:
        return f"{self.prefix}/r{k}/proposal"

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


__all__ = ["Keys", "Store", "next_session"]
