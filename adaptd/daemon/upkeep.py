"""What ``adaptd serve`` keeps up to date around its daemon: state, metrics, systemd.

:class:`Upkeep` is two things the service gives its daemon:

- a sink of its events (:meth:`Upkeep.on_event`): an operator's settings change is
  written through to the state database and shown in the metrics; a refused message is
  counted in the metrics; a job's learned costs are queued at each of its counted save
  reports, and the failure rate at each failure, so a SIGKILLed daemon loses at most
  the last tick of them (tests/faults/test_daemon_crash.py);
- a tick hook (:meth:`Upkeep.tick`, about once a second in the daemon's loop): persist
  everything learned every :data:`PERSIST_EVERY_S`, flush the store, feed the metrics
  the newest snapshot and the store's fault counters, send the fleet its slot wishes,
  update systemd's ``STATUS=`` and ping its watchdog; while stopping, ask systemd for
  :data:`EXTEND_BY_S` more each tick.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from adaptd import events as ev
from adaptd.core.snapshot import Snapshot
from adaptd.daemon.jobs.table import RegistryView
from adaptd.daemon.sdnotify import Notifier
from adaptd.metrics.exporter import Metrics
from adaptd.state.learned import Learned
from adaptd.state.store import Store

if TYPE_CHECKING:
    from adaptd.fleet.part import FleetPart

__all__ = ["EXTEND_BY_S", "PERSIST_EVERY_S", "Upkeep"]

#: Learned parameters (failure rate, each job's costs) are written this often, and at exit.
PERSIST_EVERY_S = 30.0
#: While draining on SIGTERM, each tick asks systemd for this much more time.
EXTEND_BY_S = 10.0


class Upkeep:
    """The service's sink and tick hook. ``stopping``: set once shutdown began;
    ``watchdog``: ping systemd's watchdog (``daemon.watchdog``)."""

    def __init__(
        self,
        *,
        store: Store,
        learned: Learned,
        metrics: Metrics,
        jobs: RegistryView,
        snapshot: Callable[[], Snapshot],
        notifier: Notifier,
        stopping: threading.Event,
        watchdog: bool,
        fleet: FleetPart | None = None,
    ) -> None:
        self.store = store
        self.learned = learned
        self.metrics = metrics
        self.jobs = jobs
        self.snapshot = snapshot
        self.notifier = notifier
        self.stopping = stopping
        self.watchdog = watchdog
        self.fleet = fleet
        self._last_persist: float | None = None
        self.status_text = self.jobs_text()

    # ------------------------------------------------------------------ the sink

    def on_event(self, event: ev.Event) -> None:
        """Operator settings changes (durable in the store, visible in metrics) and
        refused messages (counted in metrics by code); a job's learned costs queued."""
        if isinstance(event, ev.MessageRejected):
            self.metrics.on_rejected(event.code)
        elif isinstance(event, ev.JobSettingsChanged):
            self.store.set_job_setting(event.job, policy=event.policy, paused=event.paused)
            self.metrics.set_paused(event.job, event.paused)
        elif (
            isinstance(event, ev.JobRegistered)
            and (s := self.store.job_setting(event.job)) is not None
        ):
            # metrics.on_event reset the job's paused gauge; the operator's flag wins
            self.metrics.set_paused(event.job, s.paused)
        # Written as it is learned, not only every PERSIST_EVERY_S and at exit: a
        # SIGKILLed daemon never reaches its exit (tests/faults/test_daemon_crash.py).
        if isinstance(event, ev.SaveReported) and event.counted:
            self.learned.keep_job(event.job, self.jobs.learned_of(event.job), failure=False)
        elif isinstance(event, ev.JobResumed):
            self.learned.keep_job(event.job, self.jobs.learned_of(event.job), failure=True)

    # ------------------------------------------------------------------ the tick

    def tick(self, now: float) -> None:
        """The daemon's tick hook (see the module docstring)."""
        if self._last_persist is None or now - self._last_persist >= PERSIST_EVERY_S:
            self.persist_learned()
            self._last_persist = now
        self.store.flush()
        snapshot = self.snapshot()
        self.metrics.on_snapshot(snapshot)
        self.metrics.expire(now)  # ended jobs' series, once their grace period is over
        if self.fleet is not None:
            self.fleet.tick(now, snapshot)
        self.metrics.set_state_stats(
            write_errors=self.store.write_errors, dropped_rows=self.store.dropped
        )
        text = self.jobs_text()
        if self.stopping.is_set():
            self.notifier.extend_timeout(EXTEND_BY_S)
        elif text != self.status_text:
            self.status_text = text
            self.notifier.status(text)
        if self.watchdog:
            self.notifier.tick(now)

    def ready(self, now: float, serving: str) -> None:
        """The daemon serves from ``now`` (``serving``: where): ``READY=1`` to systemd with
        the jobs' line; the next persist is :data:`PERSIST_EVERY_S` on."""
        self._last_persist = now
        self.status_text = self.jobs_text()
        self.notifier.ready(f"{serving}; {self.status_text}")

    def persist_learned(self) -> None:
        """Queue the failure-rate posterior and every known job's learned costs."""
        self.learned.keep_all(self.jobs.learned())
        if self.fleet is not None:
            self.fleet.persist()

    def jobs_text(self) -> str:
        return f"{self.jobs.active} jobs connected, {self.jobs.lost} lost"
