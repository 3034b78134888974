"""The daemon's fleet member: one thread that does all of the daemon's etcd I/O.

The daemon's loop never waits on etcd. It tells the agent what its jobs want
(:meth:`FleetAgent.want` a slot, :meth:`FleetAgent.release` it, :meth:`FleetAgent.publish`
what it learned about failures) and reads the newest :class:`FleetView`, a frozen
set of facts, whenever it decides. The agent's thread, every ``poll_s``:

1. opens a session if it has none (grants a lease, registers the host);
2. renews the lease every TTL/3;
3. reads the members, syncs this host's slot claims (:class:`~adaptd.fleet.slots.SlotTable`),
   writes the failure records handed to it, and re-reads the fleet's every
   ``failures_every_s``;
4. publishes a new :class:`FleetView`.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from adaptd.fleet.failures import FailureRecord, publish, read_records
from adaptd.fleet.membership import Member, read_members, register
from adaptd.fleet.session import (
    EtcdSession,
    FleetAuthError,
    FleetError,
    FleetSettings,
    LeaseLost,
)
from adaptd.fleet.slots import SlotTable, TargetSlots, Want
from adaptd.logfmt import logfmt

log = logging.getLogger("adaptd.fleet")

#: While a job of this host waits for a slot, the agent watches the claims (for at most
#: this long at a time) instead of sleeping a poll interval; a local want or release
#: interrupts the watch.
WATCH_S = 2.0


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
    granted: frozenset[str] = frozenset()  # this host's jobs holding a slot
    waiting: frozenset[str] = frozenset()  # this host's jobs queued for one
    records: tuple[FailureRecord, ...] = ()
    records_at: float | None = None  # monotonic time ``records`` were read
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
        failures_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        version: str = "",
        on_grant: Callable[[], None] | None = None,
    ) -> None:
        """``on_grant`` is called (from the agent's thread) when a job of this host was
        just granted a slot, or lost one (its lease expired): the daemon decides again at
        once instead of at its tick."""
        if not 0 < poll_s <= settings.lease_ttl_s / 3:
            raise ValueError(
                f"fleet: poll_s must be > 0 and at most a third of the lease TTL "
                f"({settings.lease_ttl_s}s), got {poll_s}"
            )
        self.settings = settings
        self.poll_s = poll_s
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
        self._session: EtcdSession | None = None
        self._table: SlotTable | None = None
        self._sessions = 0
        self._next_keepalive = 0.0
        self._next_failures = 0.0
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
        while not self._stopping.is_set():
            view = self.poll_once()
            if view.up and view.waiting and self._session is not None and not self._wake.is_set():
                # a job of this host waits for a slot: wake at the first claim change
                # anywhere (a release), not at the next poll; a local want/release
                # waits at most WATCH_S
                with contextlib.suppress(FleetError):  # the next round says what is wrong
                    self._session.wait_for_change(self.settings.keys.claims, WATCH_S)
            else:
                self._wake.wait(self.poll_s if view.up else min(1.0, self.poll_s * 2))
            self._wake.clear()

    def poll_once(self) -> FleetView:
        """One round (the thread's body; tests may drive it directly)."""
        now = self.clock()
        try:
            try:
                view = self._round(now)
            except LeaseLost as exc:
                # etcd answered: it is there, only the lease is gone (it expired while this
                # process was stopped, or etcd was wiped). Open a new session in this round
                # instead of deciding locally meanwhile: a grant of the old lease is void,
                # and a local decision would let its job write beside the new holder.
                self._drop_session()
                log.warning(logfmt("fleet_lease_lost", host=self.settings.host, error=str(exc),
                                   held=",".join(sorted(self._view.granted)) or None))  # fmt: skip
                view = self._round(now)
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

    def _round(self, now: float) -> FleetView:
        s = self._session
        if s is None:
            s = EtcdSession(self.settings, clock=self.clock).open()
            register(s, Member(self.settings.host, os.getpid(), self.wall(), self.version))
            self._session, self._table = s, SlotTable(s)
            self._sessions += 1
            self._next_keepalive = now + self.settings.lease_ttl_s / 3
            self._next_failures = 0.0
        elif now >= self._next_keepalive:
            s.keepalive()
            self._next_keepalive = now + self.settings.lease_ttl_s / 3
        members = read_members(s)
        if members.role(self.settings.host) is None:  # our key went away (deleted by hand)
            register(s, Member(self.settings.host, os.getpid(), self.wall(), self.version))
            members = read_members(s)
        with self._lock:
            wants = dict(self._wants)
            to_publish = dict(self._to_publish)
        assert self._table is not None
        state = self._table.sync(wants, self.clock())  # one clock per daemon: monotonic
        for model, record in to_publish.items():
            publish(s, record)
            with self._lock:
                if self._to_publish.get(model) is record:
                    del self._to_publish[model]
        records, records_at = self._view.records, self._view.records_at
        if now >= self._next_failures or to_publish:
            found, skipped = read_records(s)
            records, records_at = tuple(found), now
            for line in skipped:
                log.warning(logfmt("fleet_record_skipped", error=line))
            self._next_failures = now + self.failures_every_s
        prev = self._view
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
            targets=state.targets,
            granted=state.granted,
            waiting=state.waiting,
            records=records,
            records_at=records_at,
            grants=prev.grants + state.new_grants,
            conflicts=prev.conflicts + state.conflicts,
            rejoins=max(0, self._sessions - 1),
        )

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
