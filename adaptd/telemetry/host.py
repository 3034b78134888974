"""The host as psutil sees it: memory, load, disk I/O counters, processes.

The only module that imports psutil (as :mod:`.nvml` is for pynvml). psutil reads
procfs at ``psutil.PROCFS_PATH`` (``/proc``), a setting of the whole process: the
recorded-host tests point it at a fixture tree so that psutil's own parsers read the
recorded files, and a daemon in a container could point it at the host's procfs.
Hand-parsed procfs files remain only where psutil has nothing (mount IDs and options
in ``mountinfo``, NFS ``mountstats``: :mod:`.storage`) and where psutil costs too
much to be asked every second for every rank (:func:`process_info`); they are read
under the same root, :func:`procfs`.

An async TensorFlow save first copies the whole training state into host memory:
a save needs that much available memory, or it pushes the host into swap or the
OOM killer. Available memory (the kernel's ``MemAvailable``, psutil's estimate on
kernels before 3.14) is the figure to compare with a job's state size. CPU load is
the 1-minute load average per core: the save's writer thread competes with the
input pipeline for it.

Sources are injected with real defaults (``memory=psutil.virtual_memory``...), so
tests pass recorded figures; a source that fails gives ``None`` figures and one log
line, never an exception out of :meth:`Host.sample`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from adaptd.core.snapshot import HostSample, Snapshot
from adaptd.telemetry.once import OnceLog
from adaptd.telemetry.source import Sampling

log = logging.getLogger(__name__)


def procfs() -> Path:
    """The procfs root psutil reads (``psutil.PROCFS_PATH``, normally ``/proc``)."""
    return Path(psutil.PROCFS_PATH)


# ------------------------------------------------------------------ disks


@dataclass(frozen=True, slots=True)
class DiskCounters:
    """Cumulative write counters of one block device (``/proc/diskstats``, via psutil)."""

    writes: int
    bytes_written: int
    write_ms: int  # time spent writing
    io_ms: int  # time the device was busy


def disk_counters() -> dict[str, DiskCounters]:
    """Per block device (partitions and dm devices too), its write counters.

    Raw kernel counters (``nowrap=False``): a counter that went back (a device
    re-attached) stays visible as such instead of being patched up by psutil.
    Raises OSError when the counters cannot be read.
    """
    try:
        raw = psutil.disk_io_counters(perdisk=True, nowrap=False)
    except (NotImplementedError, RuntimeError, ValueError) as exc:  # no diskstats, odd lines
        raise OSError(f"disk counters unavailable: {exc}") from exc
    return {
        name: DiskCounters(c.write_count, c.write_bytes, c.write_time, c.busy_time)
        for name, c in (raw or {}).items()
    }


# ------------------------------------------------------------------ processes


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """What the daemon asks about a process: who started it, when, and whether it runs."""

    pid: int
    ppid: int
    start_time: float  # seconds after boot (unchanged by wall-clock steps)
    status: str  # psutil.STATUS_* ("running", "sleeping", "zombie", ...)

    @property
    def running(self) -> bool:
        """False for a zombie (exited, not yet reaped) or a dead task."""
        return self.status not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


#: ``/proc/<pid>/stat``'s state letter as psutil names it (its ``STATUS_*`` strings).
_STATES = {
    "R": psutil.STATUS_RUNNING,
    "S": psutil.STATUS_SLEEPING,
    "D": psutil.STATUS_DISK_SLEEP,
    "T": psutil.STATUS_STOPPED,
    "t": psutil.STATUS_TRACING_STOP,
    "Z": psutil.STATUS_ZOMBIE,
    "X": psutil.STATUS_DEAD,
    "x": psutil.STATUS_DEAD,
    "K": "wake-kill",
    "W": psutil.STATUS_WAKING,
    "I": psutil.STATUS_IDLE,
    "P": psutil.STATUS_PARKED,
}
_TICKS = os.sysconf("SC_CLK_TCK")


def process_info(pid: int) -> ProcessInfo | None:
    """``pid``'s parent, start time and status; ``None`` when there is no such process
    or it cannot be read (another pid namespace, ``hidepid``).

    One read of ``/proc/<pid>/stat`` (under :func:`procfs`), parsed here: the daemon
    asks it for every rank each second (:mod:`adaptd.daemon.jobs.liveness`), and
    ``psutil.Process`` read five files for it, ``/proc/stat`` twice for the boot time
    (at 512 ranks, the most of the daemon's CPU: docs/scale.md). The start time is
    the kernel's start ticks over the tick rate, which is what psutil's create time
    less its boot time comes to: seconds after boot, unchanged by wall-clock steps,
    rounded so that two reads never differ."""
    try:
        with open(f"{psutil.PROCFS_PATH}/{int(pid)}/stat", "rb") as f:  # no pathlib: 2x
            raw = f.read()
        # the command name is in parentheses and may hold anything: fields after it
        fields = raw[raw.rindex(b")") + 2 :].split()
        state, ppid, ticks = fields[0].decode(), int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None
    return ProcessInfo(pid, ppid, round(ticks / _TICKS, 3), _STATES.get(state, state))


class ProcessReads:
    """:func:`process_info` read once per moment for all who ask: the daemon's liveness
    check and its stall watch both ask about every rank at each tick, a few
    microseconds apart (at 512 ranks, two reads per rank a second were a fifth of the
    daemon's CPU, docs/scale.md). A read younger than ``max_age_s`` is answered again;
    the first call past it forgets every read (so nothing is kept for pids gone).

    ``max_age_s`` stays well under the daemon's tick (1 s): one tick's readers share a
    read, the next tick reads anew. ``read`` is the source (tests pass their own);
    ``clock`` is monotonic seconds, the real one even where the daemon's loop runs on a
    test's clock, since what it bounds is the age of a read of the real ``/proc``.
    """

    def __init__(
        self,
        read: Callable[[int], ProcessInfo | None] = process_info,
        *,
        max_age_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not max_age_s >= 0:
            raise ValueError(f"max_age_s must be >= 0 seconds, got {max_age_s!r}")
        self.read, self.max_age_s, self.clock = read, max_age_s, clock
        self._since = -float("inf")  # when the reads kept were begun
        self._reads: dict[int, ProcessInfo | None] = {}

    def __call__(self, pid: int) -> ProcessInfo | None:
        now = self.clock()
        if now - self._since > self.max_age_s:
            self._since, self._reads = now, {}
        elif pid in self._reads:
            return self._reads[pid]
        info = self._reads[pid] = self.read(pid)
        return info


def pid_exists(pid: int) -> bool:
    """Whether ``pid`` exists at all, even where its procfs entry is hidden (``kill(pid, 0)``)."""
    return psutil.pid_exists(pid)


# ------------------------------------------------------------------ memory and load


class Host:
    """Samples :class:`~adaptd.core.snapshot.HostSample`: memory and load per core. A
    telemetry source (:mod:`adaptd.telemetry.source`): it fills ``Snapshot.host``.

    ``memory`` returns an object with ``available`` and ``total`` bytes (psutil's
    ``svmem``); ``loadavg`` the 1, 5 and 15-minute load averages.
    """

    def __init__(
        self,
        *,
        memory: Callable[[], Any] = psutil.virtual_memory,
        loadavg: Callable[[], tuple[float, float, float]] = psutil.getloadavg,
        cpus: int | None = None,
    ) -> None:
        self.memory = memory
        self.loadavg = loadavg
        self.cpus = cpus or os.cpu_count() or 1
        self.once = OnceLog(log)

    def sample(self, draining: bool = False) -> HostSample:
        """Available/total memory and load per core; ``None`` where a source cannot say."""
        available = total = None
        try:
            mem = self.memory()
            available, total = int(mem.available), int(mem.total)
        except (OSError, psutil.Error, KeyError, ValueError) as exc:
            self.once("memory", logging.WARNING, "host: cannot read memory figures: %s", exc)
        load = None
        try:
            load = float(self.loadavg()[0]) / self.cpus
        except (OSError, ValueError, IndexError) as exc:
            self.once("loadavg", logging.WARNING, "host: cannot read the load average: %s", exc)
        return HostSample(
            mem_available_bytes=available, mem_total_bytes=total, cpu_load=load, draining=draining
        )

    def collect(self, snapshot: Snapshot, sampling: Sampling) -> Snapshot:
        """The telemetry source: ``snapshot`` with this host's :meth:`sample`."""
        return replace(snapshot, host=self.sample(sampling.draining))


__all__ = [
    "DiskCounters",
    "Host",
    "ProcessInfo",
    "ProcessReads",
    "disk_counters",
    "pid_exists",
    "process_info",
    "procfs",
]
