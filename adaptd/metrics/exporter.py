"""Prometheus metrics for the daemon, served where ``metrics.listen`` says.

:class:`Metrics` owns a dedicated :class:`~prometheus_client.CollectorRegistry`
(never the process-global one, so tests and embedded uses do not collide).
:meth:`Metrics.on_event` is a sink of the daemon's events: each becomes the record
the store keeps (:func:`adaptd.state.records.record_of`) for :meth:`~Metrics.on_save`,
:meth:`~Metrics.on_decision` and :meth:`~Metrics.on_failure`; the service feeds
:meth:`~Metrics.on_snapshot` and :meth:`~Metrics.on_rejected`. Event figures (save
times, bytes, counters) are instrumented as they happen; host figures (GPUs,
storage) are rendered at scrape time from the newest snapshot, so a GPU or mount
that disappears stops being exported instead of freezing at its last value.

Names follow the Prometheus conventions: prefix ``adaptd_``, base units
(``_seconds``, ``_bytes``, ``_ratio`` for 0..1 fractions), ``_total`` on counters.
The per-job label is ``job_id``, not ``job``: Prometheus attaches its own ``job``
label to every scraped series, and a clash would rename ours to ``exported_job``.
The save-time histograms (``adaptd_save_blocking_seconds``, ``adaptd_save_durable_seconds``)
also have a ``tier`` label: ``durable`` for a save to the checkpoint directory (every
save of a one-tier job), ``local`` for a two-tier job's save to its local tier only
(docs/tiers.md), created at zero once the job's plan has two tiers; summing over ``tier``
gives all of a job's saves.

Host figures and the replication series are rendered at scrape time by the
collectors of :mod:`adaptd.metrics.scrape`. Tiered storage (the daemon's Replicator,
:mod:`adaptd.tiers.replicator`) adds
``adaptd_replication_*`` series per ``destination`` and ``job_id``: pending bytes and
uploads, seconds behind, bytes uploaded, uploads by result, the newest replicated
step, and per destination the recent throughput and an upload-time histogram. They
are rendered at scrape time from the Replicator's status (``replication``, given
when the metrics are built), so the lag keeps growing between events.

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
import socket
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import ThreadingWSGIServer, generate_latest, make_wsgi_app
from prometheus_client.registry import Collector

from adaptd import __version__, events
from adaptd.core.snapshot import Snapshot
from adaptd.metrics.scrape import JOB, ReplicationCollector, ReplicationView, SnapshotCollector
from adaptd.protocol.job import TIER_NAMES, tier_name
from adaptd.state.records import DecisionRecord, FailureRecord, SaveRecord, record_of

__all__ = [
    "JOB",
    "SAVE_BUCKETS",
    "TIER",
    "Metrics",
    "MetricsError",
    "MetricsServer",
    "ReplicationView",
    "upload_histogram",
]


#: The save-time histograms' ``tier`` label: where the save went (docs/tiers.md); one
#: tier's saves are all ``durable``, a job with two has ``local`` ones beside.
TIER = "tier"

#: Histogram buckets for save times: 1 ms to 10 min, about three per decade.
SAVE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip

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
        replication: Callable[[], ReplicationView] | None = None,
        upload_seconds: Histogram | None = None,
        collectors: Iterable[Collector] = (),
    ) -> None:
        """``replication``: where the ``adaptd_replication_*`` series come from at
        scrape time (the Replicator's rows and throughput; ``None``: no such series).
        ``upload_seconds``: the upload-time histogram the Replicator fills as uploads end
        (made before it by :func:`upload_histogram`; default: a new one).
        ``collectors``: more series rendered at scrape time (the fleet's).
        Raises :class:`ValueError` for a ``slow_save_s`` that is not positive or a
        negative ``job_series_grace_s``."""
        if not slow_save_s > 0:
            raise ValueError(f"slow_save_s must be > 0, got {slow_save_s}")
        if not job_series_grace_s >= 0:
            raise ValueError(f"job_series_grace_s must be >= 0, got {job_series_grace_s}")
        self.slow_save_s = slow_save_s
        #: Seconds an ended job's series stay exported (see the module docstring).
        self.job_series_grace_s = job_series_grace_s
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        Info("adaptd_build", "adaptd version", registry=r).info({"version": version})

        self.save_blocking = Histogram(
            "adaptd_save_blocking_seconds",
            "Time a save blocked the training loop, by tier (local, durable).",
            [JOB, TIER], buckets=SAVE_BUCKETS, registry=r,
        )  # fmt: skip
        self.save_durable = Histogram(
            "adaptd_save_durable_seconds",
            "Time from the save call until the checkpoint was written to its tier: durable "
            "storage, or the local tier (successful saves).",
            [JOB, TIER], buckets=SAVE_BUCKETS, registry=r,
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
        self.durable_every = Gauge(
            "adaptd_job_durable_every",
            "Two tiers: every how many saves (to the local tier) one is made durable; "
            "absent with one tier.",
            [JOB], registry=r,
        )  # fmt: skip
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
        self.restore_fallbacks = Counter(
            "adaptd_restore_fallbacks",
            "Runs that resumed from an older checkpoint because the newest was damaged.",
            [JOB], registry=r,
        )  # fmt: skip
        self.failures = Counter(
            "adaptd_job_failures",
            "Failures observed: the job vanished without a goodbye and resumed from an older step.",
            [JOB], registry=r,
        )  # fmt: skip
        self.stalls = Counter(
            "adaptd_job_stalls",
            "Times the job was found stalled (hung) and its ranks were told to abort and "
            "save just in time.",
            [JOB], registry=r,
        )  # fmt: skip
        self.stall_seconds = Gauge(
            "adaptd_job_stall_detected_seconds",
            "The silence (no step) after which the job's newest stall was declared.",
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
        self._host = SnapshotCollector()
        r.register(self._host)
        self.upload_seconds = upload_seconds if upload_seconds is not None else upload_histogram()
        r.register(self.upload_seconds)
        self._replication = ReplicationCollector(replication)
        r.register(self._replication)
        for collector in collectors:
            r.register(collector)

        self._lock = threading.Lock()
        self._streaks: dict[str, int] = {}
        self._planned_s: dict[str, float] = {}
        self._last_saved: dict[str, float] = {}
        self._incarnations: dict[str, int] = {}
        self._fell_back: dict[str, int] = {}  # job -> the run whose fallback was counted
        self._ending: dict[str, float] = {}  # ended job -> when its series go (event clock)
        self._now = float("-inf")  # the newest time expire() was given

    # ---------------------------------------------------------------- events

    def on_job_started(self, job: str, *, time: float) -> None:
        """A job (re)connected at wall time ``time``; the no-save alert counts from here.

        Its counters and histograms are created at zero now, so the first slow save
        or failure is an *increase* that ``increase()``/``rate()`` can see.
        """
        self.started.labels(job).set(time)
        for metric in (self.save_bytes, self.failures):
            metric.labels(job)
        self._start_tier(job, "durable")
        for result in ("ok", "failed"):
            self.saves.labels(job, result)
        self.bad_streak.labels(job).set(self._streaks.get(job, 0))
        self.paused.labels(job).set(0)

    def _start_tier(self, job: str, tier: str) -> None:
        """Create the job's save-time histograms of ``tier`` at zero (see on_job_started)."""
        for metric in (self.save_blocking, self.save_durable):
            metric.labels(job, tier)

    def on_save(self, rec: SaveRecord, *, counted: bool = True) -> None:
        """A save report arrived (the same record the store keeps).

        Every rank's report feeds the time histograms and the bytes; ``counted=False``
        (another rank already reported this step) keeps it out of the save count and
        the bad-save streak, so four ranks of one failed save are one failure.
        """
        job, tier = rec.job, tier_name(rec.tier)
        self.save_blocking.labels(job, tier).observe(rec.blocking_s)
        if rec.ok:
            self.save_durable.labels(job, tier).observe(rec.durable_s)
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

    def on_upload(self, destination: str, seconds: float) -> None:
        """A checkpoint finished uploading to ``destination`` in ``seconds``."""
        self.upload_seconds.labels(destination).observe(seconds)

    def set_jobs(self, n: int) -> None:
        self.jobs.set(n)

    def set_state_stats(self, *, write_errors: int, dropped_rows: int) -> None:
        """Mirror the store's fault counters (:attr:`adaptd.state.store.Store.write_errors`...)."""
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
            self.save_bytes, self.bad_streak,
            self.last_save, self.started, self.interval_s, self.interval_steps, self.waste,
            self.durable_every, self.step_time, self.paused, self.decisions, self.failures,
            self.restore_fallbacks, self.stalls, self.stall_seconds,
        ):  # fmt: skip
            _remove(metric, job)
        for result in ("ok", "failed"):
            _remove(self.saves, job, result)
        for tier in TIER_NAMES:
            _remove(self.save_blocking, job, tier)
            _remove(self.save_durable, job, tier)
        with self._lock:
            self._streaks.pop(job, None)
            self._planned_s.pop(job, None)
            self._last_saved.pop(job, None)
            self._fell_back.pop(job, None)

    def on_event(self, ev: events.Event) -> None:
        """An :data:`adaptd.events.Sink`: update the metrics from the daemon's event.

        Saves, plans and failures are observed as the records the store keeps
        (:func:`adaptd.state.records.record_of`); urgent save requests are not plans.
        ``adaptd_jobs_connected`` is the registry's count of active jobs, which its
        lifecycle events carry. A lost job keeps its series (it may resume, and the
        no-save alert should fire if it does not); a finished or forgotten one is
        removed after the grace period (:meth:`end_job`).
        """
        rec = record_of(ev)
        if isinstance(rec, SaveRecord):
            assert isinstance(ev, events.SaveReported)
            self.on_save(rec, counted=ev.counted)
        elif isinstance(rec, DecisionRecord) and not rec.urgent:
            self.on_decision(rec)
            if isinstance(ev, events.PlanChanged):
                every = ev.decision.durable_every
                if every is None:
                    _remove(self.durable_every, ev.job)
                else:
                    self.durable_every.labels(ev.job).set(every)
                    self._start_tier(ev.job, "local")
        elif isinstance(rec, FailureRecord):
            self.on_failure(rec)
        elif isinstance(ev, events.JobRegistered):
            with self._lock:
                self._ending.pop(ev.job, None)  # back within its grace period: keep all
            if self._incarnations.get(ev.job) != ev.incarnation:
                self._incarnations[ev.job] = ev.incarnation
                self.on_job_started(ev.job, time=ev.wall)
            if ev.restore_fallback and self._fell_back.get(ev.job) != ev.incarnation:
                self._fell_back[ev.job] = ev.incarnation  # once per run, not per rank
                self.restore_fallbacks.labels(ev.job).inc()
        elif isinstance(ev, events.JobStalled):
            self.stalls.labels(ev.job).inc()
            self.stall_seconds.labels(ev.job).set(ev.silent_s)
        elif isinstance(ev, events.JobFinished | events.JobForgotten):
            # forgotten: a lost job the registry dropped; it will not come back as itself
            self._incarnations.pop(ev.job, None)
            self.end_job(ev.job, time=ev.time)
        active = getattr(ev, "jobs_active", None)
        if active is not None:
            self.jobs.set(active)

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

    def serve(self, host: str, port: int) -> MetricsServer:
        """Start the HTTP endpoint; raises :class:`MetricsError` if it cannot bind."""
        server = MetricsServer(self, host, port)
        server.start()
        return server


def upload_histogram() -> Histogram:
    """The upload-time histogram (``adaptd_replication_upload_seconds``), not yet in a
    registry: made before the Replicator that fills it and the :class:`Metrics` that
    exports it."""
    return Histogram(
        "adaptd_replication_upload_seconds",
        "Time a successful upload of one checkpoint to a destination took.",
        ["destination"], buckets=SAVE_BUCKETS, registry=None,
    )  # fmt: skip


#: How often the endpoint's thread checks whether it should stop: ``stop()`` (and so
#: the daemon's exit) waits at most this long for it. The library's default, 0.5 s,
#: made an idle daemon take half a second or more to exit after SIGTERM.
STOP_POLL_S = 0.05


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not logged (one a few seconds, forever)."""


class MetricsServer:
    """The ``/metrics`` HTTP endpoint on its own daemon thread. ``port=0`` picks one."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._httpd = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen (IPv4 or IPv6, as ``host`` is) and serve on a daemon thread."""

        class Server(ThreadingWSGIServer):
            """ThreadingWSGIServer with the address family of this host."""

        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)  # fmt: skip
            Server.address_family = infos[0][0]
            httpd = make_server(
                infos[0][4][0], self.port, make_wsgi_app(self.metrics.registry), Server,
                handler_class=_QuietHandler,
            )  # fmt: skip
        except OSError as exc:
            raise MetricsError(
                f"metrics.listen {self.host}:{self.port}: cannot listen ({exc.strerror or exc}); "
                'choose another address, or set metrics.listen = "off"'
            ) from None
        thread = threading.Thread(
            target=httpd.serve_forever, args=(STOP_POLL_S,), name="adaptd-metrics", daemon=True
        )
        thread.start()
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
