"""Write slots on shared storage: a fleet-wide cap on jobs saving to one target at once.

The etcd recipe, with a fair wait queue:

- A job that wants to save to a shared target puts a **claim**,
  ``{prefix}claims/{host}/{target}/{job}``, under its daemon's lease: first as a
  *waiter*, and as a *holder* once granted. A dead daemon's claims vanish with its
  lease, so a crash never keeps a slot longer than the lease TTL.
- **Grant by transaction, per numbered slot.** A target of cap ``c`` has ``c`` slots,
  numbered 0 to c-1, each a key ``{prefix}grants/{target}/{k}`` that exists while a job
  holds it. A daemon reads every claim and the grant keys at one revision, decides
  with :func:`may_take` whether its job is among the next in line for the free slots,
  and the i-th in line takes the i-th free number: one transaction turns the claim
  into a holder (its record names the slot) and puts the slot key, and succeeds only
  if that key is absent. A slot key cannot be taken twice, so the cap holds across
  hosts; two daemons deciding from the same state take different numbers and both
  win, and only two that picked the same number (their views of the queue differ)
  conflict: the loser re-reads and decides again (issue 35: a compare of the whole
  claims range made every claim anywhere retry every grant, 18.7 conflicts per grant
  in a storm of 200 hosts; one grant key per target, rewritten by every grant on it,
  still let one taker of a target's free slots win per read, 0.5 conflicts per
  grant). A release deletes the holder's claim and its slot key in one transaction;
  a crash frees both with the daemon's lease.
- **Mixed fleets.** Daemons from before took by one grant key per target
  (``{prefix}grants/{target}``, rewritten by every grant, compared by the next), and
  those before that by a compare of the whole claims range. Each member's record says
  which rule it takes by (:data:`~adaptd.fleet.membership.NUMBERED_SLOTS`,
  :data:`~adaptd.fleet.membership.PER_TARGET_GRANTS`, or nothing); this daemon always
  takes a numbered slot, and while any member up says less it also rewrites the grant
  key and compares it (every member per target) or the whole claims range, so old and
  new exclude each other. A grant by the newer rules also compares that no member
  registered after the members it read (an older daemon joining makes it fail and
  re-read). So a fleet upgrades host by host; the numbered rule alone starts once the
  last older daemon is gone, and every holder by then has its slot key (the older
  daemons' claims go with them).
- **Fair order.** Waiters are served by the work they have at risk (GPU-seconds since
  their last durable save, growing at their GPU count while they wait), most first,
  then by who asked first. The ``free`` slots go to the first ``free`` waiters, so a
  slow daemon at the head of the queue does not hold up a second free slot, and a
  waiter seen in line for a free slot for ``PATIENCE_S`` without taking it is passed
  over (:meth:`SlotTable.view`).
- **Release on durable**: the daemon deletes the holder's key when the save is
  durable (or failed, or the job went away).
- **One cap.** Each claim carries its daemon's cap for the target; the smallest cap
  any claim on the target carries is the one every daemon enforces, so hosts
  configured differently still agree.

The decision (:func:`may_take`, :func:`target_view`) is pure; :class:`SlotTable` does
the etcd I/O for one daemon.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from adaptd.fleet.keys import KeySpace
from adaptd.fleet.session import Entry, EtcdSession, Guard, Mark, Put, newest_revision
from adaptd.logfmt import logfmt

log = logging.getLogger("adaptd.fleet")

#: Grant attempts per sync when other daemons' claims keep changing under us.
MAX_ATTEMPTS = 4
#: When several slots free at once, the waiter k-th in line (k > 0) reads again after
#: k times this before it takes, and at most ``MAX_STAGGER_S``: takers of one target's
#: free slots at the same moment all but one lose (each grant rewrites the target's
#: grant key) and re-read (issue 35 measured 1.6 conflicts per grant at 4 slots, 7.8 at 8).
TAKE_STAGGER_S = 0.05
MAX_STAGGER_S = 0.5
#: A waiter this daemon has seen in line for a free slot for this long without taking
#: it is passed over. Daemons order a queue by when each first saw a claim (its own
#: clock), so two of them that read at different times can each put the other ahead
#: and leave a free slot unused until one reads again (issue 35: grants 17 s late in a
#: storm on 4 targets, once grants stopped conflicting across targets); a daemon that
#: is slow or stopped at the head of a queue holds it up no longer either. Longer than
#: a live daemon takes to take (a read and a transaction), so fairness holds.
PATIENCE_S = 3.0


@dataclass(frozen=True, slots=True)
class Claim:
    """One job's wish for (or hold on) a write slot on ``target``.

    ``at_risk_gpu_s`` is the job's work at risk (GPU-seconds since its last durable
    save) at time ``stamped``; while it waits that grows at ``gpus`` per second
    (:meth:`risk_at`), so the record need not be rewritten as time passes. A daemon
    reads ``stamped`` as when it first heard of the claim's create revision, on its own
    monotonic clock (:meth:`SlotTable.read`): hosts' wall clocks may differ by any amount.
    """

    host: str
    target: str
    job: str
    holding: bool = False
    at_risk_gpu_s: float = 0.0
    gpus: int = 1
    stamped: float = 0.0
    cap: int = 1
    create_revision: int = 0
    slot: int | None = None  # the numbered slot a holder took (None: waiting, or older)

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ValueError(f"slot cap must be >= 1, got {self.cap} for {self.target!r}")
        if not self.at_risk_gpu_s >= 0 or self.gpus < 1:
            raise ValueError(
                f"claim of {self.job!r}: at_risk_gpu_s must be >= 0 and gpus >= 1, got "
                f"{self.at_risk_gpu_s!r} and {self.gpus!r}"
            )

    def risk_at(self, wall: float) -> float:
        return self.at_risk_gpu_s + self.gpus * max(0.0, wall - self.stamped)

    def record(self) -> bytes:
        out: dict[str, object] = {
            "holding": self.holding,
            "at_risk_gpu_s": self.at_risk_gpu_s,
            "gpus": self.gpus,
            "stamped": self.stamped,
            "cap": self.cap,
        }
        if self.slot is not None:
            out["slot"] = self.slot
        return json.dumps(out).encode()

    @property
    def owner(self) -> tuple[str, str]:
        return self.host, self.job


def parse_claims(entries: Iterable[Entry], keys: KeySpace) -> list[Claim]:
    """Claims from the keys under the claims prefix; malformed ones are skipped."""
    out = []
    for e in entries:
        parts = keys.claim_parts(e.key)
        if parts is None:
            continue
        try:
            d = json.loads(e.value)
            slot = d.get("slot")
            out.append(
                Claim(
                    host=parts[0],
                    target=parts[1],
                    job=parts[2],
                    holding=bool(d["holding"]),
                    at_risk_gpu_s=float(d["at_risk_gpu_s"]),
                    gpus=int(d["gpus"]),
                    stamped=float(d["stamped"]),
                    cap=int(d["cap"]),
                    create_revision=e.create_revision,
                    slot=None if slot is None else int(slot),
                )
            )
        except (ValueError, KeyError, TypeError):
            log.debug(logfmt("fleet_claim_skipped", key=e.key))
    return out


@dataclass(frozen=True, slots=True)
class TargetSlots:
    """The fleet's slots on one target: who holds them, who waits (in grant order)."""

    target: str
    cap: int
    holders: tuple[Claim, ...] = ()
    waiters: tuple[Claim, ...] = ()

    @property
    def free(self) -> int:
        return max(0, self.cap - len(self.holders))


def queue_order(waiters: Iterable[Claim], wall: float) -> tuple[Claim, ...]:
    """Most work at risk first, then the earliest claim, then by name (deterministic)."""
    return tuple(
        sorted(waiters, key=lambda c: (-c.risk_at(wall), c.create_revision or 1 << 62, c.owner))
    )


def target_view(claims: Iterable[Claim], target: str, cap: int, wall: float) -> TargetSlots:
    """The slots of ``target`` from every claim read; the cap is the smallest any
    claim on it (or ``cap``, this daemon's own) carries."""
    mine = [c for c in claims if c.target == target]
    effective = min([cap, *(c.cap for c in mine)])
    return TargetSlots(
        target,
        effective,
        holders=tuple(c for c in mine if c.holding),
        waiters=queue_order((c for c in mine if not c.holding), wall),
    )


def may_take(view: TargetSlots, me: Claim, wall: float) -> tuple[bool, str]:
    """Whether ``me`` (a waiter, or a job about to ask) may take a slot now, and why."""
    if any(c.owner == me.owner for c in view.holders):
        return True, "already holds a slot"
    if view.free <= 0:
        return False, f"all {view.cap} slot(s) on {view.target} held"
    queue = queue_order([*(c for c in view.waiters if c.owner != me.owner), me], wall)
    rank = next(i for i, c in enumerate(queue) if c.owner == me.owner)
    if rank < view.free:
        return True, f"slot {len(view.holders) + 1} of {view.cap} on {view.target}"
    return False, f"{rank} job(s) with more work at risk wait for {view.free} free slot(s)"


def releases_needed(view: TargetSlots, owner: tuple[str, str]) -> int:
    """How many claims on ``view``'s target must go (a holder's release, a waiter ahead
    giving up or dying) before the waiter ``owner`` can be eligible: its place among the
    waiters less the free slots, plus one (1 at least, and 1 for a claim not queued).

    A grant to a waiter ahead leaves that gap as it was (one slot fewer free, one waiter
    fewer ahead); a new claim ahead only makes it bigger. So a waiter that counts the
    deletions on its target wakes no later than its turn, and those far back in a
    storm's queue sleep through the releases that cannot concern them (issue 35)."""
    place = next((i for i, c in enumerate(view.waiters) if c.owner == owner), None)
    return 1 if place is None else max(1, place - view.free + 1)


def place_in_line(view: TargetSlots, me: Claim, wall: float) -> int | None:
    """``me``'s place among the waiters that may take a free slot now (0: first), or
    ``None`` when it may not take one (or holds one already)."""
    if view.free <= 0 or any(c.owner == me.owner for c in view.holders):
        return None
    queue = queue_order([*(c for c in view.waiters if c.owner != me.owner), me], wall)
    rank = next(i for i, c in enumerate(queue) if c.owner == me.owner)
    return rank if rank < view.free else None


@dataclass(frozen=True, slots=True)
class Want:
    """A job of this host wants a slot on ``target`` (the daemon's side of a claim)."""

    target: str
    cap: int
    at_risk_gpu_s: float
    gpus: int
    stamped: float


@dataclass(frozen=True, slots=True)
class SlotsState:
    """The outcome of one :meth:`SlotTable.sync`."""

    targets: Mapping[str, TargetSlots]
    granted: frozenset[str]  # this host's jobs that hold a slot
    waiting: frozenset[str]  # this host's jobs queued for one
    new_grants: int = 0
    conflicts: int = 0


class SlotTable:
    """Makes this host's claims in etcd match what its jobs want; raises the session's
    :class:`~adaptd.fleet.session.FleetError` subclasses."""

    def __init__(
        self,
        session: EtcdSession,
        *,
        marked: str | None = None,
        pause: Callable[[float], object] = time.sleep,
    ) -> None:
        """``marked``: a prefix whose :class:`~adaptd.fleet.session.Mark` each
        :meth:`read` also takes, in the same request, into :attr:`mark` (the agent marks
        the members: a host came or went). ``pause``: how a waiter not first in line
        waits its turn (``TAKE_STAGGER_S``; the agent's can be cut short by its stop)."""
        self.session = session
        self.pause = pause
        self._marked = marked
        self.mark: Mark | None = None
        #: The members' newest create revision when every member up takes slots per
        #: target (set by the agent from its members' view), else ``None``: a grant
        #: compares its target's grant key alone only while the members :meth:`read`
        #: marks are those (see the module's *Mixed fleets*).
        self.per_target_through: int | None = None
        #: The same, when every member up takes numbered slots: a grant then compares
        #: its slot's key alone (and rewrites no grant key).
        self.numbered_through: int | None = None
        #: The numbered slots held on each target as of the newest :meth:`read`, and
        #: those this daemon took since.
        self._slots: dict[str, set[int]] = {}
        #: Each target's grant key's ``mod_revision`` as of the newest :meth:`read`.
        self._grant_revs: dict[str, int] = {}
        self.keys = session.keys
        self.host = session.settings.host
        #: When this daemon first saw each claim (its monotonic clock), by claim.
        self._first_seen: dict[tuple[str, str, str, int], float] = {}
        #: etcd's revision of the newest :meth:`read`: a watch from the next one misses
        #: no change made since.
        self.read_revision = 0
        #: Since when (this daemon's monotonic clock) each other waiter has been in line
        #: for a free slot in its view, by (host, target, job): see ``PATIENCE_S``.
        self._in_line: dict[tuple[str, str, str, int], float] = {}
        #: The holder :meth:`try_take` made last (its claim, naming its slot).
        self.taken: Claim | None = None

    def view(self, claims: Iterable[Claim], target: str, cap: int, wall: float) -> TargetSlots:
        """:func:`target_view` less the waiters that were in line for a free slot for
        ``PATIENCE_S`` without taking it (they stay in etcd, and take when they can)."""
        view = target_view(claims, target, cap, wall)
        stalled = {
            c.owner
            for c in view.waiters
            if c.host != self.host
            and wall - self._in_line.get((c.host, target, c.job, c.create_revision), wall)
            >= PATIENCE_S
        }
        if not stalled:
            return view
        return replace(view, waiters=tuple(c for c in view.waiters if c.owner not in stalled))

    def _note_in_line(self, claims: Iterable[Claim], wall: float) -> None:
        """Remember since when each other waiter has been in line for a free slot."""
        claims = list(claims)
        seen: dict[tuple[str, str, str], float] = {}
        for target in {c.target for c in claims}:
            full = target_view(claims, target, 1 << 30, wall)
            cap = min(c.cap for c in claims if c.target == target)
            free = max(0, cap - len(full.holders))
            for c in full.waiters[:free]:
                key = (c.host, target, c.job, c.create_revision)
                if c.host != self.host:
                    seen[key] = self._in_line.get(key, wall)
        self._in_line = seen

    def sync(self, wants: Mapping[str, Want], wall: float) -> SlotsState:
        """One round: release claims no job wants, queue new wishes, take the slots
        this host's waiters may take. ``wall``: now on this daemon's monotonic clock,
        the clock of its wants' stamps (claims compare work at risk across hosts)."""
        grants = conflicts = 0
        claims, seen = self.read(wall)
        for c in [c for c in claims if c.host == self.host]:
            w = wants.get(c.job)
            if w is None or w.target != c.target:
                self._drop(c)
                claims.remove(c)
        staggered = False
        for _attempt in range(MAX_ATTEMPTS):
            retry = False
            for job, w in sorted(wants.items(), key=lambda kv: -kv[1].at_risk_gpu_s):
                mine = next(
                    (c for c in claims if c.owner == (self.host, job) and c.target == w.target),
                    None,
                )
                if mine is not None and mine.holding:
                    continue
                me = mine or Claim(
                    self.host, w.target, job, False, w.at_risk_gpu_s, w.gpus, w.stamped, w.cap
                )
                if mine is None:
                    # queue first, take after: a take compares every claim, so takes
                    # from members just arriving failed on each other's new claims
                    # (issue 35: 18.7 conflicts per grant at a 200-member storm's start)
                    key = self.keys.claim(self.host, w.target, job)
                    self.session.put(key, me.record(), leased=True)
                    revision = self.session.revision  # the claim's create revision
                    self._first_seen[(self.host, w.target, job, revision)] = wall
                    claims.append(replace(me, stamped=wall, create_revision=revision))
                    view = self.view(claims, w.target, w.cap, wall)
                    if place_in_line(view, claims[-1], wall) is not None:
                        claims, seen = self.read(wall)  # its turn: take, on what is there now
                        retry = True
                        break
                    continue
                place = place_in_line(self.view(claims, me.target, me.cap, wall), me, wall)
                if place and not staggered and not self.numbered:
                    # the ones ahead take theirs first; then decide again on what they did
                    staggered = True
                    self.pause(min(place * TAKE_STAGGER_S, MAX_STAGGER_S))
                    claims, seen = self.read(wall)
                    retry = True
                    break
                taken = self.try_take(me, claims, seen, wall)
                if taken is None:  # another daemon moved first: re-read, decide again
                    conflicts += 1
                    retry = True
                    claims, seen = self.read(wall)
                    break
                # what this host wrote is known without reading it back (issue 35: a
                # read per write doubled each waiter's reads of the whole queue)
                if taken:
                    held = self.taken
                    assert held is not None
                    grants += 1
                    log.info(logfmt("fleet_slot_granted", job=job, target=w.target,
                                    slot=held.slot))  # fmt: skip
                    claims = [c for c in claims if c.owner != me.owner or c.target != me.target]
                    claims.append(held)
                    if not self.per_target:
                        # nothing changed between ``seen`` and the transaction (its
                        # compare): the claims are whole as of its revision. A per-target
                        # grant says nothing of the other claims: a watch goes on from
                        # the read, so no release since it is missed.
                        seen = self.read_revision = self.session.revision
            if not retry:
                break
        return self._state(claims, wants, wall, grants, conflicts)

    def try_take(self, me: Claim, claims: list[Claim], seen: int, wall: float) -> bool | None:
        """Turn ``me`` into a holder of a numbered slot if :func:`may_take` allows it on
        the ``claims`` read at revision ``seen``: True (taken; ``me``'s slot is in
        :attr:`taken`), False (not its turn), ``None`` (another daemon took that slot,
        or moved first under an older member's rule: re-read and decide again)."""
        view = self.view(claims, me.target, me.cap, wall)
        place = place_in_line(view, me, wall)
        if place is None:
            return False
        held_numbers = self._slots.get(me.target, set())
        free = [k for k in range(view.cap) if k not in held_numbers]
        if place >= len(free):  # holders' keys fill the numbers (a cap lowered since)
            return False
        k = free[place]
        held = replace(me, holding=True, slot=k)
        slot_key = self.keys.slot(me.target, k)
        who = json.dumps({"host": me.host, "job": me.job}).encode()
        puts = [
            Put(self.keys.claim(me.host, me.target, me.job), held.record(), leased=True),
            Put(slot_key, who, leased=True),
        ]
        guards = [Guard.key_at(slot_key, 0)]
        if self.numbered:
            assert self._marked is not None and self.numbered_through is not None
            guards.append(Guard.none_created_since(self._marked, self.numbered_through))
        else:  # an older member is up: take its way as well, so each excludes the other
            grant_key = self.keys.grant(me.target)
            puts.append(Put(grant_key, who, leased=True))
            if self.per_target:
                assert self._marked is not None and self.per_target_through is not None
                guards += [
                    Guard.key_at(grant_key, self._grant_revs.get(me.target, 0)),
                    Guard.none_created_since(self._marked, self.per_target_through),
                ]
            else:
                guards.append(Guard.range_since(self.keys.claims, seen))
        if not self.session.put_all_if(puts, guards):
            return None
        if not self.numbered:
            self._grant_revs[me.target] = self.session.revision
        self._slots.setdefault(me.target, set()).add(k)
        self.taken = held
        return True

    @property
    def numbered(self) -> bool:
        """Whether a grant now compares its slot's key alone: every member up takes
        numbered slots, as of the members the newest :meth:`read` marked."""
        return (
            self.numbered_through is not None
            and self.mark is not None
            and self.mark.newest == self.numbered_through
        )

    @property
    def per_target(self) -> bool:
        """Whether a grant now compares its target's grant key alone: every member up
        takes slots that way, as of the members the newest :meth:`read` marked."""
        return (
            self.per_target_through is not None
            and self.mark is not None
            and self.mark.newest == self.per_target_through
        )

    def release_all(self) -> None:
        """Delete every claim of this host (a clean stop; a crash leaves it to the lease)."""
        for c in self.read()[0]:
            if c.host == self.host:
                self._drop(c)

    def _drop(self, c: Claim) -> None:
        """Delete this host's claim ``c``, and with a holder's its slot key, in one
        transaction: a slot key left behind would hold the slot for as long as this
        daemon lives. Only if the claim is still the one read (its create revision): a
        claim gone with an expired lease, and its slot since taken by another host,
        leaves that host's key alone."""
        claim_key = self.keys.claim(self.host, c.target, c.job)
        if c.slot is None:
            self.session.delete(claim_key)
            return
        self.session.delete_all_if(
            [claim_key, self.keys.slot(c.target, c.slot)],
            [Guard.created_at(claim_key, c.create_revision)],
        )

    def read(self, now: float | None = None) -> tuple[list[Claim], int]:
        """Every claim in the fleet, and the revision to compare against when acting on them.

        With ``now`` (this daemon's monotonic clock, the session's), each claim's
        ``stamped`` is when this daemon first heard of the claim's create revision
        (:class:`~adaptd.fleet.session.HeardAt`), so the growth of work at risk is
        measured on one clock. The owners' stamps came from their wall clocks: with
        hosts' clocks 30 s apart, each daemon put the other's claim behind its own (or
        ahead), both waited for the other, and a free slot stayed unused for 26 s
        (tests/fleet/test_fleet_matrix.py). Dated by revision, a claim is as old to
        every daemon as it is, up to the gap between two of that daemon's calls, however
        long ago the daemon last read the queue: a waiter reads it on its turn and every
        ``QUEUE_EVERY_S`` (:mod:`adaptd.fleet.agent`), not every 10 s (issue 35: a
        daemon that dated a claim by when it first *read* it saw a long-waiting job as
        new, and a small job took the slot of a big one that had passed it in line).
        """
        (entries, grants), mark = self.session.get_prefixes_marking(
            [self.keys.claims, self.keys.grants], self._marked
        )
        if mark is not None:
            self.mark = mark
        self.read_revision = self.session.revision
        self._grant_revs, self._slots = {}, {}
        for e in grants:
            target = self.keys.grant_target(e.key)
            if target is not None:
                self._grant_revs[target] = e.mod_revision
            elif (slot := self.keys.slot_parts(e.key)) is not None:
                self._slots.setdefault(slot[0], set()).add(slot[1])
        claims = parse_claims(entries, self.keys)
        if now is not None:
            first: dict[tuple[str, str, str, int], float] = {}
            heard = self.session.heard_at
            for i, c in enumerate(claims):
                key = (c.host, c.target, c.job, c.create_revision)
                if key not in self._first_seen:
                    at = heard.dated(c.create_revision)
                    self._first_seen[key] = now if at is None else min(at, now)
                first[key] = self._first_seen[key]
                claims[i] = replace(c, stamped=first[key])
            self._first_seen = first
            self._note_in_line(claims, now)
        return claims, newest_revision(entries)

    def _state(
        self,
        claims: list[Claim],
        wants: Mapping[str, Want],
        wall: float,
        grants: int,
        conflicts: int,
    ) -> SlotsState:
        caps = {w.target: w.cap for w in wants.values()}
        for c in claims:
            caps.setdefault(c.target, c.cap)
        mine = [c for c in claims if c.host == self.host and c.job in wants]
        return SlotsState(
            targets={t: self.view(claims, t, cap, wall) for t, cap in sorted(caps.items())},
            granted=frozenset(c.job for c in mine if c.holding),
            waiting=frozenset(c.job for c in mine if not c.holding),
            new_grants=grants,
            conflicts=conflicts,
        )
