"""The sampling loop: guards, deadlines, ring buffer, the registry's jobs, pids -> GPUs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest
from nvml_fixture import FixtureNvml

from adaptd.core.snapshot import GpuSample
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.table import RegistryView
from adaptd.protocol import job as p
from adaptd.telemetry import nvml
from adaptd.telemetry.host import Host, process_info
from adaptd.telemetry.sampler import JobInfo, Sampler
from adaptd.telemetry.storage import Storage


def fake_gpus(pids_on: dict[int, list[int]] | None = None, name: str = "h100_8gpu") -> FixtureNvml:
    fake = FixtureNvml(name, clock=None)
    for index, pids in (pids_on or {}).items():
        procs = [
            {
                "pid": p,
                "usedGpuMemory": 1 << 30,
                "gpuInstanceId": 0xFFFFFFFF,
                "computeInstanceId": 0xFFFFFFFF,
            }
            for p in pids
        ]
        fake.override(index, "nvmlDeviceGetComputeRunningProcesses", procs)
    return fake


class Broken:
    """A GPU source whose driver went away mid-run."""

    def __init__(self) -> None:
        self.calls = 0

    def sample(self) -> tuple[GpuSample, ...]:
        self.calls += 1
        raise RuntimeError("driver gone")

    def close(self) -> None:
        pass


def test_one_failing_source_never_stops_the_others(tmp_path, caplog) -> None:
    gpu = Broken()
    s = Sampler(nvml=gpu, storage=Storage(), host=Host())
    s.set_jobs({"a": (str(tmp_path), ())})
    with caplog.at_level(logging.WARNING, logger="adaptd.telemetry.sampler"):
        snaps = [s.sample(float(t)) for t in range(3)]
    assert gpu.calls == 3 and s.failures["gpu"] == 3
    for snap in snaps:
        assert snap.gpus == ()
        assert snap.host is not None and snap.host.mem_total_bytes
        assert [x.jobs for x in snap.storage] == [("a",)]
    assert sum("gpu source failed" in r.message for r in caplog.records) == 1


def test_a_jobs_pids_map_to_its_fake_gpus() -> None:
    me = os.getpid()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        # GPU 0: the job's own pid; GPU 1: a child of it (a launcher's worker); GPU 2: another job
        fake = fake_gpus({0: [me], 1: [child.pid], 2: [424242]})
        s = Sampler(nvml=nvml.open(fake))
        s.set_jobs({"mine": JobInfo("", (me,)), "other": ("", (424242,))})
        snap = s.sample(1.0)
        assert snap.gpus[0].jobs == ("mine",)
        assert snap.gpus[1].jobs == ("mine",)
        assert snap.gpus[2].jobs == ("other",)
        assert all(g.jobs == () for g in snap.gpus[3:])  # the fixture's pids are nobody's
        assert [g.index for g in s.gpus_of_job("mine")] == [0, 1]
        assert [g.index for g in snap.gpus_of((me,))] == [0]  # the snapshot's own pid lookup
        assert process_info(child.pid).ppid == me
    finally:
        child.communicate(b"")


def test_an_xid_reaches_the_job_on_that_gpu() -> None:
    fake = fake_gpus(name="h100_8gpu_xid79")
    s = Sampler(nvml=nvml.open(fake))
    s.set_jobs({"rank5-job": ("", (48216,))})
    s.sample(0.0)
    fake.step()
    fake.step()
    snap = s.sample(2.0)
    hit = [g for g in snap.gpus if g.xid_events]
    assert [(g.index, g.xid_events, g.jobs) for g in hit] == [(5, (79,), ("rank5-job",))]


class Pids:
    """Process liveness as the test says: the registry's probe, without real processes."""

    def __init__(self) -> None:
        self.dead: set[int] = set()

    def start_time(self, pid: int) -> float | None:
        return 1.0

    def alive(self, pid: int, start_time: float | None) -> bool:
        return pid not in self.dead


def hello(job: str, rank: int, pid: int, ckpt: str = "", world_size: int = 2) -> p.Hello:
    return p.Hello(v=p.VERSION, job=job, rank=rank, world_size=world_size, pid=pid,
                   checkpoint_dir=ckpt)  # fmt: skip


def test_jobs_follow_the_daemons_registry(tmp_path) -> None:
    """The jobs the sampler maps GPUs and disks to are the registry's, read through its
    view when a sample is due: ranks add pids, a lost job drops out until it revives, a
    restarted one brings new pids, a finished one is gone."""
    pids = Pids()
    reg = Registry(probe=pids)
    jobs = RegistryView(reg).processes
    s = Sampler(storage=Storage(), interval=1.0)
    job_a, rank_a, _ = reg.hello(b"a0", hello("a", 0, 11, str(tmp_path / "a")), 0.0)
    reg.hello(b"a1", hello("a", 1, 12), 0.0)  # a second rank
    job_b, rank_b, _ = reg.hello(b"b0", hello("b", 0, 13, str(tmp_path / "b"), 1), 0.0)
    snap = s.tick(1.0, jobs)
    assert s.jobs["a"] == JobInfo(str(tmp_path / "a"), (11, 12))
    assert snap is not None and [x.jobs for x in snap.storage] == [("a", "b")]  # one target
    pids.dead |= {11, 12}
    reg.check(2.0)  # job a lost
    s.tick(2.0, jobs)
    assert "a" not in s.jobs
    pids.dead.clear()  # it was only silent: rank 0 speaks again, the job revives
    steps = p.Steps(v=p.VERSION, job="a", rank=0, step=5, count=5, mean_s=0.1)
    reg.steps(job_a, rank_a, steps, 2.5)
    s.tick(3.0, jobs)
    assert s.jobs["a"].pids == (11, 12)
    pids.dead |= {11, 12}
    reg.check(4.0)  # lost again, then restarted: new pids, same directory
    reg.hello(b"a2", hello("a", 0, 21), 4.5)
    s.tick(5.0, jobs)
    assert s.jobs["a"] == JobInfo(str(tmp_path / "a"), (21,))
    reg.goodbye(job_b, rank_b, p.Goodbye(v=p.VERSION, job="b", rank=0, step=9, reason="done"), 5.5)
    s.tick(6.0, jobs)
    assert list(s.jobs) == ["a"]


def test_tick_keeps_a_monotonic_deadline_grid() -> None:
    s = Sampler(interval=1.0)
    done = [t for t in (10.0, 10.5, 10.97, 11.2, 12.0, 15.4, 15.6, 16.0) if s.tick(t)]
    # 10.97 is within 5 % of the 11.0 deadline; 15.4 catches up once after the stall
    assert done == [10.0, 10.97, 12.0, 15.4, 16.0]
    assert [x.time for x in s.history] == done
    assert s.latest().time == 16.0


def test_ring_buffer_is_bounded() -> None:
    s = Sampler(history=3)
    for t in range(10):
        s.sample(float(t))
    assert [x.time for x in s.history] == [7.0, 8.0, 9.0]
    assert s.samples == 10


def test_run_in_a_thread_samples_until_stopped() -> None:
    s = Sampler(host=Host(), interval=0.02)
    stop = threading.Event()
    t = threading.Thread(target=s.run, args=(stop,))
    t.start()
    deadline = time.monotonic() + 5.0
    while s.samples < 5 and time.monotonic() < deadline:
        stop.wait(0.01)
    stop.set()
    t.join(timeout=5.0)
    assert not t.is_alive() and s.samples >= 5
    times = [x.time for x in s.history]
    assert times == sorted(times)


def test_no_nvml_degraded_mode_end_to_end(tmp_path) -> None:
    """The real pynvml on this GPU-less machine: snapshots with host and storage, no GPUs."""
    s = Sampler.default(interval=0.5)
    try:
        if s.nvml.available:  # pragma: no cover - a GPU host
            pytest.skip("this host has a working NVIDIA driver")
        s.set_jobs({"a": (str(tmp_path), (os.getpid(),))})
        snap = s.sample(time.monotonic())
        assert snap.gpus == ()
        assert snap.host.mem_available_bytes > 0
        assert snap.storage and snap.storage[0].jobs == ("a",)
        assert s.failures == {}
    finally:
        s.close()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        Sampler(interval=0)
    with pytest.raises(ValueError, match="history"):
        Sampler(history=0)
