"""The daemon as ``adaptd serve`` runs it: every part built from one :class:`Config`.

:class:`Service` assembles, in this order (and closes in reverse):

1. the state database (:class:`adaptd.state.store.Store`), from which it restores the
   operator's per-job settings, the host's failure-rate posterior and each job's
   learned save/restore costs;
2. when the config replicates checkpoints (``[destinations.NAME]`` and a job's
   ``replicate_to``), the :class:`~adaptd.tiers.replicator.Replicator`: a sink of the
   daemon's events, shown in ``adaptd status`` and the metrics, stopped first at close;
3. the metrics (:class:`adaptd.metrics.exporter.Metrics`), the event bus with its sinks (store,
   metrics, replicator, this service), and the :class:`~adaptd.daemon.jobs.registry.Registry`
   emitting into it, with a read-only :class:`~adaptd.daemon.jobs.view.RegistryView` for
   the parts that only look (the sampler, the snapshot, the status line);
4. the :class:`adaptd.daemon.server.Daemon` over its parts (:func:`adaptd.daemon.assembly.parts`,
   given the config's values as they are: the config validated them), bound under a
   private umask and then given the configured socket modes and group (so the socket
   is never world-reachable, not even between bind and chmod);
5. the Prometheus endpoint;
6. the telemetry :class:`~adaptd.telemetry.sampler.Sampler`, probed once before
   ``READY=1`` goes to systemd (:mod:`adaptd.daemon.sdnotify`);
7. with a ``[fleet]``, the :class:`~adaptd.fleet.part.FleetPart` (docs/fleet.md), built
   before the registry: its facts go into every snapshot, its pooled failure posterior
   to every tracker, the daemon's events to it, its slot wishes out at each tick (and
   at once when a slot is granted); it has its own thread for etcd, a metrics
   collector and a section in ``adaptd status``.

Everything a part needs is passed to it when it is built; nothing is set afterwards.

Its tick hooks (about once a second, in the daemon's loop) sample the telemetry for the
registry's jobs, flush the store, feed
metrics the newest snapshot and the store's fault counters, persist what was learned every
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
from typing import TYPE_CHECKING, Any

from adaptd.config.loader import Config, StorageTarget
from adaptd.core.estimators import FailureRate
from adaptd.core.snapshot import Snapshot, StorageSample
from adaptd.daemon import assembly
from adaptd.daemon import events as ev
from adaptd.daemon.admin.handler import admin_gid
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.view import RegistryView
from adaptd.daemon.logfmt import logfmt
from adaptd.daemon.sdnotify import Notifier
from adaptd.daemon.server import Daemon
from adaptd.daemon.transport import CurveKeys, DaemonError, Transport
from adaptd.fleet.part import FleetPart
from adaptd.metrics.exporter import Metrics, MetricsError, MetricsServer
from adaptd.protocol import admin
from adaptd.protocol.relay_auth import RelayKey
from adaptd.state.learned import FAILURE_RATE_KEY, LEARNED_KEY, Learned
from adaptd.state.records import SaveRecord
from adaptd.state.store import Store, StoreError

if TYPE_CHECKING:
    from adaptd.telemetry.sampler import Sampler
    from adaptd.tiers.replica import UploadResult
    from adaptd.tiers.replicator import Replicator

__all__ = [
    "EXTEND_BY_S",
    "FAILURE_RATE_KEY",
    "LEARNED_KEY",
    "PERSIST_EVERY_S",
    "Service",
    "ServiceError",
    "storage_limits",
]

log = logging.getLogger("adaptd.service")

#: Learned parameters (failure rate, each job's costs) are written this often, and at exit.
PERSIST_EVERY_S = 30.0
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


def set_permissions(cfg: Config, daemon: Daemon, admin_gid: int | None) -> None:
    """Give the daemon's sockets the configured modes and groups (``admin_gid``: the
    admin group looked up at start). Raises :class:`ServiceError` naming the setting
    for a group that does not exist or a socket whose mode cannot be set."""
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
        if daemon.tcp is None:  # a tcp:// job socket has no file (CURVE guards it)
            if gid != -1:
                os.chown(daemon.socket_path, -1, gid)
            os.chmod(daemon.socket_path, cfg.socket_mode)
        if admin_gid is not None:
            os.chown(daemon.admin_path, -1, admin_gid)
        os.chmod(daemon.admin_path, cfg.admin_socket_mode)
    except OSError as exc:
        raise ServiceError(
            f"daemon.socket_mode/socket_group: cannot set {exc.filename}: {exc.strerror}"
        ) from None


def relay_key(cfg: Config) -> RelayKey | None:
    """The key of ``daemon.relay_key_file`` (None when unset); raises :class:`ServiceError`."""
    if cfg.relay_key_file is None:
        return None
    try:
        return RelayKey.load(cfg.relay_key_file)
    except ValueError as exc:
        raise ServiceError(f"daemon.relay_key_file: {exc}") from None


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
        self.metrics: Metrics | None = None
        self.metrics_server: MetricsServer | None = None
        self.sampler: Sampler | None = None
        self.daemon: Daemon | None = None
        #: the registry's jobs, read-only (set when :meth:`open` builds the registry)
        self.jobs: RegistryView | None = None
        #: the failure rate and job costs, restored from the store (set by :meth:`open`)
        self.learned: Learned | None = None
        self.stopping = False
        self._last_persist: float | None = None
        self._status_text = ""
        self._closed = False
        self._view: tuple[tuple[Any, ...], Snapshot] | None = None
        self.replicator: Replicator | None = None
        self.fleet: FleetPart | None = None

    @property
    def failure_rate(self) -> FailureRate | None:
        """The host's failure-rate posterior (``None`` until :meth:`open`)."""
        return self.learned.failure_rate if self.learned is not None else None

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
                cfg.db_path,
                retention_days=cfg.retention_days,
                retention_rows=cfg.retention_rows,
                owner=f"socket {cfg.socket}",  # which daemon holds it, for the one refused
            )
        except StoreError as exc:
            raise ServiceError(f"daemon.db_path: {exc}") from None
        self.learned = Learned(self.store, gpu_mtbf_s=cfg.gpu_mtbf_s, host_gpus=self._host_gpus)
        from adaptd.telemetry.sampler import Sampler

        self.sampler = self._sampler or Sampler.default(interval=cfg.sample_interval_s)
        self.fleet = FleetPart.build(cfg.fleet, self.learned, self.store, self.clock)
        replicator = None
        if any(o.replicate_to for o in cfg.jobs):
            from adaptd.tiers.replicator import Replicator

            replicator = self.replicator = Replicator(
                cfg,
                on_upload=self._on_upload,
                slot_gate=self.fleet.link.upload_slot if self.fleet is not None else None,
            )
        self.metrics = Metrics(
            slow_save_s=cfg.slow_save_s,
            job_series_grace_s=cfg.job_series_grace_s,
            replication=None
            if replicator is None
            else lambda: (replicator.status(), replicator.throughput()),
        )
        sinks = [self.store.on_event, self.metrics.on_event, self._on_event]
        if replicator is not None:
            sinks.append(replicator.on_event)
        if self.fleet is not None:
            sinks.append(self.fleet.link.on_event)
        events = ev.EventBus(sinks)
        registry = Registry(
            emit=events,
            silence_timeout_s=cfg.liveness_timeout_s,
            tracker_factory=self.learned.tracker_for,
        )
        self.jobs = RegistryView(registry)
        curve = None
        if cfg.curve_secret_key and cfg.curve_client_keys:
            curve = CurveKeys(cfg.curve_secret_key, cfg.curve_client_keys)
        try:
            parts = assembly.parts(
                Transport(cfg.socket, curve=curve),
                events=events,
                registry=registry,
                default_spec=cfg.default_policy,
                snapshot_source=self.snapshot,
                tick_hooks=[self.sample, self.tick],
                job_settings=self._initial_settings(),
                config_settings=self._configured_settings,
                status_extra=self._status_extra,
                replication_source=replicator.status if replicator is not None else None,
                admin_group_id=admin_gid(cfg.admin_group),
                history_source=self._history,
                relay_key=relay_key(cfg),
            )
            self.daemon = Daemon(parts=parts)
            # Bind under a private umask: the socket files exist with no group/other
            # access until set_permissions below gives them the configured modes.
            old = os.umask(0o077)
            try:
                self.daemon.open()
            finally:
                os.umask(old)
        except DaemonError as exc:
            raise ServiceError(str(exc)) from None
        set_permissions(self.cfg, self.daemon, parts.admin.admin_gid)
        if self.fleet is not None:
            self.fleet.start(registry, self.daemon, self.metrics.registry)
        if replicator is not None:
            replicator.start()
            log.info(
                logfmt(
                    "replication",
                    destinations=",".join(cfg.destinations),
                    jobs=",".join(o.pattern for o in cfg.jobs if o.replicate_to),
                )
            )
        self._serve_metrics()
        self.sampler.tick(self.clock())  # probe telemetry once before READY
        self._last_persist = self.clock()
        jobs = self._jobs_text()
        self.notifier.ready(f"serving {self.daemon.socket_path}; {jobs}")
        self._status_text = jobs

    def _host_gpus(self) -> int | None:
        """The GPUs NVML shows on this host now; None when it shows none."""
        n = len(self.sampler.latest().gpus) if self.sampler is not None else 0
        return n or None

    def _status_extra(self) -> dict[str, Any]:
        """What ``adaptd status`` shows besides the jobs: telemetry, and the fleet."""
        from adaptd.telemetry import report

        out = report.to_dict(self.snapshot())
        if self.fleet is not None:
            out["fleet"] = self.fleet.status()
        return out

    def _history(self, job: str, since: float | None, limit: int) -> list[SaveRecord]:
        """``adaptd history``: the job's saves from the state database (queued rows
        flushed first, so a save reported a moment ago is there)."""
        assert self.store is not None
        return self.store.saves(job, since=since, limit=limit)

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

    def _on_upload(self, destination: str, job: str, result: UploadResult) -> None:
        """A checkpoint reached a destination (a Replicator worker thread): metrics."""
        if self.metrics is not None:
            self.metrics.on_upload(destination, result.seconds)

    def _serve_metrics(self) -> None:
        if self.cfg.metrics_listen is None or self.metrics is None:
            return
        host, port = self.cfg.metrics_listen
        try:
            self.metrics_server = self.metrics.serve(host, port)
        except MetricsError as exc:
            if self.metrics_strict:
                raise ServiceError(f"metrics.listen: {exc}") from None
            log.warning(
                logfmt(
                    "metrics_off",
                    listen=f"{host}:{port}",
                    error=str(exc),
                    hint="set metrics.listen to serve them",
                )
            )
        else:
            log.info(logfmt("metrics", url=self.metrics_server.url))

    # ------------------------------------------------------------------ loop

    def _on_event(self, event: ev.Event) -> None:
        """Operator settings changes (durable in the store, visible in metrics) and
        refused messages (counted in metrics by code)."""
        assert self.metrics is not None
        if isinstance(event, ev.MessageRejected):
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
        if self.learned is not None and self.jobs is not None:
            self.learned.keep_job(job_id, self.jobs.learned_of(job_id), failure=failure)

    def sample(self, now: float) -> None:
        """The daemon's first tick hook: sample the telemetry (when due) for the jobs the
        registry knows, their checkpoint directories and processes."""
        assert self.sampler is not None and self.jobs is not None
        self.sampler.tick(now, jobs=self.jobs.processes)

    def snapshot(self) -> Snapshot:
        """The sampler's newest snapshot with each storage target's ``writing_jobs``
        filled in from the registry's jobs with a save in flight (only the daemon knows
        those) and its ``max_writers`` from ``[storage."NAME"] max_concurrent_saves``.
        The daemon's ``snapshot_source``; rebuilt only when either changed."""
        assert self.sampler is not None and self.jobs is not None
        snap = self.sampler.latest()
        writing = self.jobs.writing()
        key = (id(snap), writing, self.fleet.view_key() if self.fleet is not None else None)
        view = self._view
        if view is not None and view[0] == key:
            return view[1]
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
        if self.fleet is not None:
            out = self.fleet.decorate(out, limits)
        self._view = (key, out)
        return out

    def tick(self, now: float) -> None:
        """The daemon's tick hook (see the module docstring)."""
        assert self.store is not None and self.metrics is not None
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
        text = self._jobs_text()
        if self.stopping:
            self.notifier.extend_timeout(EXTEND_BY_S)
        elif text != self._status_text:
            self._status_text = text
            self.notifier.status(text)
        if self.cfg.watchdog:
            self.notifier.tick(now)

    def _jobs_text(self) -> str:
        assert self.jobs is not None
        return f"{self.jobs.active} jobs connected, {self.jobs.lost} lost"

    def persist_learned(self) -> None:
        """Queue the failure-rate posterior and every known job's learned costs."""
        if self.learned is not None and self.jobs is not None:
            self.learned.keep_all(self.jobs.learned())
        if self.fleet is not None:
            self.fleet.persist()

    # ------------------------------------------------------------------ run

    def request_stop(self, signum: int | None = None) -> None:
        """Begin shutdown (safe from a signal handler): ``STOPPING=1``, then the
        daemon drains for ``daemon.drain_grace_s`` (every job saves) and exits."""
        if self.daemon is None:
            return
        name = signal.Signals(signum).name if signum is not None else "request"
        log.info(logfmt("stopping", signal=name, drain_grace_s=self.cfg.drain_grace_s))
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
            log.warning(logfmt("replication_stop_slow", why="an upload did not end in time"))
        if persist:
            with contextlib.suppress(Exception):
                self.persist_learned()
        if self.fleet is not None:
            with contextlib.suppress(Exception):
                self.fleet.close()
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
