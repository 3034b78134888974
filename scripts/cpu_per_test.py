"""A pytest plugin that writes each test's wall time and the machine's CPU time during it.

    PYTHONPATH=scripts make test PYTEST_WORKERS= PYTEST_ARGS="-p cpu_per_test"
    # -> one JSON line per test in $CPU_PER_TEST_OUT (default build/cpu-per-test.jsonl):
    #    {"id": nodeid, "wall": seconds, "cpu": core-seconds}

The CPU is the whole machine's busy time from ``/proc/stat`` between the start of a
test's setup and the end of its teardown: the daemons, etcd and the jobs a test starts
count, and so does anything else running, so run it serially (one pytest process) on a
quiet machine. docs/testing.md reads it for where the suite's CPU goes, which modules
mostly wait, and the suite's floor on two cores.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

_out: IO[str] | None = None


def _busy_s() -> float:
    """Core-seconds the machine has been busy since boot (not idle, not waiting on I/O)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def pytest_configure(config: pytest.Config) -> None:
    global _out
    path = Path(os.environ.get("CPU_PER_TEST_OUT", "build/cpu-per-test.jsonl"))
    path.parent.mkdir(parents=True, exist_ok=True)
    _out = path.open("a")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    t0, c0 = time.monotonic(), _busy_s()
    yield
    assert _out is not None
    line = {"id": item.nodeid, "wall": time.monotonic() - t0, "cpu": _busy_s() - c0}
    _out.write(json.dumps(line) + "\n")
    _out.flush()
