"""Messages from a multi-worker job's ranks to its chief, in-band on the job's store.

A rank whose daemon does not decide the job has two things to tell the chief (rank
0): an operator's request typed on its host (:class:`~adaptd.protocol.job.Request`, from
the daemon's :class:`~adaptd.protocol.job.Relay`) and what each save cost it
(:class:`~adaptd.protocol.job.SaveCost`, so that δ is the slowest rank's). Each rank
writes its own numbered keys, ``mail/<rank>/<i>`` (:meth:`Mailbox.post`: one put on
the training thread, no contention: nobody else writes them), then rings its group's
doorbell, ``mail/bell/<group>`` (one more put; the ranks are in groups of
:data:`GROUP`, and a bell already rung stays rung). The chief's agreement watcher
thread, after a quiet slice of its wait for a proposal, looks at the bells
(:meth:`Mailbox.collect`: one get per group, about 1 ms when it is not rung), and for
a rung one takes the bell down, then reads each rank of the group's next keys and
deletes what it read; at most :data:`CALLS_PER_COLLECT` such reads and deletes per
call, going on from there at the next (:attr:`Mailbox.behind`). The training thread
never waits for the mail.

Why the bells: reading every rank's next key costs a get per rank, about 1 ms each
when there is no mail: at 2,048 ranks an idle chief would make about 4,000 gets a
second. With bells an idle chief makes one get per group. No mail is missed: a rank
writes its mail *before* it rings, and the chief takes a bell down *before* it reads
the group, so mail that lands after the chief read its rank's key rings the bell
again (and a sweep every :data:`SWEEP_EVERY` passes reads every rank, for a get that
timed out on a key that was there). Why the bound: after a save every rank sends its
cost, and the watcher reading all of it at once (three calls per rank) kept a proposal
waiting for it: 0.26 s at 64 ranks, 1.4 s at 256 (docs/scale.md).
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
#: Ranks per doorbell.
GROUP = 32
#: Reads and deletes of mail per :meth:`Mailbox.collect` (the bells' gets aside): what a
#: proposal may wait for, at about a millisecond each.
CALLS_PER_COLLECT = 32
#: Every this many passes over the groups, one reads every rank's next key, rung or not:
#: a get that waited longer than its millisecond for a key that *is* there (a busy
#: host) reads as missing, and mail whose bell was already taken down would wait for
#: the rank's next message; a sweep picks it up (every ~10 s while idle).
SWEEP_EVERY = 20


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
        self._cursor = 0  # chief: the group the next collect starts at
        self._passes = 0  # chief: passes over the groups begun
        self._sweeping = False  # chief: this pass reads every group, rung or not
        #: (Chief.) The last collect stopped at its bound: there may be more to read.
        self.behind = False
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
            sent = self.store.put(self.keys.mail(self.rank, i), p.encode_json(msg))
            self.store.put(self.keys.bell(self.rank // GROUP), "1")  # False: already rung
            return sent
        except Exception as exc:  # a lost message must never stop training
            self.failed += 1
            log.warning("could not send %s to the job's chief: %s", type(msg).__name__, exc)
            return False

    def collect(self) -> int:
        """(The chief's watcher thread.) Read the mail the other ranks left into
        :attr:`inbox`, at most :data:`CALLS_PER_COLLECT` reads and deletes of it
        (:attr:`behind` says whether it stopped there; the next call goes on from
        there); returns how many were read. Raises the store's
        :class:`~adaptd.client.agreement.coordination.CoordinationError` when it is gone."""
        got = calls = 0
        groups = -(-self.world_size // GROUP)
        self.behind = False
        if self._cursor == 0 and not self._sweeping:  # a new pass over the groups
            self._passes += 1
            self._sweeping = self._passes % SWEEP_EVERY == 0
        for _ in range(groups):
            g = self._cursor
            bell = self.keys.bell(g)
            rung = self.store.try_get(bell) is not None
            if rung or self._sweeping:
                if rung:
                    self.store.delete(bell)  # before reading: mail written after rings again
                more = False
                ranks = range(max(1, g * GROUP), min(self.world_size, (g + 1) * GROUP))
                for r in ranks:
                    n, left, used = self._read(r)
                    got, calls = got + n, calls + used
                    more = more or left
                    if calls >= CALLS_PER_COLLECT and r != ranks[-1]:
                        more = self.behind = True  # the rest of the group next time
                        break
                if more:  # unread mail (over PER_COLLECT, or the bound): ring again
                    self.store.put(bell, "1")
                if self.behind:
                    return got
            self._cursor = (g + 1) % groups
            if self._cursor == 0:
                self._sweeping = False
            if calls >= CALLS_PER_COLLECT:
                self.behind = True
                return got
        return got

    def _read(self, r: int) -> tuple[int, bool, int]:
        """Read rank ``r``'s next messages (at most PER_COLLECT) into the inbox: how
        many were read, whether it stopped at that bound rather than at a missing key,
        and the store calls it made."""
        got = calls = 0
        for _ in range(PER_COLLECT):
            key = self.keys.mail(r, self._next[r])
            raw = self.store.try_get(key)
            calls += 1
            if raw is None:
                return got, False, calls
            self._next[r] += 1
            self.store.delete(key)
            calls += 1
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
        return got, True, calls

    def take(self) -> list[p.RankMessage]:
        """(The chief's training thread.) Everything read so far, oldest first."""
        out = []
        while self.inbox:
            out.append(self.inbox.popleft())
        return out


__all__ = ["CALLS_PER_COLLECT", "GROUP", "PER_COLLECT", "SWEEP_EVERY", "Mailbox"]
