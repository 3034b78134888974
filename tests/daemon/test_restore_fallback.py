"""A run that resumed past a damaged checkpoint tells the daemon, which says so.

The hook puts what it skipped into its Hello (``restore_fallback``, see
tests/client/test_intact.py for the hook's side with real checkpoints); the daemon
logs it, shows it in ``adaptd status`` and counts it, once per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from daemon_helpers import Peer
from prometheus_client.parser import text_string_to_metric_families

from adaptd import events as ev
from adaptd.metrics.exporter import Metrics

FELL_BACK = (
    "skipped damaged ckpt-35 (truncated: ckpt-35.data-00000-of-00001 is truncated: "
    "31900 bytes, the index expects 32000); resumed from ckpt-28"
)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "adaptd.cli", *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_the_daemon_logs_and_shows_a_restore_fallback(daemon_proc, zctx) -> None:
    r0 = Peer(zctx, daemon_proc.endpoint)
    r0.hello("fell-back", pid=os.getpid(), resumed_from=28, restore_fallback=FELL_BACK)
    line = daemon_proc.log.wait_for("event=restore_fallback", "job=fell-back")
    assert "WARNING" in line and "ckpt-35" in line and "resumed_from=28" in line
    r = cli("status", "--json", "--socket", str(daemon_proc.socket))
    assert r.returncode == 0, r.stderr
    job = next(j for j in json.loads(r.stdout)["jobs"] if j["job"] == "fell-back")
    assert job["restore_fallback"] == FELL_BACK
    r = cli("status", "--socket", str(daemon_proc.socket))
    assert "fell-back:" in r.stdout and "resumed past a damaged checkpoint: skipped" in r.stdout
    other = Peer(zctx, daemon_proc.endpoint)
    other.hello("clean", pid=os.getpid())
    r = cli("status", "--json", "--socket", str(daemon_proc.socket))
    job = next(j for j in json.loads(r.stdout)["jobs"] if j["job"] == "clean")
    assert job["restore_fallback"] == ""
    r0.close()
    other.close()


def registered(rank: int, incarnation: int, fallback: str) -> ev.JobRegistered:
    return ev.JobRegistered(
        time=1.0, wall=1.0, job="j", rank=rank, world_size=2, pid=10 + rank, hostname="h",
        checkpoint_dir="/ck", resumed_from=28, incarnation=incarnation,
        restore_fallback=fallback,
    )  # fmt: skip


def test_a_fallback_counts_once_per_run_not_per_rank() -> None:
    m = Metrics()
    for e in (registered(0, 1, FELL_BACK), registered(1, 1, FELL_BACK), registered(0, 2, ""),
              registered(0, 3, FELL_BACK)):  # fmt: skip
        m.on_event(e)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
    }
    assert samples[("adaptd_restore_fallbacks_total", (("job_id", "j"),))] == 2
