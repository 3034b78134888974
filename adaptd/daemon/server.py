"""The daemon's loop: one thread, one poller, each message handed to the part that owns it.

:class:`Daemon` owns no logic of its own beyond the loop. Its parts
(:class:`~adaptd.daemon.parts.DaemonParts`, wired by :func:`adaptd.daemon.assembly.build`,
the one place a daemon is put together) do the work:

- :class:`~adaptd.daemon.transport.Transport`: the job socket (``ipc://`` per
  :mod:`adaptd.protocol.paths`, or ``tcp://`` with CURVE), the admin socket beside it, the
  lock file, the wake-up pipe;
- :class:`~adaptd.daemon.jobs.handler.JobHandler`: each job message validated, checked
  against the connection's credentials, and handed to the
  :class:`~adaptd.daemon.jobs.registry.Registry` and the
  :class:`~adaptd.daemon.jobs.planner.Planner`, whose decisions the
  :class:`~adaptd.daemon.jobs.delivery.Delivery` tells the job's ranks (at once, or
  agreed in rounds);
- :class:`~adaptd.daemon.admin.handler.AdminHandler`: operator requests (status, save-now,
  drain, set-policy, pause), with :class:`~adaptd.daemon.admin.drains.Drains` and
  :class:`~adaptd.daemon.admin.status.StatusView`;
- :class:`~adaptd.events.EventBus`: every fact learned goes to the sinks (store,
  metrics, replicator; see :mod:`adaptd.events`).

About once a second the loop calls :meth:`Daemon.tick`: liveness, the agreement rounds,
then the tick hooks (telemetry sampling, the service's persistence and watchdog).
Nothing in the loop may block: it waits on nothing but its poller, whose timeout is the
next tick or the next drain deadline.

The daemon runs in the calling thread (:meth:`Daemon.serve`, used by ``adaptd
serve`` with signals wired to :meth:`Daemon.stop`) or in its own thread
(:meth:`Daemon.start`, for the demo and tests).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import zmq

from adaptd import events as ev
from adaptd.core.snapshot import same_saves
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.parts import DaemonParts
from adaptd.daemon.transport import HARD_MAX_FRAME, CurveKeys, DaemonError
from adaptd.logfmt import Throttle, logfmt
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
    """The adaptd daemon. Build with :func:`adaptd.daemon.assembly.build`, then
    :meth:`serve` (blocking) or :meth:`start` (thread).

    Raises :class:`DaemonError` from :meth:`open` when the socket is held by another
    live daemon or cannot be bound.
    """

    def __init__(self, parts: DaemonParts) -> None:
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
        """Hand ``event`` to every sink (:meth:`adaptd.events.EventBus.emit`)."""
        self.events.emit(event)

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Take the lock, bind both sockets. Raises :class:`DaemonError`."""
        if self.transport.is_open:
            return
        self.transport.open()
        log.info(logfmt("listening", socket=self.endpoint, admin=self.admin_path,
                        policy=self.parts.choice.default_policy, pid=os.getpid()))  # fmt: skip

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
            if self.transport.waker.take_tick_soon() or now >= next_tick:
                self.tick(now)
                next_tick = now + self.tick_interval_s
            if drains:
                drains.check(now)
            if drains.shutdown_over:
                break

    def tick_soon(self) -> None:
        """Run the tick hooks at once instead of at the next second (safe from any
        thread: the fleet's thread calls it when a write slot is granted)."""
        self.transport.waker.tick_soon()

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
        decides, the tick hooks (each guarded), then the jobs they asked to have
        decided again at once (``decide_again``: a job just granted a write slot)."""
        self.registry.check(now)
        self.parts.delivery.tick(self.registry, now)
        self._guarded(self._decide_reported, now)
        for hook in self.tick_hooks:
            self._guarded(hook, now)
        if self.parts.decide_again is not None:
            self._guarded(self._decide_again, now)

    def _decide_reported(self, now: float) -> None:
        self.parts.planner.decide_reported(self.registry.jobs.values(), now)

    def _decide_again(self, now: float) -> None:
        assert self.parts.decide_again is not None
        for job_id in self.parts.decide_again():
            job = self.registry.jobs.get(job_id)
            if job is not None:
                self.parts.planner.decide(job, now)

    def _guarded(self, hook: Callable[[float], None], now: float) -> None:
        try:
            hook(now)
        except Exception:
            self.stats.counters["tick_errors"] += 1
            if self._throttle(f"tick:{getattr(hook, '__name__', hook)!s}"):
                log.exception(logfmt("tick_hook_failed", hook=hook))
