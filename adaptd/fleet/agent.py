"""The daemon's fleet member: one thread that does all of the daemon's etcd I/O.

The daemon's loop never waits on etcd. It tells the agent what its jobs want
(:meth:`FleetAgent.want` a slot, :meth:`FleetAgent.release` it, :meth:`FleetAgent.publish`
what it learned about failures) and reads the newest :class:`FleetView`, a frozen
set of facts, whenever it decides. The agent's thread, in rounds:

1. opens a session if it has none (grants a lease, registers the host);
2. renews the lease every TTL/3;
3. syncs this host's slot claims (:class:`~adaptd.fleet.slots.SlotTable`) when something
   asks for it (a want or release of this host, enough releases on a target a job of
   this host waits for, a claim not settled yet), writes the failure records handed
   to it, and re-reads the members and the fleet's failure records every
   ``failures_every_s``, the claims every ``QUEUE_EVERY_S`` while a job of this host
   waits near its turn (``NEAR_RELEASES``), less often in a large fleet otherwise
   (:func:`queue_every_s`);
4. writes what the daemon sees wrong with its ranks (:meth:`FleetAgent.tell_rank`) and,
   while the daemon suspects a job of a hang (:meth:`FleetAgent.watch_ranks`), reads
   what the other hosts said of theirs, every ``poll_s`` (:mod:`adaptd.fleet.rank_facts`);
5. publishes a new :class:`FleetView`.

**What a round costs etcd grows with the work, not the fleet** (issue 35: at 0.5 s
polls that read every member and every claim, an idle daemon made 4.2 requests a
second, and a storm's waiters re-read the whole queue at each release, O(N²)). A
member with nothing to sync makes one call every ``idle_poll_s`` (within the link's
``stale_after_s``), which proves etcd answers: the lease keepalive when it is due, else
the members' mark (their count and the newest one's create revision, no key sent; a
host came, went or restarted: read them).
A job waiting for a slot watches the claims' deletions and wakes when enough of them
came on its target to make it eligible (:func:`~adaptd.fleet.slots.releases_needed`):
a release wakes the waiters next in line, not the whole queue.

**etcd down, slow or partitioned**: every call is bounded (the session's
``call_deadline_s``), so a failed round turns the view ``up=False`` within about
``call_deadline_s + poll_s``, and a view not refreshed for ``stale_after_s`` reads as
down too (:meth:`FleetView.usable`). The daemon then decides locally. The thread keeps
trying; when etcd answers again it renews the old lease if it survived (and deletes
the claims its jobs no longer want) or, if it expired with all its keys, opens a new
session and registers again: it rejoins by itself and leaks no slot. Everything is
logged as ``event=fleet_down`` / ``event=fleet_up``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from adaptd.core.stall import RankFact
from adaptd.fleet import rank_facts
from adaptd.fleet.failures import FailureRecord, publish, read_records
from adaptd.fleet.membership import Member, Members, parse_members, register
from adaptd.fleet.session import (
    EtcdSession,
    FleetAuthError,
    FleetError,
    FleetSettings,
    LeaseLost,
    Mark,
)
from adaptd.fleet.slots import (
    TAKE_STAGGER_S,
    SlotTable,
    TargetSlots,
    Want,
    place_in_line,
    queue_order,
    releases_needed,
)
from adaptd.logfmt import logfmt

log = logging.getLogger("adaptd.fleet")

#: While a job of this host waits for a slot, the agent watches the claims' deletions
#: (for at most this long at a time) instead of sleeping; a local want or release
#: interrupts the watch.
WATCH_S = 2.0
#: How often a member with nothing to sync proves etcd answers (one call: the lease
#: keepalive, or the members' mark): under the link's ``stale_after_s`` (3 s), so
#: the view of an idle daemon stays usable.
IDLE_POLL_S = 2.0
#: The claims (every host's, every target's) are read when this host's jobs want or
#: release a slot and when a waiter's turn comes (counted on its watch of releases),
#: and otherwise only this often while a job of this host waits (:func:`queue_every_s`:
#: less often with nothing waiting): not at each periodic round (``failures_every_s``).
#: Only the view of the targets that status and metrics show waits for it. Each read
#: returns every claim, so in a storm of N hosts on one target, N hosts reading every
#: 10 s (those done with their save, and the waiters) cost etcd N²/10 claims a second
#: (issue 35). A waiter dates other hosts' claims by their create revision
#: (:class:`~adaptd.fleet.session.HeardAt`), not by when it read them, so reading
#: rarely keeps the queue's order fair.
QUEUE_EVERY_S = 30.0
#: A host with no job waiting for a slot reads the claims only for that view (a holder
#: releases by its own call, which reads them); such hosts, however many, together read
#: them about this many times per ``QUEUE_EVERY_S`` (:func:`queue_every_s`). So do the
#: hosts whose jobs wait further back than ``NEAR_RELEASES``.
IDLE_QUEUE_READS = 50
#: A waiting job this many releases or fewer from its turn (:func:`releases_needed`,
#: less the releases seen since the read) keeps the ``QUEUE_EVERY_S`` read, which is
#: what passes over waiters ahead that do not take a free slot when no release comes
#: (:data:`~adaptd.fleet.slots.PATIENCE_S`): the next in line re-reads after every
#: watch, and these few behind it pass it over if it is stalled too. A job further back
#: needs no periodic read for its turn: the releases it counts on its watch wake it,
#: and its place as jobs with more GPUs overtake others is worked out from the claims it
#: read (their risk grows at a known rate), so its host reads the claims as seldom as a
#: host with nothing waiting. Every waiter's 30 s read cost a one-target storm of N
#: hosts N²/30 claims a second (issue 35); now about this many hosts per target (and
#: any with a free slot not taken yet) read every 30 s.
NEAR_RELEASES = 4
#: Every this many reads of the failure records, all of them are read (the others
#: read only what was written since): a record deleted by hand leaves the view.
RECORDS_FULL_EVERY = 30


def queue_every_s(hosts_up: int, near: bool) -> float:
    """Seconds between a daemon's periodic reads of the claims. ``QUEUE_EVERY_S`` while
    a job of its host waits within ``NEAR_RELEASES`` releases of its turn (``near``):
    that read is what passes over a waiter ahead that did not take a free slot
    (:data:`~adaptd.fleet.slots.PATIENCE_S`) when no release comes to wake this one.
    Any other host (nothing waiting, or its jobs further back: releases wake those) reads
    them ``hosts_up / IDLE_QUEUE_READS`` times less often in a fleet of more than
    ``IDLE_QUEUE_READS`` hosts: such hosts cost etcd about ``IDLE_QUEUE_READS`` reads of
    every claim per ``QUEUE_EVERY_S`` together, linear in the claims, where every host at
    ``QUEUE_EVERY_S`` cost N reads (N²/30 claims a second in a long storm on one target;
    issue 35). At 2,000 hosts such a host's view of other hosts' claims is up to 20
    minutes old: status shows its age."""
    if near:
        return QUEUE_EVERY_S
    return QUEUE_EVERY_S * max(1.0, hosts_up / IDLE_QUEUE_READS)


@dataclass(frozen=True)
class FleetView:
    """What this daemon knows of the fleet at one moment (facts for policies and status)."""

    host: str
    up: bool = False
    reason: str = "not connected yet"
    changed: float = 0.0  # monotonic time ``up`` last changed
    last_ok: float | None = None  # monotonic time of the last successful round
    role: str | None = None
    hosts: tuple[str, ...] = ()
    targets: Mapping[str, TargetSlots] = field(default_factory=dict)
    targets_at: float | None = None  # monotonic time ``targets`` (the claims) were read
    granted: frozenset[str] = frozenset()  # this host's jobs holding a slot
    waiting: frozenset[str] = frozenset()  # this host's jobs queued for one
    records: tuple[FailureRecord, ...] = ()
    records_at: float | None = None  # monotonic time ``records`` were read
    #: what the other hosts' daemons said of the ranks of the jobs watched
    #: (:meth:`FleetAgent.watch_ranks`), as of ``ranks_at``
    rank_facts: Mapping[str, tuple[RankFact, ...]] = field(default_factory=dict)
    ranks_at: float | None = None  # monotonic time ``rank_facts`` were read
    grants: int = 0  # slots granted to this host's jobs since start
    conflicts: int = 0  # grant transactions another daemon won first
    errors: int = 0  # rounds that failed
    rejoins: int = 0  # new sessions after the first (a lease that expired)

    def usable(self, now: float, stale_after_s: float) -> bool:
        """Up, and refreshed within ``stale_after_s`` of ``now`` (the same monotonic clock)."""
        return self.up and self.last_ok is not None and now - self.last_ok <= stale_after_s


class FleetAgent:
    """This daemon's member of the fleet; :meth:`start` its thread, :meth:`stop` it."""

    def __init__(
        self,
        settings: FleetSettings,
        *,
        poll_s: float = 0.5,
        idle_poll_s: float = IDLE_POLL_S,
        failures_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        version: str = "",
        on_grant: Callable[[], None] | None = None,
    ) -> None:
        """``on_grant`` is called (from the agent's thread) when a job of this host was
        just granted a slot, or lost one (its lease expired): the daemon decides again at
        once instead of at its tick. ``poll_s``: the shortest time between rounds
        (and the retry cadence while etcd is away); ``idle_poll_s``: between rounds with
        nothing to sync (at least ``poll_s``, at most a third of the lease TTL); raises
        :class:`ValueError` for a ``poll_s`` out of range."""
        if not 0 < poll_s <= settings.lease_ttl_s / 3:
            raise ValueError(
                f"fleet: poll_s must be > 0 and at most a third of the lease TTL "
                f"({settings.lease_ttl_s}s), got {poll_s}"
            )
        self.settings = settings
        self.poll_s = poll_s
        self.idle_poll_s = max(poll_s, min(idle_poll_s, settings.lease_ttl_s / 3))
        self.failures_every_s = failures_every_s
        self.clock = clock
        self.wall = wall
        self.version = version
        self.on_grant = on_grant
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._wants: dict[str, Want] = {}
        self._to_publish: dict[str, FailureRecord] = {}
        #: this host's rank facts: all of them (written again after a new session), and
        #: those not written yet (None: delete it)
        self._rank_facts: dict[tuple[str, int], RankFact] = {}
        self._rank_out: dict[tuple[str, int], RankFact | None] = {}
        self._watched_jobs: frozenset[str] = frozenset()
        self._rank_refused = False  # etcd refused this host's rank facts (logged once)
        self._session: EtcdSession | None = None
        self._table: SlotTable | None = None
        self._sessions = 0
        self._next_keepalive = 0.0
        self._next_failures = 0.0
        self._next_queue = 0.0
        self._members = Members()
        self._members_mark = Mark()
        #: the fleet's failure records by (host, GPU model), as of ``_records_revision``
        self._records: dict[tuple[str, str], FailureRecord] = {}
        self._records_revision = 0
        self._records_reads = 0
        #: claims deleted since the slot table's last read, and where to watch on from
        self._deleted: list[str] = []
        self._watch_from = 0
        self._view = FleetView(host=settings.host, changed=clock())

    # ------------------------------------------------------------------ daemon side

    def want(self, job: str, target: str, *, cap: int, at_risk_gpu_s: float, gpus: int) -> None:
        """``job`` wants a write slot on ``target`` (fleet-wide cap ``cap``). Repeating it
        keeps the first wish (its place in the queue); a new target replaces it."""
        with self._lock:
            old = self._wants.get(job)
            if old is not None and old.target == target and old.cap == cap:
                return
            risk, gpus = max(0.0, at_risk_gpu_s), max(1, gpus)
            self._wants[job] = Want(target, cap, risk, gpus, self.clock())
        self._wake_up()

    def release(self, job: str) -> None:
        """``job`` no longer needs its slot (its save is durable, failed, or it is gone)."""
        with self._lock:
            if self._wants.pop(job, None) is None:
                return
        self._wake_up()

    def _wake_up(self) -> None:
        """Run a round now: end the thread's sleep or its watch."""
        self._wake.set()
        session = self._session
        if session is not None:
            session.interrupt_wait()

    @property
    def watching(self) -> bool:
        """True while the thread waits on an etcd watch (a job of this host waits)."""
        session = self._session
        return session is not None and session.waiting

    def wanted(self) -> dict[str, Want]:
        with self._lock:
            return dict(self._wants)

    def publish(self, record: FailureRecord) -> None:
        """Write ``record`` (this host's knowledge of one GPU model) at the next round."""
        with self._lock:
            self._to_publish[record.gpu_model] = record
        self._wake.set()

    def tell_rank(self, job: str, rank: int, state: str | None) -> None:
        """What this daemon sees wrong with its rank ``rank`` of ``job`` (None: nothing
        now), written (leased) at the next round; raises :class:`ValueError` for an
        empty job or a negative rank."""
        key = (job, rank)
        fact = None if state is None else RankFact(job, rank, self.settings.host, state)
        with self._lock:
            if fact is None:
                if self._rank_facts.pop(key, None) is None:
                    return
            else:
                self._rank_facts[key] = fact
            self._rank_out[key] = fact
        self._wake_up()

    def watch_ranks(self, jobs: frozenset[str]) -> None:
        """Read what the other hosts say of the ranks of ``jobs`` at every round (every
        ``poll_s``) from now on; an empty set stops the reads."""
        with self._lock:
            if jobs == self._watched_jobs:
                return
            fresh = bool(jobs - self._watched_jobs)
            self._watched_jobs = frozenset(jobs)
        if fresh:
            self._wake_up()

    def view(self) -> FleetView:
        return self._view

    def wait_for(self, predicate: Callable[[FleetView], bool], timeout_s: float) -> FleetView:
        """The first view that satisfies ``predicate``; raises :class:`TimeoutError`
        after ``timeout_s`` (tests and benchmarks wait on this, never on a sleep)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate(self._view):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"fleet view did not reach the expected state in {timeout_s:g}s; "
                        f"last: up={self._view.up} reason={self._view.reason!r} "
                        f"granted={sorted(self._view.granted)}"
                    )
                self._changed.wait(left)
            return self._view

    # ------------------------------------------------------------------ thread

    def start(self) -> FleetAgent:
        self._thread = threading.Thread(target=self._run, name="adaptd-fleet", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread; write the failure records not yet written, delete this host's
        claims and revoke its lease (bounded: with etcd away the claims expire with the
        lease, and the records are written by the next daemon on the host)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(FleetError):
                for record in self._to_publish.values():
                    publish(session, record)
                SlotTable(session).release_all()
            session.close()
        self._set(replace(self._view, up=False, reason="stopped", granted=frozenset()))

    def _run(self) -> None:
        sync = True
        while not self._stopping.is_set():
            view = self._poll(sync)
            turn = False
            if view.up and view.waiting and self._session is not None and not self._wake.is_set():
                # a job of this host waits for a slot: wake when enough claims on its
                # target went to make it eligible (a release), not at the next poll; a
                # local want/release ends the watch at once
                with contextlib.suppress(FleetError):  # the next round says what is wrong
                    turn = self._watch_for_turn(view)
            else:
                idle = self.poll_s if self._watched_jobs else self.idle_poll_s
                self._wake.wait(idle if view.up else min(1.0, self.poll_s * 2))
            local = self._wake.is_set()
            self._wake.clear()
            sync = local or turn or not view.up or self._unsettled(view)

    def _unsettled(self, view: FleetView) -> bool:
        """A job of this host wants a slot it neither holds nor waits for in etcd yet
        (its claim lost every grant race of the last sync): sync again."""
        with self._lock:
            wanted = set(self._wants)
        return bool(wanted - view.granted - view.waiting)

    def _releases_to_turn(
        self,
        targets: Mapping[str, TargetSlots],
        waiting: frozenset[str],
        wants: Mapping[str, Want],
        wall: float,
    ) -> dict[str, int] | None:
        """For each target a job of this host waits on, how many claims on it must go
        before one of those jobs can take a slot (:func:`releases_needed`), with the queue
        put in order at ``wall`` from the claims last read: a job with more GPUs than
        those ahead overtakes them as it waits, and no read is needed to see it. A new
        claim ahead only makes the true count bigger, so a waiter that counts releases
        against these wakes no later than its turn. ``None``: the claims read do not
        show a waiting job's target yet (read them)."""
        needs: dict[str, int] = {}
        for job in waiting:
            w = wants.get(job)
            slots = targets.get(w.target) if w is not None else None
            if w is None or slots is None:
                return None
            now = replace(slots, waiters=queue_order(slots.waiters, wall))
            need = releases_needed(now, (self.settings.host, job))
            needs[w.target] = min(need, needs.get(w.target, need))
        return needs

    def _watch_for_turn(self, view: FleetView) -> bool:
        """Watch the claims' deletions for up to ``WATCH_S``; True when, since the last
        read, as many claims went on a target as a waiting job of this host needs
        (:meth:`_releases_to_turn`), when the watch could not replay, or when a job
        within ``NEAR_RELEASES`` of its turn is due its ``QUEUE_EVERY_S`` read (read
        again)."""
        session = self._session
        assert session is not None
        with self._lock:
            wants = dict(self._wants)
        wall = self.clock()
        needs = self._releases_to_turn(view.targets, view.waiting, wants, wall)
        if needs is None:
            return True  # the view is behind the wants: sync
        next_up = False  # a job of this host is next after the waiters a free slot is for
        for job in view.waiting:
            slots = view.targets[wants[job].target]
            mine = next((c for c in slots.waiters if c.owner == (self.settings.host, job)), None)
            if mine is not None and place_in_line(slots, mine, wall) is not None:
                # a slot is free for it now (its take lost a race): try again shortly
                self._wake.wait(TAKE_STAGGER_S)
                return True
            next_up = next_up or (needs[slots.target] == 1 and slots.free > 0)

        def went(new: Sequence[str]) -> dict[str, int]:
            out: dict[str, int] = {}
            for key in (*self._deleted, *new):
                parts = self.settings.keys.claim_parts(key)
                if parts is not None and parts[1] in needs:
                    out[parts[1]] = out.get(parts[1], 0) + 1
            return out

        def enough(new: Sequence[str]) -> bool:
            gone = went(new)
            return any(gone.get(t, 0) >= n for t, n in needs.items())

        gone = went(())
        near = any(n - gone.get(t, 0) <= NEAR_RELEASES for t, n in needs.items())
        if near and view.targets_at is not None and wall >= view.targets_at + QUEUE_EVERY_S:
            return True  # the read that passes over a waiter ahead that does not take
        # the watch ends when the lease is due for renewal: a waiter watching past it
        # lost its lease under a short TTL (2 s allowed, WATCH_S is 2 s) and its place in
        # line with it (the 17-host cell saw 4 rejoins in 20 s at the tests' 3 s TTL)
        watch_s = min(WATCH_S, self._next_keepalive - self.clock())
        if watch_s <= 0:
            return False  # renew first: the next round does, then watches again
        out = session.watch_deletes(
            self.settings.keys.claims, watch_s, start_revision=self._watch_from, enough=enough
        )
        if out.deleted:
            self._deleted.extend(out.deleted)
            self._watch_from = out.revision + 1
        # next in line after a free slot that the waiter ahead has not taken yet: read
        # again after the watch, so that one that does not take is passed over
        # (slots.PATIENCE_S); the waiters further back wait for releases as before (a
        # re-read by every waiter that saw a slot free cost a 200-host storm 0.9 s p50)
        return out.resync or enough(()) or next_up

    def poll_once(self) -> FleetView:
        """One full round (tests may drive it directly): the claims synced."""
        return self._poll(sync=True)

    def _poll(self, sync: bool) -> FleetView:
        """One round (the thread's body); ``sync``: sync this host's claims now."""
        now = self.clock()
        try:
            try:
                view = self._round(now, sync)
            except LeaseLost as exc:
                # etcd answered: it is there, only the lease is gone (it expired while this
                # process was stopped, or etcd was wiped). Open a new session in this round
                # instead of deciding locally meanwhile: a grant of the old lease is void,
                # and a local decision would let its job write beside the new holder.
                self._drop_session()
                log.warning(logfmt("fleet_lease_lost", host=self.settings.host, error=str(exc),
                                   held=",".join(sorted(self._view.granted)) or None))  # fmt: skip
                view = self._round(now, sync)
        except LeaseLost as exc:
            self._drop_session()
            view = self._down(now, f"lease lost: {exc}")
        except FleetAuthError as exc:
            self._drop_session()
            view = self._down(now, str(exc), level=logging.ERROR)
        except FleetError as exc:
            self._next_keepalive = 0.0  # the lease may have expired meanwhile: check first
            view = self._down(now, str(exc))
        except Exception as exc:  # a bug must not end the thread; the daemon decides locally
            log.exception(logfmt("fleet_round_failed"))
            view = self._down(now, f"internal error: {exc!r}")
        self._set(view)
        return view

    def _round(self, now: float, sync: bool) -> FleetView:
        s = self._session
        fresh = s is None
        if s is None:
            s = EtcdSession(self.settings, clock=self.clock).open()
            register(s, Member(self.settings.host, os.getpid(), self.wall(), self.version))
            self._session = s
            self._table = SlotTable(s, marked=self.settings.keys.members, pause=self._stopping.wait)
            self._sessions += 1
            self._next_keepalive = now + self.settings.lease_ttl_s / 3
            self._next_failures = 0.0
        with self._lock:
            wants = dict(self._wants)
            to_publish = dict(self._to_publish)
            if fresh:  # a new lease: the old one's keys are gone, this host's facts too
                self._rank_out = {**self._rank_facts}
            rank_out = dict(self._rank_out)
            watched = self._watched_jobs
        full = fresh or now >= self._next_failures  # members and records re-read
        # the claims are read when this host's jobs want or release a slot, a waiter's
        # turn comes (``sync``), and every QUEUE_EVERY_S, not at each full round
        sync = sync or fresh or not self._view.up or now >= self._next_queue
        light = not (fresh or sync or to_publish or rank_out or watched)  # one call
        if not fresh and now >= self._next_keepalive:
            s.keepalive()
            self._next_keepalive = now + self.settings.lease_ttl_s / 3
            light = False
        mark = s.mark(self.settings.keys.members) if light else None
        assert self._table is not None
        prev = self._view
        targets, granted, waiting = prev.targets, prev.granted, prev.waiting
        targets_at = prev.targets_at
        grants = conflicts = 0
        if fresh:  # before the first take: it takes by the rule of the members up
            self._read_members(s)
        if sync:
            state = self._table.sync(wants, self.clock())  # one clock per daemon: monotonic
            targets, granted, waiting = state.targets, state.granted, state.waiting
            grants, conflicts = state.new_grants, state.conflicts
            self._deleted, self._watch_from = [], self._table.read_revision + 1
            targets_at = now
            # the members as last read: this round's read comes below, and a host that
            # came or went changes the period by a fraction of it
            hosts_up = len(self._members.hosts)
            needs = self._releases_to_turn(targets, waiting, wants, now)
            near = needs is None or any(n <= NEAR_RELEASES for n in needs.values())
            self._next_queue = now + queue_every_s(hosts_up, near)
        if mark is None and sync:
            mark = self._table.mark  # taken with the claims, in the same request
        if not fresh and mark is not None and mark != self._members_mark:
            self._read_members(s)  # a host came, went or restarted since the last read
        if self._members.role(self.settings.host) is None and (full or sync):
            # our key went away (deleted by hand)
            register(s, Member(self.settings.host, os.getpid(), self.wall(), self.version))
            self._read_members(s)
        members = self._members
        for model, record in to_publish.items():
            publish(s, record)
            with self._lock:
                if self._to_publish.get(model) is record:
                    del self._to_publish[model]
        for (job, rank), fact in rank_out.items():
            try:
                rank_facts.write(s, self.settings.keys, self.settings.host, job, rank, fact)
            except FleetAuthError as exc:
                # a role made before rank facts (no readwrite on ranks/{host}/): the
                # fleet works as before, only this host's ranks are not named elsewhere
                if not self._rank_refused:
                    log.warning(logfmt("fleet_rank_fact_refused", host=self.settings.host,
                                       error=str(exc), fix="docs/fleet.md, roles"))  # fmt: skip
                self._rank_refused = True
            with self._lock:
                if self._rank_out.get((job, rank), 0) is fact:
                    del self._rank_out[job, rank]
        ranks, ranks_at = {}, None
        if watched:
            ranks, skipped = rank_facts.read_facts(s, self.settings.keys, watched)
            ranks_at = now
            for line in skipped:
                log.warning(logfmt("fleet_rank_fact_skipped", error=line))
        records, records_at = prev.records, prev.records_at
        if full or to_publish:
            records, records_at = self._read_records(s, fresh), now
        if full:
            self._next_failures = now + self.failures_every_s
        if not prev.up:
            log.info(
                logfmt(
                    "fleet_up",
                    host=self.settings.host,
                    hosts=len(members.hosts),
                    role=members.role(self.settings.host),
                    session=self._sessions,
                )
            )
        return replace(
            prev,
            up=True,
            reason="",
            changed=prev.changed if prev.up else now,
            last_ok=now,
            role=members.role(self.settings.host),
            hosts=members.names,
            targets=targets,
            targets_at=targets_at,
            granted=granted,
            waiting=waiting,
            records=records,
            records_at=records_at,
            rank_facts=ranks,
            ranks_at=ranks_at,
            grants=prev.grants + grants,
            conflicts=prev.conflicts + conflicts,
            rejoins=max(0, self._sessions - 1),
        )

    def _read_members(self, s: EtcdSession) -> None:
        entries = s.get_prefix(self.settings.keys.members)
        self._members = parse_members(entries, self.settings.keys)
        self._members_mark = Mark.of(entries)
        if self._table is not None:
            members = self._members
            self._table.per_target_through = members.newest if members.grant_per_target else None
            self._table.numbered_through = members.newest if members.grant_numbered else None

    def _read_records(self, s: EtcdSession, fresh: bool) -> tuple[FailureRecord, ...]:
        """The fleet's failure records: those written since the last read, merged into
        the ones known (all of them at a new session, and every ``RECORDS_FULL_EVERY``
        reads, which drops a record deleted by hand)."""
        self._records_reads += 1
        whole = fresh or self._records_reads % RECORDS_FULL_EVERY == 1
        found, skipped = read_records(s, since=0 if whole else self._records_revision + 1)
        self._records_revision = s.revision
        if whole:
            self._records = {}
        for r in found:
            self._records[(r.host, r.gpu_model)] = r
        for line in skipped:
            log.warning(logfmt("fleet_record_skipped", error=line))
        return tuple(self._records[k] for k in sorted(self._records))

    def _down(self, now: float, reason: str, level: int = logging.WARNING) -> FleetView:
        prev = self._view
        if prev.up or (prev.reason != reason and prev.errors == 0):
            log.log(
                level,
                logfmt("fleet_down", host=self.settings.host, reason=reason, deciding="locally"),
            )
        return replace(
            prev,
            up=False,
            reason=reason,
            changed=now if prev.up else prev.changed,
            granted=frozenset(),
            waiting=frozenset(),
            errors=prev.errors + 1,
        )

    def _drop_session(self) -> None:
        session, self._session, self._table = self._session, None, None
        if session is not None:
            session.lease_id = None  # expired or refused: nothing to revoke
            session.close()

    def _set(self, view: FleetView) -> None:
        with self._changed:
            # a new grant, or a grant gone (its lease lost): the daemon decides again now
            new = view.granted ^ self._view.granted
            self._view = view
            self._changed.notify_all()
        if new and self.on_grant is not None:
            try:
                self.on_grant()
            except Exception:  # the daemon's callback must not end the thread
                log.exception(logfmt("fleet_on_grant_failed"))
