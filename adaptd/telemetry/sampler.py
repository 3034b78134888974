"""The sampling loop: the registered telemetry sources into one frozen :class:`Snapshot`.

:class:`Sampler` iterates its sources (:class:`~adaptd.telemetry.source.Sources`:
anything with ``collect(snapshot, sampling)``, the built-in GPUs, storage and host
included), each in its own guard: a source that raises is counted, logged once per
exception type, and leaves its part of the snapshot as it was; the others go on. It
keeps a bounded ring buffer of past snapshots for trends.

It fits the daemon's seams without a thread of its own (``adaptd serve`` wires it
this way in :mod:`adaptd.daemon.service_parts`)::

    sampler = Sampler.default()                 # real NVML (or degraded), /proc, /sys
    table = JobTable()                          # the registry's records, to be
    jobs = RegistryView(table)                  # read through this view
    build(options, Seams(jobs=table,
          snapshot_source=sampler.latest,       # newest snapshot, no I/O
          tick_hooks=[lambda now: sampler.tick(now, jobs=jobs.processes)]))

``tick(now, jobs=...)`` samples at most once per ``interval`` against a monotonic
deadline (a late tick does not make the next one early), asking ``jobs`` for each
job's checkpoint directory and pids only when it samples; :meth:`run` is the same
loop for a thread of its own, and :meth:`set_jobs` gives a sampler without a
daemon a fixed set of jobs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any

from adaptd.core.snapshot import GpuSample, Snapshot
from adaptd.telemetry.gpus import GpuJobs, Gpus, GpuSource
from adaptd.telemetry.host import Host, ProcessInfo, process_info
from adaptd.telemetry.once import OnceLog
from adaptd.telemetry.source import JobInfo, Sampling, Source, Sources
from adaptd.telemetry.storage import Storage

__all__ = [
    "HISTORY",
    "GpuSource",
    "JobInfo",
    "JobSource",
    "Sampler",
]

log = logging.getLogger(__name__)

#: Snapshots kept (5 minutes at 1 Hz).
HISTORY = 300


#: Where a job's :class:`JobInfo` (or its ``(checkpoint_dir, pids)``) comes from:
#: :meth:`adaptd.daemon.jobs.table.RegistryView.processes` in the daemon.
JobSource = Callable[[], Mapping[str, "JobInfo | tuple[str, tuple[int, ...]]"]]


class Sampler:
    """Builds snapshots from the sources; see the module docstring for the wiring.

    ``nvml``, ``storage``, ``host``: the built-in sources, registered first when given
    (as ``gpu`` and ``gpu_jobs``, ``storage``, ``host``); ``sources``: more, by name, in
    order (each a :class:`~adaptd.telemetry.source.Source`). ``processes`` tells a
    pid's parent (psutil by default). Raises :class:`ValueError` for an ``interval``
    or ``history`` that is not positive, or a source name used twice.
    """

    def __init__(
        self,
        *,
        nvml: GpuSource | None = None,
        storage: Storage | None = None,
        host: Host | None = None,
        sources: Mapping[str, Source] | None = None,
        interval: float = 1.0,
        history: int = HISTORY,
        processes: Callable[[int], ProcessInfo | None] = process_info,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"sampler interval must be > 0 seconds, got {interval!r}")
        if history < 1:
            raise ValueError(f"sampler history must be >= 1 snapshot, got {history!r}")
        self.nvml = nvml
        self.sources = Sources()
        if nvml is not None:
            self.sources.register("gpu", Gpus(nvml))
            self.sources.register("gpu_jobs", GpuJobs(processes))
        if storage is not None:
            self.sources.register("storage", storage)
        if host is not None:
            self.sources.register("host", host)
        for name, source in (sources or {}).items():
            self.sources.register(name, source)
        self.interval = float(interval)
        self.clock = clock
        self.history: deque[Snapshot] = deque(maxlen=history)
        self.failures: Counter[str] = Counter()
        self.once = OnceLog(log)
        self.samples = 0
        self.draining = False
        self._jobs: dict[str, JobInfo] = {}
        self._latest = Snapshot(time=clock())
        self._next: float | None = None

    @classmethod
    def default(cls, *, interval: float = 1.0, nvml_library: Any | None = None) -> Sampler:
        """The daemon's sources: NVML (degraded to no GPUs when unusable), the storage
        targets (psutil, /proc, /sys) and the host. A new source of the daemon's is one
        more entry of ``sources=`` here."""
        from adaptd.telemetry import nvml

        return cls(nvml=nvml.open(nvml_library), storage=Storage(), host=Host(), interval=interval)

    # ---------------------------------------------------------------- jobs

    def set_jobs(self, jobs: Mapping[str, JobInfo | tuple[str, tuple[int, ...]]]) -> None:
        """Replace the known jobs: {job: JobInfo or (checkpoint_dir, pids)}."""
        self._jobs = {
            job: info if isinstance(info, JobInfo) else JobInfo(info[0], tuple(info[1]))
            for job, info in jobs.items()
        }

    @property
    def jobs(self) -> Mapping[str, JobInfo]:
        """The jobs of the newest sample (or of :meth:`set_jobs`)."""
        return dict(self._jobs)

    # ---------------------------------------------------------------- sampling

    def latest(self) -> Snapshot:
        """The newest snapshot (no I/O): the daemon's ``snapshot_source``."""
        return self._latest

    def tick(self, now: float, jobs: JobSource | None = None) -> Snapshot | None:
        """Sample if the deadline has come (a daemon tick hook); the new snapshot or None.

        ``jobs``: the jobs to map GPUs and disks to, asked only when a sample is due
        (``None``: the jobs known already). Deadlines advance by whole intervals, so
        a tick a little late does not shift the grid, and a long stall skips missed
        samples instead of bursting.
        """
        if self._next is not None and now < self._next - 0.05 * self.interval:
            return None
        if jobs is not None:
            self.set_jobs(jobs())
        snap = self.sample(now)
        if self._next is None:
            self._next = now + self.interval
        else:
            missed = max(0, int((now - self._next) // self.interval))
            self._next += (missed + 1) * self.interval
        return snap

    def run(self, stop: threading.Event) -> None:
        """Sample every ``interval`` until ``stop`` is set (for a thread of its own)."""
        while not stop.is_set():
            self.tick(self.clock())
            assert self._next is not None
            stop.wait(max(0.0, self._next - self.clock()))

    def sample(self, now: float) -> Snapshot:
        """Collect every source now, in order, each in its own guard; store and return the
        snapshot."""
        sampling = Sampling(now=now, jobs=self._jobs, draining=self.draining)
        snap = Snapshot(time=now)
        for name, source in self.sources:
            snap = self._collect(name, source, snap, sampling)
        self.history.append(snap)
        self._latest = snap
        self.samples += 1
        return snap

    def _collect(self, name: str, source: Source, snap: Snapshot, sampling: Sampling) -> Snapshot:
        """``source``'s figures added to ``snap``; ``snap`` as it was when it raises."""
        try:
            return source.collect(snap, sampling)
        except Exception as exc:  # one failing source never stops the others
            self.failures[name] += 1
            self.once(
                (name, type(exc).__name__),
                logging.WARNING,
                "telemetry: the %s source failed (%s: %s); logged once per error type, "
                "counted in failures",
                name,
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            return snap

    def gpus_of_job(self, job: str, snapshot: Snapshot | None = None) -> tuple[GpuSample, ...]:
        """The GPUs whose processes belong to ``job`` in ``snapshot`` (default: the latest)."""
        snap = snapshot or self._latest
        return tuple(g for g in snap.gpus if job in g.jobs)

    def close(self) -> None:
        """Release what the sources hold (NVML): each one's ``close()``, where it has one."""
        for _, source in self.sources:
            close = getattr(source, "close", None)
            if callable(close):
                close()
