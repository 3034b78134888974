"""The multi-worker harness itself: a hung worker fails the test instead of hanging it,
and leaves no process behind."""

from __future__ import annotations

import os
import time

import pytest

from multiworker.cluster import Cluster


def test_a_hung_worker_fails_the_wait_and_is_killed_with_its_children(tmp_path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    cluster = Cluster(tmp_path / "run", 2, script).start()
    deadline = time.monotonic() + 30
    while not all("child" in cluster.log_path(r).read_text() for r in range(2)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    children = [int(cluster.log_path(r).read_text().split()[1]) for r in range(2)]
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"worker\(s\) \[0, 1\] still running after 1s"):
        cluster.wait(timeout=1)
    assert time.monotonic() - t0 < 15
    for proc in cluster.procs:
        assert proc.poll() is not None
    for pid in children:  # the whole process group went
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, f"child {pid} survived"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by its dead parent's reaper) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
