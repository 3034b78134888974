"""Prometheus metrics for the daemon, served on 127.0.0.1:9465 by default.

:class:`Metrics` owns a dedicated :class:`~prometheus_client.CollectorRegistry`
(never the process-global one, so tests and embedded uses do not collide). The
daemon calls one method per event: :meth:`Metrics.on_save`,
:meth:`~Metrics.on_decision`, :meth:`~Metrics.on_failure`,
:meth:`~Metrics.on_snapshot`, :meth:`~Metrics.on_rejected`,
:meth:`~Metrics.set_jobs`... Event figures (save times, bytes, counters) are
instrumented as they happen; host figures (GPUs, storage) are rendered at scrape
time from the newest snapshot, so a GPU or mount that disappears stops being
exported instead of freezing at its last value.

Names follow the Prometheus conventions: prefix ``adaptd_``, base units
(``_seconds``, ``_bytes``, ``_ratio`` for 0..1 fractions), ``_total`` on counters.
The per-job label is ``job_id``, not ``job``: Prometheus attaches its own ``job``
label to every scraped series, and a clash would rename ours to ``exported_job``.

Tiered storage (the daemon's Replicator, :mod:`adaptd.tiers.replicator`) adds
``adaptd_replication_*`` series per ``destination`` and ``job_id``: pending bytes and
uploads, seconds behind, bytes uploaded, uploads by result, the newest replicated
step, and per destination the recent throughput and an upload-time histogram. They
are rendered at scrape time from the Replicator's status (``replication_source``),
so the lag keeps growing between events.

A job that ends (a clean goodbye, or a lost job the daemon forgets) keeps its
series for ``job_series_grace_s`` (config ``metrics.job_series_grace_s``, by default
two of ``metrics.scrape_interval_s``) before they are removed: the saves between the
last scrape and the end are scraped once more, and a job shorter than a scrape
interval is seen at all. At most :data:`MAX_ENDED_JOBS` ended jobs wait at once; beyond
that the oldest go at once, so a flood of short jobs cannot grow memory. A lost job
keeps its series until it resumes or is forgotten (the no-save alert must be able to
fire for it). ``adaptd_host_saves_total``
and ``adaptd_host_save_written_bytes_total`` count every job's saves without a job
label and are never removed, so ``increase()`` over them holds all saves of the host.

A save is *bad* when it failed, blocked the loop longer than ``slow_save_s``, or
took longer to become durable than the job's planned interval (the next save
would be due before it finished). ``adaptd_job_bad_save_streak`` counts bad saves
in a row; the alert rules in ``deploy/prometheus/`` fire at three.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest, start_http_server
from prometheus_client.registry import Collector

from adaptd import __version__, events
from adaptd.snapshot import Snapshot
from adaptd.store import DecisionRecord, FailureRecord, SaveRecord

if TYPE_CHECKING:
    from adaptd.admin import ReplicationInfo

#: What the Replicator shows the metrics: its status rows and each destination's throughput.
ReplicationView = tuple["list[ReplicationInfo]", Mapping[str, float]]

#: Histogram buckets for save times: 1 ms to 10 min, about three per decade.
SAVE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip

JOB = "job_id"
#: Prometheus' own default ``scrape_interval``; an ended job's series stay for two.
DEFAULT_SCRAPE_INTERVAL_S = 60.0
DEFAULT_JOB_SERIES_GRACE_S = 2 * DEFAULT_SCRAPE_INTERVAL_S
#: Ended jobs whose series wait out their grace period at once; beyond it the oldest go
#: at once, so a flood of short jobs cannot grow the daemon's memory.
MAX_ENDED_JOBS = 256


class MetricsError(RuntimeError):
    """The metrics endpoint could not start; the message names the address and the fix."""


class Metrics:
    """Every metric the daemon exports, and the methods that update them.

    All methods are thread-safe (prometheus_client's metrics lock internally; the
    snapshot is swapped atomically) and cheap enough for the daemon's loop.
    """

    def __init__(
        self,
        *,
        slow_save_s: float = 1.0,
        job_series_grace_s: float = DEFAULT_JOB_SERIES_GRACE_S,
        version: str = __version__,
    ) -> None:
        if not slow_save_s > 0:
            raise ValueError(f"slow_save_s must be > 0, got {slow_save_s}")
        if not job_series_grace_s >= 0:
            raise ValueError(f"job_series_grace_s must be >= 0, got {job_series_grace_s}")
        self.slow_save_s = slow_save_s
        #: Seconds an ended job's series stay exported (see the module docstring).
        self.job_series_grace_s = job_series_grace_s
        #: A job's current step time, for the step-time gauge and an interval given
        #: in steps (a PlanChanged event carries none); set by the daemon's service.
        self.step_time_of: Callable[[str], float | None] | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Info("adaptd_build", "adaptd version", registry=r).info({"version": version})

        self.save_blocking = Histogram(
            "adaptd_save_blocking_seconds",
            "Time a save blocked the training loop.",
            [JOB], buckets=SAVE_BUCKETS, registry=r,
        )  # fmt: skip
        self.save_durable = Histogram(
            "adaptd_save_durable_seconds",
            "Time from the save call until the checkpoint was durable (successful saves).",
            [JOB], buckets=SAVE_BUCKETS, registry=r,
        )  # fmt: skip
        self.saves = Counter(
            "adaptd_saves", "Saves reported, by result (ok, failed).", [JOB, "result"], registry=r
        )
        self.save_bytes = Counter(
            "adaptd_save_written_bytes", "Bytes written by successful saves.", [JOB], registry=r
        )
        self.host_saves = Counter(
            "adaptd_host_saves",
            "Saves reported by all jobs on this host, by result (ok, failed); no job label, "
            "never removed.",
            ["result"], registry=r,
        )  # fmt: skip
        self.host_save_bytes = Counter(
            "adaptd_host_save_written_bytes",
            "Bytes written by all jobs' successful saves on this host; no job label.",
            registry=r,
        )
        for result in ("ok", "failed"):
            self.host_saves.labels(result)
        self.bad_streak = Gauge(
            "adaptd_job_bad_save_streak",
            "Consecutive saves of the job that failed or were slow.",
            [JOB], registry=r,
        )  # fmt: skip
        self.last_save = Gauge(
            "adaptd_job_last_save_timestamp_seconds",
            "Wall time (Unix seconds) the job's newest successful save became durable.",
            [JOB], registry=r,
        )  # fmt: skip
        self.started = Gauge(
            "adaptd_job_start_timestamp_seconds",
            "Wall time (Unix seconds) the daemon first saw this incarnation of the job.",
            [JOB], registry=r,
        )  # fmt: skip
        self.interval_s = Gauge(
            "adaptd_job_interval_seconds", "Planned time between saves.", [JOB], registry=r
        )
        self.interval_steps = Gauge(
            "adaptd_job_interval_steps", "Planned steps between saves.", [JOB], registry=r
        )
        self.waste = Gauge(
            "adaptd_job_predicted_waste_ratio",
            "Expected fraction of time lost to saves and to re-done work after failures.",
            [JOB], registry=r,
        )  # fmt: skip
        self.step_time = Gauge(
            "adaptd_job_step_seconds", "Recent mean step time of the job.", [JOB], registry=r
        )
        self.paused = Gauge(
            "adaptd_job_paused", "1 while the job's non-urgent saves are held.", [JOB], registry=r
        )
        self.decisions = Counter(
            "adaptd_decisions", "Plans decided for the job.", [JOB], registry=r
        )
        self.failures = Counter(
            "adaptd_job_failures",
            "Failures observed: the job vanished without a goodbye and resumed from an older step.",
            [JOB], registry=r,
        )  # fmt: skip
        self.jobs = Gauge("adaptd_jobs_connected", "Jobs the daemon serves now.", registry=r)
        self.rejected = Counter(
            "adaptd_rejected_messages",
            "Messages refused, by error code (malformed, invalid, too_large, version, ...).",
            ["code"], registry=r,
        )  # fmt: skip
        self.xid = Counter(
            "adaptd_gpu_xid_events",
            "NVIDIA XID error events seen, by GPU and XID code.",
            ["gpu", "uuid", "xid"], registry=r,
        )  # fmt: skip
        self._host = _SnapshotCollector()
        r.register(self._host)
        self.upload_seconds = Histogram(
            "adaptd_replication_upload_seconds",
            "Time a successful upload of one checkpoint to a destination took.",
            ["destination"], buckets=SAVE_BUCKETS, registry=r,
        )  # fmt: skip
        self._replication = _ReplicationCollector()
        r.register(self._replication)

        self._lock = threading.Lock()
        self._streaks: dict[str, int] = {}
        self._planned_s: dict[str, float] = {}
        self._last_saved: dict[str, float] = {}
        self._live: set[str] = set()  # for on_event's connected-jobs count
        self._incarnations: dict[str, int] = {}
        self._ending: dict[str, float] = {}  # ended job -> when its series go (event clock)
        self._now = float("-inf")  # the newest time expire() was given

    # ---------------------------------------------------------------- events

    def on_job_started(self, job: str, *, time: float) -> None:
        """A job (re)connected at wall time ``time``; the no-save alert counts from here.

        Its counters and histograms are created at zero now, so the first slow save
        or failure is an *increase* that ``increase()``/``rate()`` can see.
        """
        self.started.labels(job).set(time)
        for metric in (self.save_blocking, self.save_durable, self.save_bytes, self.failures):
            metric.labels(job)
        for result in ("ok", "failed"):
            self.saves.labels(job, result)
        self.bad_streak.labels(job).set(self._streaks.get(job, 0))
        self.paused.labels(job).set(0)

    def on_save(self, rec: SaveRecord, *, counted: bool = True) -> None:
        """A save report arrived (the same record the store keeps).

        Every rank's report feeds the time histograms and the bytes; ``counted=False``
        (another rank already reported this step) keeps it out of the save count and
        the bad-save streak, so four ranks of one failed save are one failure.
        """
        job = rec.job
        self.save_blocking.labels(job).observe(rec.blocking_s)
        if rec.ok:
            self.save_durable.labels(job).observe(rec.durable_s)
            self.save_bytes.labels(job).inc(rec.bytes)
            self.host_save_bytes.inc(rec.bytes)
            with self._lock:  # ranks' reports may arrive out of order: keep the newest
                newest = max(rec.ended, self._last_saved.get(job, rec.ended))
                self._last_saved[job] = newest
            self.last_save.labels(job).set(newest)
        if not counted:
            return
        result = "ok" if rec.ok else "failed"
        self.saves.labels(job, result).inc()
        self.host_saves.labels(result).inc()
        planned = self._planned_s.get(job)
        bad = (
            not rec.ok
            or rec.blocking_s > self.slow_save_s
            or (planned is not None and rec.durable_s > planned)
        )
        with self._lock:
            streak = self._streaks.get(job, 0) + 1 if bad else 0
            self._streaks[job] = streak
        self.bad_streak.labels(job).set(streak)

    def on_decision(self, rec: DecisionRecord) -> None:
        """A plan was decided for a job. Unknown figures (``None``) are removed, not zeroed."""
        job = rec.job
        self.decisions.labels(job).inc()
        interval = rec.interval_s
        if interval is None and rec.every_steps and rec.step_time_s:
            interval = rec.every_steps * rec.step_time_s
        for gauge, value in (
            (self.interval_s, interval),
            (self.interval_steps, rec.every_steps),
            (self.waste, rec.waste),
            (self.step_time, rec.step_time_s),
        ):
            if value is None:
                _remove(gauge, job)
            else:
                gauge.labels(job).set(value)
        with self._lock:
            if interval is None:
                self._planned_s.pop(job, None)
            else:
                self._planned_s[job] = interval

    def on_failure(self, rec: FailureRecord) -> None:
        """A failure of the job was recognised."""
        self.failures.labels(rec.job).inc()

    def set_paused(self, job: str, paused: bool) -> None:
        self.paused.labels(job).set(1 if paused else 0)

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """A new host snapshot: GPU, storage and host figures come from it at scrape time."""
        for g in snapshot.gpus:
            for code in g.xid_events:
                self.xid.labels(str(g.index), g.uuid, str(code)).inc()
        self._host.snapshot = snapshot

    def on_rejected(self, code: str, n: int = 1) -> None:
        """``n`` messages were refused with ``code`` (``ProtocolError.code``)."""
        self.rejected.labels(code).inc(n)

    def set_replication_source(self, source: Callable[[], ReplicationView] | None) -> None:
        """Where the ``adaptd_replication_*`` series come from at scrape time (the
        service passes its Replicator's view; ``None``: no replication series)."""
        self._replication.source = source

    def on_upload(self, destination: str, seconds: float) -> None:
        """A checkpoint finished uploading to ``destination`` in ``seconds``."""
        self.upload_seconds.labels(destination).observe(seconds)

    def set_jobs(self, n: int) -> None:
        self.jobs.set(n)

    def set_state_stats(self, *, write_errors: int, dropped_rows: int) -> None:
        """Mirror the store's fault counters (:attr:`adaptd.store.Store.write_errors`...)."""
        self._host.state = (write_errors, dropped_rows)

    def end_job(self, job: str, *, time: float) -> None:
        """A job left for good at ``time`` (the daemon's monotonic clock): its series
        are removed by the first :meth:`expire` at or after ``time + job_series_grace_s``,
        unless it starts again before. A time older than the last :meth:`expire` (a
        forgotten job carries its last message's) counts from that expire instead."""
        with self._lock:
            self._ending.pop(job, None)
            self._ending[job] = max(time, self._now) + self.job_series_grace_s
            over = list(self._ending)[: max(0, len(self._ending) - MAX_ENDED_JOBS)]
            for old in over:  # the oldest ended first (insertion order)
                del self._ending[old]
        for old in over:
            self.remove_job(old)
        if self.job_series_grace_s == 0:
            self.expire(time)

    def expire(self, now: float) -> list[str]:
        """Remove the series of ended jobs whose grace period is over; returns them.
        The daemon calls this once a second (its tick)."""
        with self._lock:
            self._now = max(self._now, now)
            due = [job for job, at in self._ending.items() if at <= now]
            for job in due:
                del self._ending[job]
        for job in due:
            self.remove_job(job)
        return due

    def remove_job(self, job: str) -> None:
        """Forget a job's series now (:meth:`end_job` waits the grace period first).

        Do not call this when a job vanished: it may come back, and its failure
        counter must keep counting.
        """
        for metric in (
            self.save_blocking, self.save_durable, self.save_bytes, self.bad_streak,
            self.last_save, self.started, self.interval_s, self.interval_steps, self.waste,
            self.step_time, self.paused, self.decisions, self.failures,
        ):  # fmt: skip
            _remove(metric, job)
        for result in ("ok", "failed"):
            _remove(self.saves, job, result)
        with self._lock:
            self._streaks.pop(job, None)
            self._planned_s.pop(job, None)
            self._last_saved.pop(job, None)

    def on_event(self, ev: events.Event) -> None:
        """An :data:`adaptd.events.Sink`: update the metrics from the daemon's event.

        Also keeps ``adaptd_jobs_connected`` (jobs registered and neither finished
        nor lost). A lost job keeps its series (it may resume, and the no-save alert
        should fire if it does not); a finished or forgotten one is removed after the
        grace period (:meth:`end_job`).
        """
        if isinstance(ev, events.JobRegistered):
            with self._lock:
                self._ending.pop(ev.job, None)  # back within its grace period: keep all
            if self._incarnations.get(ev.job) != ev.incarnation:
                self._incarnations[ev.job] = ev.incarnation
                self.on_job_started(ev.job, time=ev.wall)
            self._live.add(ev.job)
        elif isinstance(ev, events.SaveReported):
            rec = SaveRecord.from_report(ev.report, received=ev.wall)
            self.on_save(rec, counted=ev.counted)
        elif isinstance(ev, events.PlanChanged):
            st = self.step_time_of(ev.job) if self.step_time_of is not None else None
            self.on_decision(
                DecisionRecord.from_decision(
                    ev.job, ev.decision, time=ev.wall, step=ev.step, step_time_s=st
                )
            )
        elif isinstance(ev, events.JobResumed):
            self.failures.labels(ev.job).inc()
        elif isinstance(ev, events.JobLost):
            self._live.discard(ev.job)
        elif isinstance(ev, events.JobRevived):
            self._live.add(ev.job)
        elif isinstance(ev, events.JobFinished | events.JobForgotten):
            # forgotten: a lost job the registry dropped; it will not come back as itself
            self._live.discard(ev.job)
            self._incarnations.pop(ev.job, None)
            self.end_job(ev.job, time=ev.time)
        self.jobs.set(len(self._live))

    # ---------------------------------------------------------------- output

    def render(self) -> bytes:
        """The exposition text, as a scrape would get it."""
        return generate_latest(self.registry)

    def names(self) -> set[str]:
        """Every sample name the registry can expose (``_bucket``, ``_total``... included)."""
        out: set[str] = set()
        for family in self.registry.collect():
            out.add(family.name)
            out.update(s.name for s in family.samples)
            suffixes = {
                "counter": ("_total", "_created"),
                "histogram": ("_bucket", "_count", "_sum", "_created"),
                "info": ("_info",),
            }.get(family.type, ())
            out.update(family.name + s for s in suffixes)
        return out

    def serve(self, host: str = "127.0.0.1", port: int = 9465) -> MetricsServer:
        """Start the HTTP endpoint; raises :class:`MetricsError` if it cannot bind."""
        server = MetricsServer(self, host, port)
        server.start()
        return server


class MetricsServer:
    """The ``/metrics`` HTTP endpoint on its own daemon thread. ``port=0`` picks one."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._httpd = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            httpd, thread = start_http_server(self.port, self.host, self.metrics.registry)
        except OSError as exc:
            raise MetricsError(
                f"metrics.listen {self.host}:{self.port}: cannot listen ({exc.strerror or exc}); "
                'choose another address, or set metrics.listen = "off"'
            ) from None
        self._httpd, self._thread = httpd, thread
        self.port = httpd.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and release the port. Safe to call twice."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
        self._httpd = self._thread = None

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _remove(metric: Gauge | Counter | Histogram, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never had these labels: nothing to forget
        metric.remove(*labels)


class _SnapshotCollector(Collector):
    """Renders the newest snapshot's GPU, storage and host figures at scrape time."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.state: tuple[int, int] = (0, 0)

    def describe(self) -> Iterable[Metric]:
        return list(self._families(Snapshot(time=0.0)))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self.snapshot)

    def _families(self, snap: Snapshot | None) -> Iterator[Metric]:
        gl = ["gpu", "uuid"]
        util = GaugeMetricFamily(
            "adaptd_gpu_utilization_ratio", "GPU SM utilisation (0..1).", labels=gl
        )
        mem_util = GaugeMetricFamily(
            "adaptd_gpu_memory_utilization_ratio", "GPU memory-controller utilisation.", labels=gl
        )
        mem_used = GaugeMetricFamily(
            "adaptd_gpu_memory_used_bytes", "GPU memory in use.", labels=gl
        )
        mem_total = GaugeMetricFamily(
            "adaptd_gpu_memory_total_bytes", "GPU memory installed.", labels=gl
        )
        power = GaugeMetricFamily("adaptd_gpu_power_watts", "GPU power draw.", labels=gl)
        temp = GaugeMetricFamily(
            "adaptd_gpu_temperature_celsius", "GPU core temperature.", labels=gl
        )
        ecc = CounterMetricFamily(
            "adaptd_gpu_ecc_errors",
            "Volatile ECC error counts from NVML (reset when the driver reloads).",
            labels=[*gl, "type"],
        )
        pending = GaugeMetricFamily(
            "adaptd_gpu_repair_pending",
            "1 when the GPU has retired pages or remapped rows pending (needs a reset).",
            labels=[*gl, "kind"],
        )
        sl = ["target", "mountpoint"]
        busy = GaugeMetricFamily(
            "adaptd_storage_busy_ratio", "Fraction of time the storage device was busy.", labels=sl
        )
        wlat = GaugeMetricFamily(
            "adaptd_storage_write_latency_seconds", "Mean time per write operation.", labels=sl
        )
        wrate = GaugeMetricFamily(
            "adaptd_storage_write_bytes_per_second",
            "Write throughput over the last sampling interval.",
            labels=sl,
        )
        writing = GaugeMetricFamily(
            "adaptd_storage_saves_in_flight", "Jobs with a save in flight on the target.", labels=sl
        )
        host_mem = GaugeMetricFamily("adaptd_host_memory_available_bytes", "Host memory available.")
        errors, dropped = self.state
        state_err = CounterMetricFamily(
            "adaptd_state_write_errors", "State-database flushes that failed (retried).", errors
        )
        state_drop = CounterMetricFamily(
            "adaptd_state_dropped_rows",
            "History rows dropped because writes kept failing.",
            dropped,
        )
        if snap is not None:
            for g in snap.gpus:
                lv = [str(g.index), g.uuid]
                _add(util, lv, g.util_sm)
                _add(mem_util, lv, g.util_mem)
                _add(mem_used, lv, g.mem_used_bytes)
                _add(mem_total, lv, g.mem_total_bytes)
                _add(power, lv, g.power_w)
                _add(temp, lv, g.temperature_c)
                _add(ecc, [*lv, "corrected"], g.ecc_corrected)
                _add(ecc, [*lv, "uncorrected"], g.ecc_uncorrected)
                _add(pending, [*lv, "retired_pages"], g.retired_pages_pending)
                _add(pending, [*lv, "remapped_rows"], g.remapped_rows_pending)
            for s in snap.storage:
                lv = [s.target, s.mountpoint]
                _add(busy, lv, s.busy_fraction)
                _add(wlat, lv, s.write_latency_s)
                _add(wrate, lv, s.write_bytes_per_s)
                _add(writing, lv, len(s.writing_jobs))
            if snap.host is not None and snap.host.mem_available_bytes is not None:
                host_mem.add_metric([], snap.host.mem_available_bytes)
        yield from (util, mem_util, mem_used, mem_total, power, temp, ecc, pending)
        yield from (busy, wlat, wrate, writing, host_mem, state_err, state_drop)


class _ReplicationCollector(Collector):
    """Renders the Replicator's status rows at scrape time."""

    def __init__(self) -> None:
        self.source: Callable[[], ReplicationView] | None = None

    def describe(self) -> Iterable[Metric]:
        return list(self._families([], {}))

    def collect(self) -> Iterator[Metric]:
        # without replication the families are still described (HELP/TYPE, no samples),
        # like a labelled metric that has no children yet
        rows, throughput = self.source() if self.source is not None else ([], {})
        yield from self._families(rows, throughput)

    def _families(self, rows: list[ReplicationInfo], throughput: Mapping[str, float]):
        ll = ["destination", JOB]
        pending_bytes = GaugeMetricFamily(
            "adaptd_replication_pending_bytes",
            "Bytes still to upload: the rest of the running upload plus the queued checkpoint.",
            labels=ll,
        )
        pending = GaugeMetricFamily(
            "adaptd_replication_pending_uploads",
            "Uploads running or queued (0-2: a newer checkpoint replaces a queued one).",
            labels=ll,
        )
        behind = GaugeMetricFamily(
            "adaptd_replication_lag_seconds",
            "How long the destination has lacked a checkpoint that exists locally (0: current).",
            labels=ll,
        )
        last = GaugeMetricFamily(
            "adaptd_replication_last_step",
            "Newest step replicated to the destination (its LATEST).",
            labels=ll,
        )
        sent = CounterMetricFamily(
            "adaptd_replication_uploaded_bytes",
            "Bytes sent to the destination (resumed uploads send only what was missing).",
            labels=ll,
        )
        uploads = CounterMetricFamily(
            "adaptd_replication_uploads",
            "Checkpoint uploads by result: ok, failed (retried with backoff), skipped "
            "(deleted locally first, or already there).",
            labels=[*ll, "result"],
        )
        yields = CounterMetricFamily(
            "adaptd_replication_yields",
            "Times an upload paused because a job was saving on the same disk.",
            labels=ll,
        )
        rate = GaugeMetricFamily(
            "adaptd_replication_throughput_bytes_per_second",
            "Bytes per second sent to the destination over the last few seconds.",
            labels=["destination"],
        )
        for r in rows:
            lv = [r.destination, r.job]
            pending_bytes.add_metric(lv, r.pending_bytes)
            pending.add_metric(lv, r.pending_uploads)
            behind.add_metric(lv, r.seconds_behind)
            _add(last, lv, r.last_step)
            sent.add_metric(lv, r.uploaded_bytes)
            uploads.add_metric([*lv, "ok"], r.uploads)
            uploads.add_metric([*lv, "failed"], r.failures)
            uploads.add_metric([*lv, "skipped"], r.skipped)
            yields.add_metric(lv, r.yields)
        for name, bps in sorted(throughput.items()):
            rate.add_metric([name], bps)
        yield from (pending_bytes, pending, behind, last, sent, uploads, yields, rate)


def _add(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: object) -> None:
    """Add a sample unless the figure is unknown (``None``): unknown is absent, not 0."""
    if value is None:
        return
    family.add_metric(labels, float(value))  # type: ignore[arg-type]
