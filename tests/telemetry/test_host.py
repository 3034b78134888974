"""The host through psutil: a recorded /proc, this machine's, and failing sources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from adaptd.telemetry import host as h
from adaptd.telemetry.host import Host

from .conftest import GPUHOST


def recorded_loadavg() -> tuple[float, float, float]:
    """The recorded host's load averages (psutil asks libc, not procfs, for these)."""
    one, five, fifteen = (float(x) for x in (GPUHOST / "loadavg").read_text().split()[:3])
    return one, five, fifteen


@pytest.mark.filterwarnings("ignore:shared, inactive memory:RuntimeWarning")  # a short recording
def test_recorded_host(procfs) -> None:
    procfs(GPUHOST)
    s = Host(loadavg=recorded_loadavg, cpus=224).sample()
    assert s.mem_total_bytes == 2113255204 * 1024
    assert s.mem_available_bytes == 1823092112 * 1024
    assert s.cpu_load == 38.12 / 224
    assert s.draining is False


def test_old_kernel_without_memavailable_gets_psutils_estimate(tmp_path: Path, procfs) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 200 kB\n"
        "Shmem: 0 kB\nActive: 300 kB\nInactive: 300 kB\n"
    )
    procfs(tmp_path)
    s = Host(loadavg=recorded_loadavg, cpus=2).sample()
    # psutil's fallback without the LRU file figures (kernels before 2.6.28): free + cached
    assert s.mem_available_bytes == 300 * 1024
    assert s.mem_total_bytes == 1000 * 1024


def test_this_machine() -> None:
    s = Host().sample(draining=True)
    assert s.mem_total_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < s.mem_available_bytes <= s.mem_total_bytes
    # the kernel updates the load average every 5 s: equal, or one update apart
    assert abs(s.cpu_load * os.cpu_count() - os.getloadavg()[0]) < 1.0
    assert s.draining


class Broken:
    """A source that fails like a missing or unreadable file."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self):
        self.calls += 1
        raise FileNotFoundError("[Errno 2] No such file or directory: '/proc/meminfo'")


def test_failing_sources_are_none_and_logged_once(tmp_path: Path, procfs, caplog) -> None:
    procfs(tmp_path / "none")  # psutil finds no meminfo there
    loadavg = Broken()
    host = Host(loadavg=loadavg, cpus=4)
    for _ in range(3):
        s = host.sample()
        assert (s.mem_available_bytes, s.mem_total_bytes, s.cpu_load) == (None, None, None)
    assert loadavg.calls == 3
    assert len(caplog.records) == 2  # memory and load, once each


# ------------------------------------------------------------------ processes


def test_a_process_its_parent_start_time_and_status() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        info = h.process_info(child.pid)
        assert info is not None and info.pid == child.pid and info.ppid == os.getpid()
        assert info.running and info.status in (psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING)
        mine = h.process_info(os.getpid())
        assert mine is not None and 0 < mine.start_time <= info.start_time
        assert h.process_info(child.pid) == info  # the same figures on every read
    finally:
        child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
    zombie = h.process_info(child.pid)
    assert zombie is not None and zombie.status == psutil.STATUS_ZOMBIE and not zombie.running
    child.wait()
    assert h.process_info(child.pid) is None
    assert not h.pid_exists(child.pid) and h.pid_exists(os.getpid())


def test_process_reads_are_shared_within_a_moment_and_fresh_after_it() -> None:
    """The daemon's two watchers ask about each rank a few microseconds apart: one read
    of /proc for both; a read older than max_age_s is made again, and a pid that died
    between two ticks is seen gone at the next."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    reads: list[int] = []
    now = [10.0]

    def read(pid: int) -> h.ProcessInfo | None:
        reads.append(pid)
        return h.process_info(pid)

    shared = h.ProcessReads(read, max_age_s=0.25, clock=lambda: now[0])
    try:
        first = shared(child.pid)
        assert first is not None and first.running
        now[0] += 0.1
        assert shared(child.pid) == first and shared(os.getpid()) is not None
        assert reads == [child.pid, os.getpid()]  # the child's, once
    finally:
        child.kill()
        child.wait()
    assert shared(child.pid) == first  # within the moment: the read of it
    now[0] += 1.0  # the next tick
    assert shared(child.pid) is None
    assert reads == [child.pid, os.getpid(), child.pid]
    with pytest.raises(ValueError, match="max_age_s"):
        h.ProcessReads(read, max_age_s=-1.0)


def test_a_recorded_process_table(tmp_path: Path, procfs) -> None:
    """psutil reads /proc/<pid>/stat under the procfs root: a recorded launcher and rank."""
    for pid, ppid, comm, state, ticks in ((4100, 1, "torchrun", "S", 5000),
                                          (4107, 4100, "python (rank 0)", "R", 5250)):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        fields = [state, str(ppid)] + ["0"] * 17 + [str(ticks)] + ["0"] * 30
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (tmp_path / "stat").write_text("cpu  1 2 3 4\nbtime 1700000000\n")
    procfs(tmp_path)
    rank = h.process_info(4107)
    ticks = os.sysconf("SC_CLK_TCK")
    assert rank == h.ProcessInfo(4107, 4100, round(5250 / ticks, 3), psutil.STATUS_RUNNING)
    assert h.process_info(4100).ppid == 1
    assert h.process_info(4242) is None


def test_disk_counters_of_a_recorded_host(procfs) -> None:
    procfs(GPUHOST)
    disks = h.disk_counters()
    assert {"nvme0n1", "nvme0n1p1", "dm-0", "sda"} <= set(disks)
    nvme = disks["nvme0n1"]
    assert (nvme.writes, nvme.bytes_written, nvme.write_ms, nvme.io_ms) == (
        9824403,
        1282091232 * 512,
        12381029,
        6123390,
    )


def test_no_disk_counters_is_an_oserror(tmp_path: Path, procfs) -> None:
    (tmp_path / "diskstats").write_text("8 0 sda 1 2\n")  # a line no kernel writes
    procfs(tmp_path)
    with pytest.raises(OSError, match="disk counters unavailable"):
        h.disk_counters()
