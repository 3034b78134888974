"""The sampler wired into a real daemon through its seams, as ``adaptd serve`` will wire it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import zmq
from nvml_fixture import FixtureNvml

from adaptd.daemon.assembly import Seams, build
from adaptd.daemon.jobs.table import JobTable, RegistryView
from adaptd.daemon.options import DaemonOptions
from adaptd.protocol import job as p
from adaptd.telemetry import nvml
from adaptd.telemetry.host import Host
from adaptd.telemetry.report import render, to_dict
from adaptd.telemetry.sampler import Sampler
from adaptd.telemetry.storage import Storage


def test_hello_reaches_the_sampler_and_its_snapshots_feed_the_daemon(tmp_path: Path) -> None:
    me = os.getpid()
    fake = FixtureNvml("h100_8gpu")
    fake.override(3, "nvmlDeviceGetComputeRunningProcesses", [{"pid": me, "usedGpuMemory": 1}])
    sampler = Sampler(nvml=nvml.open(fake), storage=Storage(), host=Host(), interval=0.05)
    ready = threading.Event()

    def until_mapped(now: float) -> None:
        snap = sampler.latest()
        if snap.storage and any(g.jobs for g in snap.gpus):
            ready.set()

    ckpt = tmp_path / "ckpt" / "job-a"
    table = JobTable()
    jobs = RegistryView(table)
    daemon = build(
        DaemonOptions(socket=tmp_path / "a.sock", tick_interval_s=0.05),
        Seams(
            snapshot_source=sampler.latest,
            jobs=table,
            # the sampler learns the jobs' directories and pids from the registry (read-only)
            tick_hooks=[lambda now: sampler.tick(now, jobs=jobs.processes), until_mapped],
        ),
    )
    daemon.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"ipc://{daemon.socket_path}")
        sock.send(p.encode(p.Hello(v=p.VERSION, job="job-a", pid=me, checkpoint_dir=str(ckpt))))
        assert ready.wait(10.0), "the sampler never saw the job's directory and GPU"
        snap = sampler.latest()
        assert [g.index for g in snap.gpus if g.jobs] == [3]
        assert snap.gpus[3].jobs == ("job-a",)
        (target,) = snap.storage
        assert target.jobs == ("job-a",) and target.device
        assert "job-a" in render(to_dict(snap))
        sock.send(
            p.encode(p.Steps(v=p.VERSION, job="job-a", rank=0, step=10, count=10, mean_s=0.01))
        )
        replies = []
        while sock.poll(5000) and len(replies) < 2:  # welcome, then a plan decided on our snapshot
            replies.append(p.decode_daemon(sock.recv()))
        assert [type(r).__name__ for r in replies] == ["Welcome", "Plan"]
    finally:
        sock.close()
        ctx.term()
        daemon.stop()
        sampler.close()
    assert sampler.failures == {}
    assert daemon.counters["snapshot_errors"] == 0


def test_the_daemon_with_telemetry_imports_no_heavy_modules() -> None:
    """What the daemon process loads to serve with the sampler: no TF, numpy, scipy, pynvml
    (psutil, small, is what it reads the host with)."""
    code = (
        "import sys\n"
        "from adaptd.daemon.server import Daemon\n"
        "from adaptd.telemetry import nvml, report\n"
        "from nvml_fixture import FixtureNvml\n"
        "from adaptd.telemetry.sampler import Sampler\n"
        "from adaptd.telemetry.storage import Storage\n"
        "from adaptd.telemetry.host import Host\n"
        "s = Sampler(nvml=nvml.open(FixtureNvml('h100_8gpu')), storage=Storage(), host=Host())\n"
        "s.set_jobs({'a': ('/tmp/x', (1,))})\n"
        "report.render(report.to_dict(s.sample(1.0)))\n"
        "print(sorted(m for m in ('tensorflow', 'numpy', 'scipy', 'pynvml')"
        " if m in sys.modules))\n"
    )
    tests = str(Path(__file__).resolve().parents[1])  # where nvml_fixture lives
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])),
    }
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
