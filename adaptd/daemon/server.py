"""The daemon's loop: one thread, one poller, each message handed to the part that owns it.

:class:`Daemon` owns no logic of its own beyond the loop. Its parts
(:class:`~adaptd.daemon.assembly.DaemonParts`, built by :mod:`adaptd.daemon.assembly`) do the work:

- :class:`~adaptd.daemon.transport.Transport`: the job socket (``ipc://`` per
  :mod:`adaptd.protocol.paths`, or ``tcp://`` with CURVE), the admin socket beside it, the
  lock file, the wake-up pipe;
- :class:`~adaptd.daemon.jobs.handler.JobHandler`: each job message validated, checked
  against the connection's credentials, and handed to the
  :class:`~adaptd.daemon.jobs.registry.Registry` and the
  :class:`~adaptd.daemon.jobs.planner.Planner`, which
  pushes a new plan to all the job's ranks when the saves change;
- :class:`~adaptd.daemon.admin.handler.AdminHandler`: operator requests (status, save-now,
  drain, set-policy, pause), with :class:`~adaptd.daemon.admin.drains.Drains` and
  :class:`~adaptd.daemon.admin.status.StatusView`;
- :class:`~adaptd.daemon.events.EventBus`: every fact learned goes to the sinks (store,
  metrics, replicator; see :mod:`adaptd.daemon.events`).

About once a second the loop calls :meth:`Daemon.tick`: liveness, then the tick hooks
(telemetry sampling, the service's persistence and watchdog). Nothing in the loop
may block: it waits on nothing but its poller, whose timeout is the next tick or the
next drain deadline.

The daemon runs in the calling thread (:meth:`Daemon.serve`, used by ``adaptd
serve`` with signals wired to :meth:`Daemon.stop`) or in its own thread
(:meth:`Daemon.start`, for the demo and tests).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import zmq

from adaptd.config.schema import LIVENESS_TIMEOUT_S
from adaptd.core import policy as policy_mod
from adaptd.core.snapshot import Snapshot, same_saves
from adaptd.daemon import events as ev
from adaptd.daemon.admin.handler import admin_gid
from adaptd.daemon.admin.status import ReplicationSource, StatusExtra
from adaptd.daemon.assembly import TICK_INTERVAL_S, DaemonParts, TickHook, snapshot_now
from adaptd.daemon.assembly import parts as build_parts
from adaptd.daemon.jobs.handler import RESEND_AFTER_S
from adaptd.daemon.jobs.planner import REPLAN_TOLERANCE
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.settings import ConfiguredSettings
from adaptd.daemon.logfmt import Throttle, logfmt
from adaptd.daemon.transport import HARD_MAX_FRAME, CurveKeys, DaemonError, Transport
from adaptd.protocol import admin

# Also importable from here, as before the daemon was split: the frame limit, the
# CURVE keys and the start-up error (adaptd.daemon.transport), and same_saves
# (adaptd.core.snapshot).
__all__ = [
    "HARD_MAX_FRAME",
    "CurveKeys",
    "Daemon",
    "DaemonError",
    "same_saves",
]

log = logging.getLogger("adaptd.server")


class Daemon:
    """The adaptd daemon. Construct, then :meth:`serve` (blocking) or :meth:`start` (thread).

    ``Daemon(socket, policy=..., sinks=..., ...)`` checks each argument and builds its
    parts with :func:`adaptd.daemon.assembly.parts`; ``Daemon(parts=...)`` runs parts built
    elsewhere (``adaptd serve`` builds them from its validated config; the other
    arguments are then not used). Raises
    :class:`DaemonError` from the constructor for a bad argument, and from
    :meth:`open` when the socket is held by another live daemon or cannot be bound.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        policy: str = policy_mod.DEFAULT_SPEC,
        snapshot_source: Callable[[], Snapshot] = snapshot_now,
        sinks: Iterable[ev.Sink] = (),
        tick_hooks: Iterable[TickHook] = (),
        silence_timeout_s: float = LIVENESS_TIMEOUT_S,
        resend_after_s: float = RESEND_AFTER_S,
        tick_interval_s: float = TICK_INTERVAL_S,
        replan_tolerance: float = REPLAN_TOLERANCE,
        clock: Callable[[], float] = time.monotonic,
        job_settings: Mapping[str, admin.JobSettings] | None = None,
        status_extra: StatusExtra | None = None,
        config_settings: ConfiguredSettings | None = None,
        replication_source: ReplicationSource | None = None,
        curve: CurveKeys | None = None,
        admin_group: str | None = None,
        parts: DaemonParts | None = None,
    ) -> None:
        if parts is None:  # today's keyword arguments: check each, then build the parts
            try:
                policy_mod.parse(policy)
            except policy_mod.PolicyError as exc:
                raise DaemonError(f"--policy {policy!r}: {exc}") from None
            if not silence_timeout_s > 0:
                raise DaemonError(f"--silence-timeout must be > 0 seconds, got {silence_timeout_s}")
            if not 0 <= replan_tolerance < 1:
                raise DaemonError(f"replan_tolerance must be in [0, 1), got {replan_tolerance}")
            events = ev.EventBus(sinks)
            parts = build_parts(
                Transport(socket, curve=curve, clock=clock),
                events=events,
                registry=Registry(emit=events, silence_timeout_s=silence_timeout_s),
                default_spec=policy,
                snapshot_source=snapshot_source,
                tick_hooks=tick_hooks,
                job_settings=job_settings,
                config_settings=config_settings,
                status_extra=status_extra,
                replication_source=replication_source,
                admin_group_id=admin_gid(admin_group),
                resend_after_s=resend_after_s,
                tick_interval_s=tick_interval_s,
                replan_tolerance=replan_tolerance,
                clock=clock,
            )
        self.parts = parts
        self.transport = parts.transport
        self.events = parts.events
        self.registry: Registry = parts.registry
        self.stats = parts.stats
        self.clock = parts.clock
        self.tick_hooks = parts.tick_hooks
        self.tick_interval_s = parts.tick_interval_s
        self._throttle = Throttle()
        self._stopping = threading.Event()
        self._stop_requested = False
        self._stop_drain_s = 0.0
        self._tick_soon = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ what others read

    @property
    def endpoint(self) -> str:
        return self.transport.endpoint

    @property
    def socket_path(self) -> Path:
        return self.transport.socket_path

    @property
    def admin_path(self) -> Path:
        return self.transport.admin_path

    @property
    def tcp(self) -> str | None:
        return self.transport.tcp

    @property
    def wakeup_fd(self) -> int:
        """A non-blocking fd for :func:`signal.set_wakeup_fd`: a signal wakes the poll."""
        return self.transport.wakeup_fd

    @property
    def counters(self) -> Counter[str]:
        return self.stats.counters

    @property
    def rejected(self) -> Counter[str]:
        return self.stats.rejected

    @property
    def by_kind(self) -> Counter[str]:
        return self.stats.by_kind

    @property
    def job_settings(self) -> Mapping[str, admin.JobSettings]:
        """The operators' settings by job id, read-only."""
        return self.parts.settings.as_mapping()

    def status(self, now: float | None = None) -> admin.StatusReply:
        """What ``adaptd status`` shows: every job and the daemon's counters."""
        return self.parts.status.status(self.clock() if now is None else now)

    def emit(self, event: ev.Event) -> None:
        """Hand ``event`` to every sink (:meth:`adaptd.daemon.events.EventBus.emit`)."""
        self.events.emit(event)

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Take the lock, bind both sockets. Raises :class:`DaemonError`."""
        if self.transport.is_open:
            return
        self.transport.open()
        log.info(
            logfmt(
                "listening",
                socket=self.endpoint,
                admin=self.admin_path,
                policy=self.parts.planner.default_spec,
                pid=os.getpid(),
            )
        )

    def serve(self) -> None:
        """Open (if needed) and run the loop in this thread until :meth:`stop`; then close."""
        self.open()
        try:
            self._loop()
        finally:
            self.close()

    def start(self, timeout_s: float = 10.0) -> Daemon:
        """Run the daemon in a background thread; returns once it is serving.

        Raises :class:`DaemonError` (from :meth:`open`) in the caller's thread.
        """
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            try:
                self.open()
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            try:
                self._loop()
            finally:
                self.close()

        self._thread = threading.Thread(target=main, name="adaptd-daemon", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise DaemonError(f"the daemon did not start within {timeout_s:g}s")
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def stop(self, timeout_s: float | None = 10.0, drain_s: float = 0.0) -> None:
        """Ask the loop to end (safe from signal handlers and other threads).

        With ``drain_s`` > 0 the daemon first sends SaveNow (reason ``shutdown``) to
        every live job and keeps serving until each of those saves is reported
        durable (or failed, or its job gone) or ``drain_s`` has passed, then ends.
        A second call while that drain runs ends the loop at once (a second SIGTERM
        or Ctrl-C means "now").

        From another thread it also waits up to ``timeout_s`` (plus ``drain_s``) for
        the daemon thread.
        """
        if drain_s > 0 and not self._stop_requested and not self._stopping.is_set():
            self._stop_drain_s = drain_s
            self._stop_requested = True
        else:
            self._stopping.set()
        self.transport.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread() and timeout_s is not None:
            t.join(timeout_s + max(0.0, drain_s))

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def close(self) -> None:
        """Close the sockets, remove their files, release the lock."""
        if not self.transport.is_open:
            return
        self.transport.close()
        log.info(logfmt("stopped", socket=self.endpoint))

    # ------------------------------------------------------------------ loop

    def _loop(self) -> None:
        transport, drains = self.transport, self.parts.drains
        next_tick = self.clock() + self.tick_interval_s
        while not self._stopping.is_set():
            if self._stop_requested and not drains.shutting_down:
                now = self.clock()
                drains.start(None, self._stop_drain_s, "shutdown", now)
                drains.check(now)
                if drains.shutdown_over:
                    break
                continue
            wake_at = drains.next_deadline(next_tick)
            timeout_ms = max(0, int((wake_at - self.clock()) * 1000) + 1)
            jobs_ready, admin_ready = transport.poll(timeout_ms)
            if self._stopping.is_set():
                break
            if jobs_ready:
                self._handle(transport.job_frames(), self.parts.jobs.on_frames)
            if admin_ready:
                self._handle(transport.admin_frames(), self.parts.admin.on_frames)
            now = self.clock()
            if now >= next_tick or self._tick_soon:
                self._tick_soon = False
                self.tick(now)
                next_tick = now + self.tick_interval_s
            if drains:
                drains.check(now)
            if drains.shutdown_over:
                break

    def tick_soon(self) -> None:
        """Run the tick hooks at once instead of at the next second (safe from any
        thread: the fleet's thread calls it when a write slot is granted)."""
        self._tick_soon = True
        self.transport.wake()

    def _handle(
        self, batch: Iterable[list[zmq.Frame]], handle: Callable[[list[zmq.Frame]], None]
    ) -> None:
        for frames in batch:
            try:
                handle(frames)
            except Exception:  # a bug in one message's handling must not end the daemon
                self.stats.counters["internal_errors"] += 1
                log.exception(logfmt("internal_error", parts=len(frames)))

    def tick(self, now: float) -> None:
        """Once a second: liveness, the agreement rounds that a lost rank or the time
        decides, then the tick hooks (each guarded)."""
        self.registry.check(now)
        self.parts.agreements.tick(self.registry, now)
        for hook in self.tick_hooks:
            try:
                hook(now)
            except Exception:
                self.stats.counters["tick_errors"] += 1
                if self._throttle(f"tick:{getattr(hook, '__name__', hook)!s}"):
                    log.exception(logfmt("tick_hook_failed", hook=hook))
