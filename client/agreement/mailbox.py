"""Messages from a multi-worker job's ranks to its chief, in-band on the job's store.

A rank whose daemon does not decide the job has two things to tell the chief (rank
0): an operator's request typed on its host (:class:`~adaptd.protocol.job.Request`, from
the daemon's :class:`~adaptd.protocol.job.Relay`) and what each save cost it
(:class:`~adaptd.protocol.job.SaveCost`, so that δ is the slowest rank's). Each rank
writes its own numbered keys, ``mail/<rank>/<i>`` (:meth:`Mailbox.post`: one put on
the training thread, no contention: nobody else writes them), then rings its group's
doorbell, ``mail/bell/<group>``, then the bell over all groups, ``mail/bell/any`` (two
more puts; the ranks are in groups of :data:`GROUP`, and a bell already rung stays
rung). The chief's listener thread waits on ``mail/bell/any`` (:meth:`Mailbox.listen`:
one get, :data:`BELL_WAIT_S` long); when it rings, it takes it down and the chief's
agreement watcher thread, after its next wait for a proposal that brought none (at its
next tick, within a second), makes a pass
over the groups' bells (:meth:`Mailbox.collect`: one get per group), and for a rung one
takes the bell down, then reads each rank of the group's next keys and deletes what it
read; at most :data:`CALLS_PER_COLLECT` such reads and deletes per call, going on from
there at the next (:attr:`Mailbox.behind`). The training thread never waits for the
mail.

Why the bells: reading every rank's next key costs a get per rank, about 1 ms each
when there is no mail: at 2,048 ranks an idle chief would make about 4,000 gets a
second. No mail is missed: a rank writes its mail *before* it rings, and the chief
takes each bell down *before* it reads what the bell stands for (the groups' bells,
a group's ranks), so mail that lands after the chief read its rank's key rings the
bells again. Why the bound: after a save every rank sends its cost, and the watcher
reading all of it at once (three calls per rank) kept a proposal waiting for it: 0.26
s at 64 ranks, 1.4 s at 256 (docs/scale.md).

**Why the chief waits instead of looking** (issue 35). TensorFlow's coordination
service keeps every get that timed out on a key not written yet, and so does its
client, until that key is written: about 35 KB a get, in the chief's process
(benchmarks/coordination_gets.py). The chief used to look at every group's bell after
each quiet half-second slice and to read every rank's next key every 20th pass (a
*sweep*): an idle job of 256 ranks grew its chief's process by 19 MB per rank and hour
between two saves (`scale_agreement.py --wide 256 --idle 120`). Now an idle chief
keeps one get per :data:`BELL_WAIT_S` for the whole job, whatever its size; the groups'
bells are looked at only in a pass a ring started, and a sweep (for a get that waited
past its millisecond for a key that *is* there, on a busy host) reads a group a few
times after it was read for a ring, further and further apart (:data:`SWEEPS_S`), and
then no more: what is kept grows with the mail, not with the time, and goes back as
the ranks write again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

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
#: After a group was read for a ring, a pass reads every rank of it again, rung or not,
#: this long after that read, then this long after that sweep, and so on (a *sweep*):
#: a get that waited longer than its millisecond for a key that *is* there (a busy
#: host) reads as missing, and that mail, its bell already taken down, would wait for
#: the rank's next message. One sweep was not enough on a loaded box (1,024 ranks on
#: 2 cores, load 7: 9 of 3,069 costs missed by both the read and its sweep); each
#: sweep keeps a get per rank that sent nothing, so they are few and spread out.
SWEEPS_S = (10.0, 60.0, 600.0)
#: How long one get of the listener waits on ``mail/bell/any``: a get that times out is
#: kept by the service until the bell rings (above), one per this many seconds per job.
BELL_WAIT_S = 30.0
#: What a rank writes at a bell.
RUNG = "1"


class Mailbox:
    """One rank's side of the job's mail to its chief.

    Args:
        store: the key-value store every rank shares.
        keys: the session's key names.
        rank, world_size: who this is.
        clock: seconds, for the sweeps (monotonic).
    """

    def __init__(
        self,
        store: Store,
        keys: Keys,
        *,
        rank: int,
        world_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.keys = keys
        self.rank = rank
        self.world_size = world_size
        self._clock = clock
        self._sent = 0  # the next index this rank posts at
        self._next = dict.fromkeys(range(1, world_size), 0)  # chief: next index per rank
        self._cursor = 0  # chief: the group the next collect starts at
        self._in_pass = False  # chief: a pass over the groups is under way
        #: (Chief.) mail/bell/any rang since the last pass began; the listener waits
        #: for that pass before it listens again (a ring per pass, not per message).
        self._rang = False
        self._pass_began = threading.Condition()
        self._sweeping: set[int] = set()  # chief: the groups this pass reads rung or not
        self._ringing = False  # chief: this pass looks at every group's bell (a ring began it)
        #: (Chief.) Groups to sweep: when next, and which of SWEEPS_S that is.
        self._sweep_due: dict[int, tuple[float, int]] = {}
        self._listener: threading.Thread | None = None
        self._quiet = threading.Event()  # chief: the listener is to stop
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
            # in this order: the chief takes bell/any down before it looks at the groups'
            self.store.put(self.keys.bell(self.rank // GROUP), RUNG)  # False: already rung
            self.store.put(self.keys.bells(), RUNG)
            return sent
        except Exception as exc:  # a lost message must never stop training
            self.failed += 1
            log.warning("could not send %s to the job's chief: %s", type(msg).__name__, exc)
            return False

    def listen(self, wait_s: float = BELL_WAIT_S) -> bool:
        """(The chief's listener.) Wait up to ``wait_s`` for ``mail/bell/any``; when it
        rang, take it down and have the next :meth:`collect` make a pass over the
        groups' bells. Whether it rang. Raises the store's errors."""
        bells = self.keys.bells()
        if self.store.get(bells, wait_s) is None:
            return False
        self.store.delete(bells)  # before the pass: a ring after this starts another
        self._ring_again()
        return True

    def _ring_again(self) -> None:
        with self._pass_began:
            self._rang = True

    def start_listening(self) -> None:
        """(The chief.) Start the listener thread (once): :meth:`listen` until
        :meth:`stop_listening` or the store is gone."""
        if self._listener is None:
            self._listener = threading.Thread(
                target=self._listen_loop, name="adaptd-mail-bell", daemon=True
            )
            self._listener.start()

    def stop_listening(self, timeout_s: float = 1.0) -> None:
        """Stop the listener: ring ``mail/bell/any`` to end its wait (a store already
        gone ends it too), then wait for it at most ``timeout_s``."""
        thread = self._listener
        if thread is None:
            return
        if not self._quiet.is_set():  # rung once: a second call only waits
            self._quiet.set()
            with self._pass_began:
                self._pass_began.notify_all()
            with contextlib.suppress(Exception):  # the store gone: its get ends with it
                self.store.put(self.keys.bells(), RUNG)
        thread.join(timeout_s)

    def _listen_loop(self) -> None:
        try:
            while not self._quiet.is_set():
                with self._pass_began:  # the rings while a pass is due make that pass
                    self._pass_began.wait_for(
                        lambda: not self._rang or self._quiet.is_set(), BELL_WAIT_S
                    )
                if not self._rang:
                    self.listen()
        except Exception as exc:  # the store gone: the watcher says so and stops
            if not self._quiet.is_set():
                log.debug("the chief's mail listener ended: %s", exc)

    def collect(self) -> int:
        """(The chief's watcher thread.) Read the mail the other ranks left into
        :attr:`inbox`, at most :data:`CALLS_PER_COLLECT` reads and deletes of it
        (:attr:`behind` says whether it stopped there; the next call goes on from
        there); returns how many were read. Does nothing (no call to the store) until
        ``mail/bell/any`` rang (:meth:`listen`), a pass is under way or a sweep is due.
        Raises the store's
        :class:`~adaptd.client.agreement.coordination.CoordinationError` when it is gone."""
        got = calls = 0
        groups = -(-self.world_size // GROUP)
        self.behind = False
        if not self._in_pass:  # a new pass over the groups, if anything calls for one
            now = self._clock()
            sweep = {g for g, (at, _) in self._sweep_due.items() if at <= now}
            with self._pass_began:  # read and cleared at once: a ring heard after it
                rang = self._rang  # starts the pass after this one
                if not (rang or sweep):
                    return 0
                self._rang = False
                self._pass_began.notify_all()
            for g in sweep:  # the next sweep of each, if any is left
                i = self._sweep_due.pop(g)[1] + 1
                if i < len(SWEEPS_S):
                    self._sweep_due[g] = (now + SWEEPS_S[i], i)
            self._sweeping, self._ringing = sweep, rang
            self._in_pass, self._cursor = True, 0
        for _ in range(groups):
            g = self._cursor
            bell = self.keys.bell(g)
            # a sweep alone looks at its groups' bells only: any other rung one rang
            # mail/bell/any too, which begins a pass of its own
            looked = self._ringing or g in self._sweeping
            rung = looked and self.store.try_get(bell) is not None
            if rung or g in self._sweeping:
                if rung:
                    self.store.delete(bell)  # before reading: mail written after rings again
                    self._sweep_due[g] = (self._clock() + SWEEPS_S[0], 0)  # sweeps anew
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
                    self.store.put(bell, RUNG)
                    self._ring_again()
                if self.behind:
                    return got
            self._cursor = (g + 1) % groups
            if self._cursor == 0:
                self._in_pass = False
                self._sweeping = set()
                break
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


__all__ = [
    "BELL_WAIT_S",
    "CALLS_PER_COLLECT",
    "GROUP",
    "PER_COLLECT",
    "RUNG",
    "SWEEPS_S",
    "Mailbox",
]
