"""Messages from a multi-worker job's ranks to its chief, in-band on the job's store.

A rank whose daemon does not decide the job has two things to tell the chief (rank
0): an operator's request typed on its host (:class:`~adaptd.protocol.job.Request`, from
the daemon's :class:`~adaptd.protocol.job.Relay`) and what each save cost it
(:class:`~adaptd.protocol.job.SaveCost`, so that δ is the slowest rank's). Each rank
writes its own numbered keys, ``mail/<rank>/<i>`` (:meth:`Mailbox.post`: one put on
the training thread, no contention: nobody else writes them); the chief's agreement
watcher thread reads every other rank's next key after a quiet slice of its wait for
a proposal (:meth:`Mailbox.collect`: one 1 ms get per rank) and deletes what it read. The
training thread never waits for the mail.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from adaptd.client.agreement.kv import Keys, Store
from adaptd.protocol import job as p

log = logging.getLogger("adaptd.client")

#: At most this many messages are read from one rank per collect (a rank that posts
#: faster than the chief reads cannot hold the watcher from the rounds).
PER_COLLECT = 16


class Mailbox:
    """One rank's side of the job's mail to its chief.

    Args:
        store: the key-value store every rank shares.
        keys: the session's key names.
        rank, world_size: who this is.
    """

    def __init__(self, store: Store, keys: Keys, *, rank: int, world_size: int) -> None:
        self.store = store
        self.keys = keys
        self.rank = rank
        self.world_size = world_size
        self._sent = 0  # the next index this rank posts at
        self._next = dict.fromkeys(range(1, world_size), 0)  # chief: next index per rank
        self._lock = threading.Lock()
        #: What the chief read and its training thread has not taken yet.
        self.inbox: deque[p.RankMessage] = deque()
        #: Mail that could not be read (bad records), and posts that failed.
        self.bad = 0
        self.failed = 0

    def post(self, msg: p.Request | p.SaveCost) -> bool:
        """(A rank other than the chief.) Leave ``msg`` for the chief; False (logged)
        when the store refused it (the service is gone: the message is lost, as the
        job is)."""
        with self._lock:
            i = self._sent
            self._sent += 1
        try:
            return self.store.put(self.keys.mail(self.rank, i), p.encode_json(msg))
        except Exception as exc:  # a lost message must never stop training
            self.failed += 1
            log.warning("could not send %s to the job's chief: %s", type(msg).__name__, exc)
            return False

    def collect(self) -> int:
        """(The chief's watcher thread.) Read the mail every other rank left since the
        last call into :attr:`inbox`; returns how many were read. Raises the store's
        :class:`~adaptd.client.agreement.coordination.CoordinationError` when it is gone."""
        got = 0
        for r in self._next:
            for _ in range(PER_COLLECT):
                key = self.keys.mail(r, self._next[r])
                raw = self.store.try_get(key)
                if raw is None:
                    break
                self._next[r] += 1
                self.store.delete(key)
                try:
                    msg = p.decode_rank(raw)
                    if not isinstance(msg, (p.Request, p.SaveCost)) or msg.rank != r:
                        raise p.ProtocolError("invalid", "not a request or save cost of its rank")
                except p.ProtocolError as exc:
                    self.bad += 1
                    log.warning("bad mail from rank %d skipped: %s", r, exc)
                    continue
                self.inbox.append(msg)
                got += 1
        return got

    def take(self) -> list[p.RankMessage]:
        """(The chief's training thread.) Everything read so far, oldest first."""
        out = []
        while self.inbox:
            out.append(self.inbox.popleft())
        return out


__all__ = ["PER_COLLECT", "Mailbox"]
