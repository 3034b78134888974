"""The GPUs of a snapshot: NVML's samples, and the jobs owning their processes.

Two telemetry sources (:mod:`adaptd.telemetry.source`), registered one after the
other so that a failure of the second leaves the first's figures in place:

- :class:`Gpus` fills ``Snapshot.gpus`` from a :class:`GpuSource` (the real NVML of
  :mod:`adaptd.telemetry.nvml`, degraded to no GPUs without a driver, or a test's);
- :class:`GpuJobs` fills each GPU's ``jobs``: a process belongs to a job when it, or a
  parent of it, is a pid one of the job's ranks announced (a launcher may fork the
  worker that NVML sees).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol

from adaptd.core.snapshot import GpuSample, Snapshot
from adaptd.telemetry.host import ProcessInfo, process_info
from adaptd.telemetry.source import JobInfo, Sampling

__all__ = ["MAX_PARENT_DEPTH", "GpuJobs", "GpuSource", "Gpus"]

#: Parent links followed when mapping a GPU process to a job's pid.
MAX_PARENT_DEPTH = 16


class GpuSource(Protocol):
    """What :class:`Gpus` reads: NVML's :class:`~adaptd.telemetry.nvml.Nvml` or ``NoGpus``."""

    def sample(self) -> tuple[GpuSample, ...]: ...
    def close(self) -> None: ...


class Gpus:
    """The GPUs as ``nvml`` samples them."""

    def __init__(self, nvml: GpuSource) -> None:
        self.nvml = nvml

    def collect(self, snapshot: Snapshot, sampling: Sampling) -> Snapshot:
        return dataclasses.replace(snapshot, gpus=self.nvml.sample())

    def close(self) -> None:
        """Release NVML."""
        self.nvml.close()


class GpuJobs:
    """Each GPU's ``jobs``, from its processes; ``processes`` tells a pid's parent
    (psutil by default)."""

    def __init__(self, processes: Callable[[int], ProcessInfo | None] = process_info) -> None:
        self.processes = processes

    def collect(self, snapshot: Snapshot, sampling: Sampling) -> Snapshot:
        if not snapshot.gpus or not sampling.jobs:
            return snapshot
        return dataclasses.replace(snapshot, gpus=self.map_jobs(snapshot.gpus, sampling.jobs))

    def map_jobs(
        self, gpus: tuple[GpuSample, ...], jobs: Mapping[str, JobInfo]
    ) -> tuple[GpuSample, ...]:
        """``gpus`` with each one's ``jobs`` filled in: a process belongs to a job when it,
        or a parent, is a pid of ``jobs``.

        A rank's hello names its own pid, but the process NVML sees may be a child
        (a launcher that forks workers) or the rank itself.
        """
        owner: dict[int, str] = {}
        for job, info in jobs.items():
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
