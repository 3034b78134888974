"""Messages from a multi-worker job's ranks to its chief, in-band on the job's store.

A rank whose daemon does not decide the job has two things to tell the chief (rank
0): an operator's request typed on its host (:class:`~adaptd.protocol.job.Request`, from
the daemon's :class:`~adaptd.protocol.job.Relay`) and what each save cost it
(:class:`~adaptd.protocol.job.SaveCost`, so that δ is the slowest rank's). Each rank
keeps a count of what it sent, ``mail/<rank>/sent`` (written ``0`` when its agreement
starts: :meth:`Mailbox.open`), and writes its own numbered keys, ``mail/<rank>/<i>``
(:meth:`Mailbox.post`: one put, then the count rewritten, on the training thread,
no contention: nobody else writes them), then rings its group's doorbell,
``mail/bell/<group>``, then the bell over all groups, ``mail/bell/any`` (two more
puts; the ranks are in groups of :data:`GROUP`, and a bell already rung stays rung).
The chief's listener thread waits on ``mail/bell/any`` (:meth:`Mailbox.listen`: one
get, :data:`BELL_WAIT_S` long); when it rings, it takes it down and the chief's
agreement watcher thread, after its next wait for a proposal that brought none (at its
next tick, within a second), makes a pass over the groups' bells
(:meth:`Mailbox.collect`: one get per group), and for a rung one takes the bell down,
then reads each rank's count and the keys up to it, and deletes what it read; at most
:data:`CALLS_PER_COLLECT` such reads and deletes per call, going on from there at the
next (:attr:`Mailbox.behind`). The training thread never waits for the mail.

Why the bells: reading every rank's count costs a get per rank: at 2,048 ranks an
idle chief that looked every half second would make about 4,000 gets a second. No
mail is missed: a rank writes its mail, then its count, *before* it rings, and the
chief takes each bell down *before* it reads what the bell stands for (the groups'
bells, a group's counts), so mail that lands after the chief read its rank's count
rings the bells again; and what the chief's try could not find in a pass (a count or a
message below it, on a busy host) rings its group's bell again, for the next
:data:`TRIES` passes. Why the bound: after a save every rank sends its
cost, and the watcher reading all of it at once kept a proposal waiting for it: 0.26
s at 64 ranks, 1.4 s at 256 (docs/scale.md).

**Why counts, and no get of a key that is not there** (issue 35). TensorFlow's
coordination service keeps every get that timed out on a key not written yet, and so
does its client, until that key is written: about 35 KB a get, in the chief's process;
and every timed-out get leaves 88 bytes of Python objects in the caller for good
(benchmarks/coordination_gets.py). The chief used to find the end of a rank's mail by
a get of its next key, which timed out (one a rank and save), and to read every rank
of a rung group again three times over the next ten minutes (*sweeps*, for a get
that waited past its millisecond for a key that *is* there), each time a timed-out
get per rank that sent nothing: about 4 a rank and save, 0.7 MB a save kept for good
at 2,048 ranks. With the counts, the chief's gets are of keys that are there: each
rank's count (written when its agreement starts), and the messages below it. What is
left of timed-out gets: the bells of groups that did not ring, in a pass a ring began
(one per group), a count read while its rank rewrites it (or never written: a rank
not started, or dead mid-rewrite; tried at :data:`TRIES` passes), and the listener's
one per :data:`BELL_WAIT_S`.

**Tries miss on a busy host; what is known to be there is waited for.** A 1 ms try of a
key that *is* there times out when the host is busy: 492 of 3,000 tries of a present key
beside four CPU hogs on the 2-core box, 1 of 3,000 on the quiet box
(``benchmarks/coordination_gets.py --gets 3000 --hogs 4``). A pass whose try missed the
rung group's bell read nothing and left the bell up, and nothing rang again until the
rank's next message: in a quiet job that was an operator's relayed request left unread
for good (a CI run: set-policy typed on the other host, unread after 120 s). So a ring
says who rang: the rank writes its number at ``mail/bell/any`` (the first writer's
stays), and the pass that ring begins takes that rank's group's bell down without
looking at it (a bell the chief rings again itself, after a miss, likewise) and reads
that rank's count with a wait of up to :data:`SURE_WAIT_S` (it wrote the count before it
rang). Each count the chief read once is waited for the same way from then on (a rank's
count stays, but for the instant of its rewrite), until one such wait times out (the
rank died mid-rewrite: a wait of :data:`SURE_WAIT_S` once, then tries); and the mail
below a count is waited for (it is there until the chief deletes it). What is left to
tries: the bells of groups that rang after the first ringer's (mail/bell/any still up:
their mail waits for the next ring that finds it down, at most a save away while every
rank sends its costs), and the counts of ranks not read yet (retried at :data:`TRIES`
passes, a tenth of a second and more apart, then left to the rank's next ring).
"""

from __future__ import annotations

import contextlib
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
#: A rank's count or message the chief's try did not find (the rank has not started;
#: it died while rewriting its count; a busy host kept a 1 ms try of a key that is
#: there past its millisecond): its group's bell is rung again for this many passes,
#: then left to the rank's next ring. Never a longer wait: the chief's watcher runs the
#: rounds too (a rank that died mid-rewrite would hold every pass for the wait).
TRIES = 3
#: How long one get of the listener waits on ``mail/bell/any``: a get that times out is
#: kept by the service until the bell rings (above), one per this many seconds per job.
BELL_WAIT_S = 30.0
#: What a rank writes at its group's bell (at ``mail/bell/any`` it writes its number).
RUNG = "1"
#: The longest wait for a key the chief knows is there (a count of a rank that rang, or
#: that it read before; mail below a count): it comes back as soon as the service
#: answers, which a 1 ms try on a busy host often does not (the module's docstring).
SURE_WAIT_S = 0.25


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
        self._post_lock = threading.Lock()  # one post at a time: the count only grows
        self._count_there = False  # this rank's count was written
        self._next = dict.fromkeys(range(1, world_size), 0)  # chief: next index per rank
        self._tries: dict[int, int] = {}  # chief: passes that missed a rank's key
        #: (Chief.) Ranks whose count is waited for, not tried: read before, or rang.
        self._sure: set[int] = set()
        #: (Chief.) For the next pass: groups known to have rung (their bells are taken
        #: down without a look) and ranks known to have written their count.
        self._due_groups: set[int] = set()
        self._due_ranks: set[int] = set()
        self._pass_groups: set[int] = set()  # the pass's: taken from _due_groups
        self._cursor = 0  # chief: the group the next collect starts at
        self._in_pass = False  # chief: a pass over the groups is under way
        #: (Chief.) mail/bell/any rang since the last pass began; the listener waits
        #: for that pass before it listens again (a ring per pass, not per message).
        self._rang = False
        self._pass_began = threading.Condition()
        self._listener: threading.Thread | None = None
        self._quiet = threading.Event()  # chief: the listener is to stop
        #: (Chief.) The last collect stopped at its bound: there may be more to read.
        self.behind = False
        #: What the chief read and its training thread has not taken yet.
        self.inbox: deque[p.RankMessage] = deque()
        #: Mail that could not be read (bad records), and posts that failed.
        self.bad = 0
        self.failed = 0

    def open(self) -> bool:
        """(A rank other than the chief, before it posts.) Write its count, ``0``, so that
        the chief's reads of it never wait for a key that is not there; False (logged)
        when the store refused it."""
        try:
            with self._post_lock:
                self._set_count(self._sent)
            return True
        except Exception as exc:  # the mail is lost, as the job is; never stop training
            self.failed += 1
            log.warning("could not open the mail to the job's chief: %s", exc)
            return False

    def _set_count(self, n: int) -> None:
        """Write this rank's count: a put the first time, then a delete and a put (the
        store's first writer wins; a key there from before is rewritten too)."""
        key = self.keys.mail_sent(self.rank)
        if not self._count_there and self.store.put(key, str(n)):
            self._count_there = True
            return
        self.store.delete(key)
        self.store.put(key, str(n))
        self._count_there = True

    def post(self, msg: p.Request | p.SaveCost) -> bool:
        """(A rank other than the chief.) Leave ``msg`` for the chief; False (logged)
        when the store refused it (the service is gone: the message is lost, as the
        job is)."""
        try:
            with self._post_lock:
                i = self._sent
                sent = self.store.put(self.keys.mail(self.rank, i), p.encode_json(msg))
                self._sent += 1
                self._set_count(self._sent)  # after the message, before the bells
            # in this order: the chief takes bell/any down before it looks at the groups'
            self.store.put(self.keys.bell(self.rank // GROUP), RUNG)  # False: already rung
            self.store.put(self.keys.bells(), str(self.rank))  # who rang (the first stays)
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
        raw = self.store.get(bells, wait_s)
        if raw is None:
            return False
        self.store.delete(bells)  # before the pass: a ring after this starts another
        self._ring_again(self._ringer(raw))
        return True

    def _ringer(self, raw: str) -> int | None:
        """The rank that rang ``mail/bell/any`` (its value), None when it names none."""
        try:
            r = int(raw)
        except ValueError:
            return None
        return r if 0 < r < self.world_size else None

    def _ring_again(self, rank: int | None = None, *, group: int | None = None) -> None:
        """Have the next :meth:`collect` make a pass; ``rank`` rang (its group's bell and
        its count are there), or ``group``'s bell is known rung (the chief rang it)."""
        with self._pass_began:
            self._rang = True
            if rank is not None:
                self._due_ranks.add(rank)
                self._due_groups.add(rank // GROUP)
            if group is not None:
                self._due_groups.add(group)

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
        ``mail/bell/any`` rang (:meth:`listen`) or a pass is under way. Raises the
        store's :class:`~adaptd.client.agreement.coordination.CoordinationError` when
        it is gone."""
        got = calls = 0
        groups = -(-self.world_size // GROUP)
        self.behind = False
        if not self._in_pass:  # a new pass over the groups, if a ring calls for one
            with self._pass_began:  # read and cleared at once: a ring heard after it
                if not self._rang:  # starts the pass after this one
                    return 0
                self._rang = False
                self._pass_groups, self._due_groups = self._due_groups, set()
                self._sure |= self._due_ranks
                self._due_ranks = set()
                self._pass_began.notify_all()
            self._in_pass, self._cursor = True, 0
        for _ in range(groups):
            g = self._cursor
            bell = self.keys.bell(g)
            # a group known to have rung is not looked at: a try on a busy host misses
            # a bell that is there, and the mail behind it would wait for another ring
            if g in self._pass_groups or self.store.try_get(bell) is not None:
                with self._pass_began:  # read now: a ring known before this is covered
                    self._pass_groups.discard(g)
                    self._due_groups.discard(g)
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
                if more:  # unread mail (over PER_COLLECT, the bound, a slow read): again
                    self.store.put(bell, RUNG)
                    self._ring_again(group=g)
                if self.behind:
                    return got
            self._cursor = (g + 1) % groups
            if self._cursor == 0:
                self._in_pass = False
                break
            if calls >= CALLS_PER_COLLECT:
                self.behind = True
                return got
        return got

    def _read(self, r: int) -> tuple[int, bool, int]:
        """Read rank ``r``'s messages below its count (at most PER_COLLECT) into the
        inbox: how many were read, whether some may be left unread (the bound, or a
        count or message not found, for :data:`TRIES` passes), and the store calls it
        made."""
        count = self.keys.mail_sent(r)
        if r in self._sure:  # there but for the instant of a rewrite: waited for
            raw = self.store.get(count, SURE_WAIT_S)
            if raw is None:  # dead mid-rewrite, or never started: tried from now on
                self._sure.discard(r)
        else:
            raw = self.store.try_get(count)
        calls = 1
        if raw is None:
            return 0, self._missed(r), calls
        self._sure.add(r)
        try:
            sent = int(raw)
        except ValueError:
            self.bad += 1
            log.warning("rank %d's mail count is not a number: %r", r, raw[:40])
            return 0, False, calls
        got = read = 0
        while self._next[r] < sent:
            if read == PER_COLLECT:
                return got, True, calls
            key = self.keys.mail(r, self._next[r])
            raw = self.store.get(key, SURE_WAIT_S)  # below the count: it is there
            calls += 1
            if raw is None:
                return got, self._missed(r), calls
            self._next[r] += 1
            self.store.delete(key)
            calls, read = calls + 1, read + 1
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
        self._tries.pop(r, None)
        return got, False, calls

    def _missed(self, r: int) -> bool:
        """A try of rank ``r``'s count or message found nothing: whether to read it again
        at the next pass (for TRIES passes in a row)."""
        self._tries[r] = self._tries.get(r, 0) + 1
        return self._tries[r] <= TRIES

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
    "SURE_WAIT_S",
    "TRIES",
    "Mailbox",
]
