"""The sampling loop: GPUs, storage and host into one frozen :class:`Snapshot`.

:class:`Sampler` owns the three sources (:mod:`.nvml`, :mod:`.storage`,
:mod:`.host`), calls each in its own guard (a source that raises is counted,
logged once per exception type, and leaves its part of the snapshot empty; the
others go on), maps GPU processes to jobs, and keeps a bounded ring buffer of
past snapshots for trends.

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

import dataclasses
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from adaptd.core.snapshot import GpuSample, HostSample, Snapshot, StorageSample
from adaptd.telemetry.host import Host, ProcessInfo, process_info
from adaptd.telemetry.once import OnceLog
from adaptd.telemetry.storage import Storage

__all__ = [
    "HISTORY",
    "MAX_PARENT_DEPTH",
    "GpuSource",
    "JobInfo",
    "JobSource",
    "Sampler",
]

log = logging.getLogger(__name__)

#: Snapshots kept (5 minutes at 1 Hz).
HISTORY = 300
#: Parent links followed when mapping a GPU process to a job's pid.
MAX_PARENT_DEPTH = 16


class GpuSource(Protocol):
    def sample(self) -> tuple[GpuSample, ...]: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the sampler needs to know about a job."""

    checkpoint_dir: str = ""
    pids: tuple[int, ...] = ()


#: Where a job's :class:`JobInfo` (or its ``(checkpoint_dir, pids)``) comes from:
#: :meth:`adaptd.daemon.jobs.view.RegistryView.processes` in the daemon.
JobSource = Callable[[], Mapping[str, "JobInfo | tuple[str, tuple[int, ...]]"]]


class Sampler:
    """Builds snapshots from the sources; see the module docstring for the wiring.

    ``nvml``/``storage``/``host`` may be ``None`` to leave that part out;
    ``processes`` tells a pid's parent (psutil by default).
    Raises :class:`ValueError` for an ``interval`` or ``history`` that is not positive.
    """

    def __init__(
        self,
        *,
        nvml: GpuSource | None = None,
        storage: Storage | None = None,
        host: Host | None = None,
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
        self.storage = storage
        self.host = host
        self.interval = float(interval)
        self.processes = processes
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
        """Real sources: NVML (degraded to no GPUs when unusable), psutil, /proc and /sys."""
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
        """Sample every source now, each in its own guard; store and return the snapshot."""
        jobs = self._jobs
        gpus: tuple[GpuSample, ...] = ()
        storage: tuple[StorageSample, ...] = ()
        host: HostSample | None = None
        if self.nvml is not None:
            gpus = self._guard("gpu", self.nvml.sample, ())
            if gpus and jobs:
                gpus = self._guard("gpu_jobs", lambda: self.map_jobs(gpus), gpus)
        if self.storage is not None and jobs:
            dirs = {j: i.checkpoint_dir for j, i in jobs.items() if i.checkpoint_dir}
            storage = self._guard("storage", lambda: self.storage.sample(dirs, now), ())
        if self.host is not None:
            host = self._guard("host", lambda: self.host.sample(self.draining), None)
        snap = Snapshot(time=now, gpus=gpus, storage=storage, host=host)
        self.history.append(snap)
        self._latest = snap
        self.samples += 1
        return snap

    def _guard(self, source: str, fn: Callable[[], Any], fallback: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # one failing source never stops the others
            self.failures[source] += 1
            self.once(
                (source, type(exc).__name__),
                logging.WARNING,
                "telemetry: the %s source failed (%s: %s); logged once per error type, "
                "counted in failures",
                source,
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            return fallback

    def map_jobs(self, gpus: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
        """Fill each GPU's ``jobs``: a process belongs to a job when it, or a parent, is a job pid.

        A rank's hello names its own pid, but the process NVML sees may be a child
        (a launcher that forks workers) or the rank itself.
        """
        owner: dict[int, str] = {}
        for job, info in self._jobs.items():
            for pid in info.pids:
                owner[pid] = job
        cache: dict[int, str | None] = {}
        out = []
        for g in gpus:
            names = sorted({n for pid in g.pids if (n := self._owner(pid, owner, cache))})
            out.append(dataclasses.replace(g, jobs=tuple(names)) if names else g)
        return tuple(out)

    def _owner(
        self, pid: int, owner: Mapping[int, str], cache: dict[int, str | None]
    ) -> str | None:
        chain = []
        found: str | None = None
        p: int | None = pid
        for _ in range(MAX_PARENT_DEPTH):
            if p is None or p <= 1:
                break
            if p in cache:
                found = cache[p]
                break
            chain.append(p)
            if p in owner:
                found = owner[p]
                break
            info = self.processes(p)
            p = info.ppid if info is not None else None
        for c in chain:
            cache[c] = found
        return found

    def gpus_of_job(self, job: str, snapshot: Snapshot | None = None) -> tuple[GpuSample, ...]:
        """The GPUs whose processes belong to ``job`` in ``snapshot`` (default: the latest)."""
        snap = snapshot or self._latest
        return tuple(g for g in snap.gpus if job in g.jobs)

    def close(self) -> None:
        """Release NVML."""
        if self.nvml is not None:
            self.nvml.close()
