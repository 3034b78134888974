"""Host memory and CPU load, read from ``/proc`` (the only reader of these figures).

An async TensorFlow save first copies the whole training state into host memory:
a save needs that much available memory, or it pushes the host into swap or the
OOM killer. ``MemAvailable`` (the kernel's estimate of what can be allocated
without swapping) is the figure to compare with a job's state size. CPU load is
the 1-minute load average per core: the save's writer thread competes with the
input pipeline for it.

``proc`` is injected (tests pass recorded files); a missing file gives ``None``
figures and one log line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from adaptd.snapshot import HostSample
from adaptd.telemetry.once import OnceLog

__all__ = [
    "Host",
    "parse_meminfo",
]

log = logging.getLogger(__name__)


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per key (the kernel prints kB = KiB)."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        f = rest.split()
        if not f:
            continue
        try:
            value = int(f[0])
        except ValueError:
            continue
        out[key.strip()] = value * 1024 if len(f) > 1 and f[1] == "kB" else value
    return out


class Host:
    """Samples :class:`~adaptd.snapshot.HostSample` from procfs."""

    def __init__(self, proc: str | os.PathLike[str] = "/proc", cpus: int | None = None) -> None:
        self.proc = Path(proc)
        self.cpus = cpus or os.cpu_count() or 1
        self.once = OnceLog(log)

    def sample(self, draining: bool = False) -> HostSample:
        """Available/total memory and load per core; ``None`` where procfs cannot say."""
        available = total = None
        try:
            mem = parse_meminfo((self.proc / "meminfo").read_text())
            total = mem.get("MemTotal")
            # kernels before 3.14 lack MemAvailable: free + page cache is the old estimate
            available = mem.get("MemAvailable")
            if available is None and "MemFree" in mem:
                available = mem["MemFree"] + mem.get("Cached", 0) + mem.get("Buffers", 0)
        except OSError as exc:
            self.once("meminfo", logging.WARNING, "host: cannot read meminfo: %s", exc)
        load = None
        try:
            load = float((self.proc / "loadavg").read_text().split()[0]) / self.cpus
        except (OSError, ValueError, IndexError) as exc:
            self.once("loadavg", logging.WARNING, "host: cannot read loadavg: %s", exc)
        return HostSample(
            mem_available_bytes=available, mem_total_bytes=total, cpu_load=load, draining=draining
        )
