"""The metrics rendered at scrape time: the host's GPUs, storage and memory from the
newest telemetry snapshot, and the Replicator's per-destination figures.

Rendered when Prometheus scrapes, not kept as series, so a GPU or mount that
disappears stops being exported instead of freezing at its last value, and the
replication lag keeps growing between events. :class:`adaptd.metrics.exporter.Metrics`
registers both collectors in its registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adaptd.core.snapshot import Snapshot, StorageSample

if TYPE_CHECKING:
    from adaptd.protocol.admin import ReplicationInfo

__all__ = ["JOB", "ReplicationCollector", "ReplicationView", "SnapshotCollector"]

#: The per-job label (not ``job``: Prometheus attaches its own ``job`` label).
JOB = "job_id"
#: What the Replicator shows the metrics: its status rows and each destination's throughput.
ReplicationView = tuple["list[ReplicationInfo]", Mapping[str, float]]


class SnapshotCollector(Collector):
    """Renders the newest snapshot's GPU, storage and host figures at scrape time."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.state: tuple[int, int] = (0, 0)

    def describe(self) -> Iterable[Metric]:
        return list(self._families(Snapshot(time=0.0)))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self.snapshot)

    def _families(self, snap: Snapshot | None) -> Iterator[Metric]:
        gl, sl = ["gpu", "uuid"], ["target", "mountpoint"]
        gpu = [(GaugeMetricFamily(name, text, labels=gl), attr) for name, text, attr in GPU_GAUGES]
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
        storage = [
            (GaugeMetricFamily(name, text, labels=sl), value)
            for name, text, value in STORAGE_GAUGES
        ]
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
                for family, attr in gpu:
                    _add(family, lv, getattr(g, attr))
                _add(ecc, [*lv, "corrected"], g.ecc_corrected)
                _add(ecc, [*lv, "uncorrected"], g.ecc_uncorrected)
                _add(pending, [*lv, "retired_pages"], g.retired_pages_pending)
                _add(pending, [*lv, "remapped_rows"], g.remapped_rows_pending)
            for s in snap.storage:
                lv = [s.target, s.mountpoint]
                for family, value in storage:
                    _add(family, lv, value(s))
            if snap.host is not None and snap.host.mem_available_bytes is not None:
                host_mem.add_metric([], snap.host.mem_available_bytes)
        yield from (family for family, _ in gpu)
        yield from (ecc, pending)
        yield from (family for family, _ in storage)
        yield from (host_mem, state_err, state_drop)


#: Per-GPU gauges: the series, its help, the :class:`~adaptd.core.snapshot.GpuSample` field.
GPU_GAUGES = (
    ("adaptd_gpu_utilization_ratio", "GPU SM utilisation (0..1).", "util_sm"),
    ("adaptd_gpu_memory_utilization_ratio", "GPU memory-controller utilisation.", "util_mem"),
    ("adaptd_gpu_memory_used_bytes", "GPU memory in use.", "mem_used_bytes"),
    ("adaptd_gpu_memory_total_bytes", "GPU memory installed.", "mem_total_bytes"),
    ("adaptd_gpu_power_watts", "GPU power draw.", "power_w"),
    ("adaptd_gpu_temperature_celsius", "GPU core temperature.", "temperature_c"),
)
#: Per-storage-target gauges: the series, its help, its value from a
#: :class:`~adaptd.core.snapshot.StorageSample`.
STORAGE_GAUGES: tuple[tuple[str, str, Callable[[StorageSample], float | None]], ...] = (
    ("adaptd_storage_busy_ratio", "Fraction of time the storage device was busy.",
     lambda s: s.busy_fraction),
    ("adaptd_storage_write_latency_seconds", "Mean time per write operation.",
     lambda s: s.write_latency_s),
    ("adaptd_storage_write_bytes_per_second", "Write throughput over the last sampling interval.",
     lambda s: s.write_bytes_per_s),
    ("adaptd_storage_saves_in_flight", "Jobs with a save in flight on the target.",
     lambda s: len(s.writing_jobs)),
)  # fmt: skip


class ReplicationCollector(Collector):
    """Renders the Replicator's status rows at scrape time."""

    def __init__(self, source: Callable[[], ReplicationView] | None = None) -> None:
        self.source = source

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
