"""Host memory and load: a recorded /proc, this machine's, and missing files."""

from __future__ import annotations

import os
from pathlib import Path

from adaptd.telemetry.host import Host, parse_meminfo

GPUHOST = Path(__file__).resolve().parents[1] / "fixtures" / "proc" / "gpuhost"


def test_recorded_host() -> None:
    h = Host(GPUHOST, cpus=224).sample()
    assert h.mem_total_bytes == 2113255204 * 1024
    assert h.mem_available_bytes == 1823092112 * 1024
    assert h.cpu_load == 38.12 / 224
    assert h.draining is False


def test_old_kernel_without_memavailable(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 200 kB\n"
    )
    h = Host(tmp_path, cpus=2).sample()
    assert h.mem_available_bytes == 310 * 1024
    assert h.cpu_load is None  # no loadavg


def test_unitless_meminfo_lines_are_counts() -> None:
    assert parse_meminfo("HugePages_Total:       4\nHugepagesize: 2048 kB\n") == {
        "HugePages_Total": 4,
        "Hugepagesize": 2048 * 1024,
    }


def test_this_machine() -> None:
    h = Host().sample(draining=True)
    assert h.mem_total_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < h.mem_available_bytes <= h.mem_total_bytes
    # the kernel updates the load average every 5 s: equal, or one update apart
    assert abs(h.cpu_load * os.cpu_count() - os.getloadavg()[0]) < 1.0
    assert h.draining


def test_missing_proc_is_none_and_logged_once(tmp_path: Path, caplog) -> None:
    host = Host(tmp_path / "none", cpus=4)
    for _ in range(3):
        h = host.sample()
        assert (h.mem_available_bytes, h.mem_total_bytes, h.cpu_load) == (None, None, None)
    assert len(caplog.records) == 2  # meminfo and loadavg, once each
