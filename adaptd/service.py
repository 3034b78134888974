"""The daemon as ``adaptd serve`` runs it: every part built from one :class:`Config`.

:class:`Service` assembles, in this order (and closes in reverse):

1. the state database (:class:`adaptd.store.Store`), from which it restores the
   operator's per-job settings, the host's failure-rate posterior and each job's
   learned save/restore costs;
2. the :class:`adaptd.server.Daemon`, bound under a private umask and then given
   the configured socket modes and group (so the socket is never world-reachable,
   not even between bind and chmod);
3. the Prometheus endpoint (:class:`adaptd.metrics.Metrics`);
4. the telemetry :class:`~adaptd.telemetry.sampler.Sampler`, probed once before
   ``READY=1`` goes to systemd (:mod:`adaptd.sdnotify`);
5. when the config replicates checkpoints (``[destinations.NAME]`` and a job's
   ``replicate_to``), the :class:`~adaptd.tiers.replicator.Replicator`: a sink of the
   daemon's events, shown in ``adaptd status`` and the metrics, stopped first at close.

Its tick hook (about once a second, in the daemon's loop) flushes the store, feeds
metrics the newest snapshot and the store's fault counters, persists what was learned every
:data:`PERSIST_EVERY_S`, updates ``STATUS=`` and pings the watchdog. A job's learned
costs are also queued at each of its save reports, and the failure rate at each
failure, so a SIGKILLed daemon loses at most the last tick of them.

Raises :class:`ServiceError` (one line saying what to change) for any start-up
problem: state database, sockets, metrics address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import grp
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from adaptd import admin
from adaptd import events as ev
from adaptd.config import Config, StorageTarget
from adaptd.estimators import FailureRate, JobTracker
from adaptd.metrics import Metrics, MetricsError, MetricsServer
from adaptd.protocol import Hello
from adaptd.sdnotify import Notifier
from adaptd.server import CurveKeys, Daemon, DaemonError
from adaptd.snapshot import Snapshot, StorageSample
from adaptd.store import GLOBAL, Store, StoreError, job_scope

if TYPE_CHECKING:
    from adaptd.telemetry.sampler import Sampler
    from adaptd.tiers.replica import UploadResult
    from adaptd.tiers.replicator import Replicator

log = logging.getLogger("adaptd.service")

#: Learned parameters (failure rate, each job's costs) are written this often, and at exit.
PERSIST_EVERY_S = 30.0
#: Store keys of the learned parameters.
FAILURE_RATE_KEY = "failure_rate"
LEARNED_KEY = "learned"
#: While draining on SIGTERM, each tick asks systemd for this much more time.
EXTEND_BY_S = 10.0


def storage_limits(
    samples: Iterable[StorageSample], targets: Iterable[StorageTarget]
) -> dict[str, int]:
    """``[storage."NAME"] max_concurrent_saves`` by sampled storage target id.

    A configured path belongs to the sampled target whose mount point is the longest
    one containing it (the mount the path lives on); several configured paths on one
    mount give it the smallest of their limits. Paths on no sampled target (no job
    saves there yet) give nothing.
    """
    samples = tuple(samples)
    out: dict[str, int] = {}
    for t in targets:
        if t.max_concurrent_saves is None:
            continue
        on = [s for s in samples if t.path.is_relative_to(s.mountpoint)]
        if not on:
            continue
        st = max(on, key=lambda s: len(Path(s.mountpoint).parts))
        out[st.target] = min(out.get(st.target, t.max_concurrent_saves), t.max_concurrent_saves)
    return out


class ServiceError(Exception):
    """The daemon cannot start; the message names the setting and what to do."""


class Service:
    """Everything ``adaptd serve`` runs, wired together. :meth:`open`, :meth:`serve`,
    :meth:`close` (or :meth:`run`, which does all three)."""

    def __init__(
        self,
        cfg: Config,
        *,
        notifier: Notifier | None = None,
        sampler: Sampler | None = None,
        metrics_strict: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sampler``: a telemetry sampler (default :meth:`Sampler.default` at the
        configured interval). ``metrics_strict=False`` turns a busy metrics port into
        a warning (used when the address is the built-in default, so a second daemon
        on the host, such as the demo's, still starts)."""
        self.cfg = cfg
        self.notifier = notifier if notifier is not None else Notifier()
        self._sampler = sampler
        self.metrics_strict = metrics_strict
        self.clock = clock
        self.store: Store | None = None
        self.metrics = Metrics(
            slow_save_s=cfg.slow_save_s, job_series_grace_s=cfg.job_series_grace_s
        )
        self.metrics_server: MetricsServer | None = None
        self.sampler: Sampler | None = None
        self.daemon: Daemon | None = None
        self.failure_rate = FailureRate(prior_gpu_mtbf_s=cfg.gpu_mtbf_s)
        self.stopping = False
        self._last_persist: float | None = None
        self._status_text = ""
        self._closed = False
        #: jobs with a save in flight (the daemon's SaveInFlight events)
        self.writing: set[str] = set()
        self._view: tuple[int, frozenset[str], Snapshot] | None = None
        self.replicator: Replicator | None = None

    # ------------------------------------------------------------------ assembly

    def open(self) -> None:
        """Build and bind everything; raises :class:`ServiceError`. On failure what
        was opened is closed again."""
        try:
            self._open()
        except BaseException:
            self.close(persist=False)
            raise

    def _open(self) -> None:
        cfg = self.cfg
        try:
            self.store = Store.open(
                cfg.db_path, retention_days=cfg.retention_days, retention_rows=cfg.retention_rows
            )
        except StoreError as exc:
            raise ServiceError(f"daemon.db_path: {exc}") from None
        self._restore_failure_rate()
        from adaptd.telemetry import report
        from adaptd.telemetry.sampler import Sampler

        self.sampler = self._sampler or Sampler.default(interval=cfg.sample_interval_s)
        sinks = [self.store.on_event, self.metrics.on_event, self.sampler.on_event, self._on_event]
        if any(o.replicate_to for o in cfg.jobs):
            from adaptd.tiers.replicator import Replicator

            self.replicator = Replicator(cfg, on_upload=self._on_upload)
            sinks.append(self.replicator.on_event)
        try:
            self.daemon = Daemon(
                cfg.socket,
                policy=cfg.default_policy,
                snapshot_source=self.snapshot,
                sinks=sinks,
                tick_hooks=[self.sampler.tick, self.tick],
                silence_timeout_s=cfg.liveness_timeout_s,
                job_settings=self._initial_settings(),
                config_settings=self._configured_settings,
                status_extra=lambda: report.to_dict(self.snapshot()),
                curve=CurveKeys(cfg.curve_secret_key, cfg.curve_client_keys)
                if cfg.curve_secret_key and cfg.curve_client_keys else None,
                admin_group=cfg.admin_group,
            )  # fmt: skip
            # Set on the daemon's own registry (a Registry passed in while empty is
            # falsy, and `registry or Registry(...)` in the daemon would drop it).
            self.daemon.registry.tracker_factory = self.tracker_for
            self.store.step_time_of = self.metrics.step_time_of = self._step_time
            # Bind under a private umask: the socket files exist with no group/other
            # access until _set_permissions below gives them the configured modes.
            old = os.umask(0o077)
            try:
                self.daemon.open()
            finally:
                os.umask(old)
        except DaemonError as exc:
            raise ServiceError(str(exc)) from None
        self._set_permissions()
        if self.replicator is not None:
            replicator = self.replicator
            self.daemon.replication_source = replicator.status
            self.metrics.set_replication_source(
                lambda: (replicator.status(), replicator.throughput())
            )
            replicator.start()
            log.info(
                "event=replication destinations=%s jobs=%s",
                ",".join(cfg.destinations),
                ",".join(o.pattern for o in cfg.jobs if o.replicate_to),
            )
        self._serve_metrics()
        self.sampler.tick(self.clock())  # probe telemetry once before READY
        self._last_persist = self.clock()
        jobs = self._jobs_text()
        self.notifier.ready(f"serving {self.daemon.socket_path}; {jobs}")
        self._status_text = jobs

    def _restore_failure_rate(self) -> None:
        assert self.store is not None
        data = self.store.param(GLOBAL, FAILURE_RATE_KEY)
        if data is None:
            return
        try:
            restored = FailureRate.from_dict(data)
            # what was observed carries over; the prior is the config's (it may have changed)
            self.failure_rate = dataclasses.replace(restored, prior_gpu_mtbf_s=self.cfg.gpu_mtbf_s)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("event=learned_discarded what=failure_rate error=%r", str(exc))
        else:
            log.info(
                "event=learned_restored what=failure_rate gpu_mtbf_s=%.6g",
                self.failure_rate.gpu_mtbf_s,
            )

    def _initial_settings(self) -> dict[str, admin.JobSettings]:
        """Exact-id ``[jobs."ID"]`` entries of the config (merged with the globs that
        match them), overridden by what operators set at run time (the store), as the
        daemon's ``job_settings``. Jobs matched only by a glob get theirs at hello."""
        assert self.store is not None
        out: dict[str, admin.JobSettings] = {}
        for o in self.cfg.jobs:
            if not any(c in o.pattern for c in "*?["):
                configured = self._configured_settings(o.pattern)
                if configured is not None:
                    out[o.pattern] = configured
        for job, s in self.store.job_settings().items():
            out[job] = admin.JobSettings(policy=s.policy, paused=s.paused)
        return out

    def _configured_settings(self, job: str) -> admin.JobSettings | None:
        """The config's settings for a job that has none yet when it first says hello:
        its exact ``[jobs."ID"]`` entry and the matching glob entries, merged by
        :meth:`Config.job_override` (what an operator sets later still wins)."""
        o = self.cfg.job_override(job)
        if o is None or (o.policy is None and not o.paused):
            return None
        return admin.JobSettings(policy=o.policy, paused=bool(o.paused))

    def tracker_for(self, msg: Hello) -> JobTracker:
        """A new job's tracker: the host's shared failure rate, the configured GPU
        MTBF prior, and what the store learned about this job before a restart."""
        tracker = JobTracker(
            msg.job,
            world_size=msg.world_size,
            gpus=max(1, msg.gpus * msg.world_size),
            start_step=msg.resumed_from,
            state_bytes=msg.state_bytes or None,
            gpu_mtbf_s=self.cfg.gpu_mtbf_s,
            failure_rate=self.failure_rate,
        )
        if self.store is not None:
            data = self.store.param(job_scope(msg.job), LEARNED_KEY)
            if data is not None:
                try:
                    tracker.load_learned(data)
                except (ValueError, TypeError) as exc:
                    log.warning("event=learned_discarded job=%s error=%r", msg.job, str(exc))
                else:
                    log.info(
                        "event=learned_restored job=%s saves=%d save_cost_s=%s",
                        msg.job,
                        tracker.saves,
                        tracker.save_cost_s,
                    )
        return tracker

    def _on_upload(self, destination: str, job: str, result: UploadResult) -> None:
        """A checkpoint reached a destination (a Replicator worker thread): metrics."""
        self.metrics.on_upload(destination, result.seconds)

    def _step_time(self, job: str) -> float | None:
        """The job's current mean step time (decision rows and the step-time gauge)."""
        assert self.daemon is not None
        j = self.daemon.registry.jobs.get(job)
        return j.tracker.step_time_s if j is not None else None

    def _set_permissions(self) -> None:
        assert self.daemon is not None
        cfg = self.cfg
        gid = -1
        if cfg.socket_group:
            try:
                gid = grp.getgrnam(cfg.socket_group).gr_gid
            except KeyError:
                raise ServiceError(
                    f"daemon.socket_group: no group {cfg.socket_group!r} on this host; "
                    "create it (systemd-sysusers) or remove the setting"
                ) from None
        try:
            if self.daemon.tcp is None:  # a tcp:// job socket has no file (CURVE guards it)
                if gid != -1:
                    os.chown(self.daemon.socket_path, -1, gid)
                os.chmod(self.daemon.socket_path, cfg.socket_mode)
            if cfg.admin_group:  # the daemon checked that the group exists
                os.chown(self.daemon.admin_path, -1, grp.getgrnam(cfg.admin_group).gr_gid)
            os.chmod(self.daemon.admin_path, cfg.admin_socket_mode)
        except OSError as exc:
            raise ServiceError(
                f"daemon.socket_mode/socket_group: cannot set {exc.filename}: {exc.strerror}"
            ) from None

    def _serve_metrics(self) -> None:
        if self.cfg.metrics_listen is None:
            return
        host, port = self.cfg.metrics_listen
        try:
            self.metrics_server = self.metrics.serve(host, port)
        except MetricsError as exc:
            if self.metrics_strict:
                raise ServiceError(f"metrics.listen: {exc}") from None
            log.warning(
                "event=metrics_off listen=%s:%d error=%r (set metrics.listen to serve them)",
                host,
                port,
                str(exc),
            )
        else:
            log.info("event=metrics url=%s", self.metrics_server.url)

    # ------------------------------------------------------------------ loop

    def _on_event(self, event: ev.Event) -> None:
        """Operator settings changes (durable in the store, visible in metrics) and
        refused messages (counted in metrics by code)."""
        if isinstance(event, ev.SaveInFlight):
            (self.writing.add if event.writing else self.writing.discard)(event.job)
        elif isinstance(event, ev.JobLost | ev.JobFinished):
            self.writing.discard(event.job)
        elif isinstance(event, ev.MessageRejected):
            self.metrics.on_rejected(event.code)
        elif isinstance(event, ev.JobSettingsChanged):
            assert self.store is not None
            self.store.set_job_setting(event.job, policy=event.policy, paused=event.paused)
            self.metrics.set_paused(event.job, event.paused)
        elif (
            isinstance(event, ev.JobRegistered)
            and self.store is not None
            and (s := self.store.job_setting(event.job)) is not None
        ):
            # metrics.on_event reset the job's paused gauge; the operator's flag wins
            self.metrics.set_paused(event.job, s.paused)
        # Written as it is learned, not only every PERSIST_EVERY_S and at exit: a
        # SIGKILLed daemon never reaches its exit (tests/faults/test_daemon_crash.py).
        if isinstance(event, ev.SaveReported) and event.counted:
            self._persist_job(event.job, failure=False)
        elif isinstance(event, ev.JobResumed):
            self._persist_job(event.job, failure=True)

    def _persist_job(self, job_id: str, *, failure: bool) -> None:
        """Queue one job's learned costs (and, after a failure, the host's failure
        rate) for the store's next flush (within a tick)."""
        if self.store is None or self.daemon is None:
            return
        job = self.daemon.registry.jobs.get(job_id)
        if job is not None:
            self.store.set_param(job_scope(job_id), LEARNED_KEY, job.tracker.learned())
        if failure:
            self.store.set_param(GLOBAL, FAILURE_RATE_KEY, self.failure_rate.to_dict())

    def snapshot(self) -> Snapshot:
        """The sampler's newest snapshot with each storage target's ``writing_jobs``
        filled in from the daemon's save-in-flight events (only the daemon knows
        those) and its ``max_writers`` from ``[storage."NAME"] max_concurrent_saves``.
        The daemon's ``snapshot_source``; rebuilt only when either changed."""
        assert self.sampler is not None
        snap = self.sampler.latest()
        writing = frozenset(self.writing)
        view = self._view
        if view is not None and view[0] == id(snap) and view[1] == writing:
            return view[2]
        limits = storage_limits(snap.storage, self.cfg.storage.values())
        if (writing or limits) and snap.storage:
            storage = tuple(
                dataclasses.replace(
                    st,
                    writing_jobs=tuple(j for j in st.jobs if j in writing),
                    max_writers=limits.get(st.target, st.max_writers),
                )
                for st in snap.storage
            )
            out = dataclasses.replace(snap, storage=storage)
        else:
            out = snap
        self._view = (id(snap), writing, out)
        return out

    def tick(self, now: float) -> None:
        """The daemon's tick hook (see the module docstring)."""
        assert self.store is not None and self.daemon is not None
        if self._last_persist is None or now - self._last_persist >= PERSIST_EVERY_S:
            self.persist_learned()
            self._last_persist = now
        self.store.flush()
        assert self.sampler is not None
        self.metrics.on_snapshot(self.snapshot())
        self.metrics.expire(now)  # ended jobs' series, once their grace period is over
        self.metrics.set_state_stats(
            write_errors=self.store.write_errors, dropped_rows=self.store.dropped
        )
        text = self._jobs_text()
        if self.stopping:
            self.notifier.extend_timeout(EXTEND_BY_S)
        elif text != self._status_text:
            self._status_text = text
            self.notifier.status(text)
        if self.cfg.watchdog:
            self.notifier.tick(now)

    def _jobs_text(self) -> str:
        assert self.daemon is not None
        active = sum(j.state == "active" for j in self.daemon.registry)
        lost = sum(j.state == "lost" for j in self.daemon.registry)
        return f"{active} jobs connected, {lost} lost"

    def persist_learned(self) -> None:
        """Queue the failure-rate posterior and every known job's learned costs."""
        if self.store is None or self.daemon is None:
            return
        self.store.set_param(GLOBAL, FAILURE_RATE_KEY, self.failure_rate.to_dict())
        for job in self.daemon.registry:
            self.store.set_param(job_scope(job.id), LEARNED_KEY, job.tracker.learned())

    # ------------------------------------------------------------------ run

    def request_stop(self, signum: int | None = None) -> None:
        """Begin shutdown (safe from a signal handler): ``STOPPING=1``, then the
        daemon drains for ``daemon.drain_grace_s`` (every job saves) and exits."""
        if self.daemon is None:
            return
        name = signal.Signals(signum).name if signum is not None else "request"
        log.info("event=stopping signal=%s drain_grace_s=%g", name, self.cfg.drain_grace_s)
        again = self.stopping
        self.stopping = True
        if self.sampler is not None:
            self.sampler.draining = True
        if not again:
            self.notifier.stopping(f"stopping ({name}); draining up to {self.cfg.drain_grace_s:g}s")
        if not again and self.cfg.drain_grace_s > 0:
            self.notifier.extend_timeout(self.cfg.drain_grace_s + EXTEND_BY_S)
            self.daemon.stop(timeout_s=None, drain_s=self.cfg.drain_grace_s)
        else:  # a second signal stops at once
            self.daemon.stop(timeout_s=None)

    def serve(self) -> None:
        """Run the daemon's loop in this thread until stopped; SIGTERM/SIGINT stop it."""
        assert self.daemon is not None
        daemon = self.daemon
        handler = lambda signum, frame: self.request_stop(signum)  # noqa: E731
        old_term = signal.signal(signal.SIGTERM, handler)
        old_int = signal.signal(signal.SIGINT, handler)
        # the C-level handler writes to this fd, which wakes the poll at once
        previous = signal.set_wakeup_fd(daemon.wakeup_fd, warn_on_full_buffer=False)
        try:
            daemon.serve()
        finally:
            signal.set_wakeup_fd(previous)
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, old_int)

    def close(self, *, persist: bool = True) -> None:
        """Close in reverse order of :meth:`open`; persists what was learned first."""
        if self._closed:
            return
        self._closed = True
        if self.replicator is not None and not self.replicator.stop():
            log.warning("event=replication_stop_slow (an upload did not end in time)")
        if persist:
            with contextlib.suppress(Exception):
                self.persist_learned()
        if self.daemon is not None:
            self.daemon.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.sampler is not None:
            with contextlib.suppress(Exception):
                self.sampler.close()
        if self.store is not None:
            self.store.flush()
            self.store.close()
        self.notifier.close()

    def run(self) -> None:
        """:meth:`open`, :meth:`serve`, :meth:`close`; raises :class:`ServiceError`."""
        self.open()
        try:
            self.serve()
        finally:
            self.close()
