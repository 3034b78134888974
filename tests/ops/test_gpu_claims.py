"""A job's GPU claim weighs in the host's failure-rate posterior only up to what the
host has (issue 26).

A job's hello claims GPUs per rank and a world size; before the fix the product went
unchecked into the host's shared posterior (exposure, GPU-seconds watched without a
failure), so a job claiming 10,000 GPUs on an 8-GPU host lengthened every other job's
interval (and, through the fleet, every other host's). A real ``Service`` in-process
with NVML replaying an 8-GPU H100 fixture; real ZeroMQ, real SQLite.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from nvml_fixture import FixtureNvml

from adaptd.core.gpu_claims import vouched_gpus
from adaptd.daemon.sdnotify import Notifier
from adaptd.daemon.service import Service
from adaptd.protocol import job as p
from adaptd.protocol.job import VERSION
from adaptd.telemetry.sampler import Sampler

from .test_service import make, serving

JOBS = {  # job: (GPUs per rank, world size, agreement) -> GPUs the host counts
    "honest": ((8, 1, "none"), 8),
    "liar": ((1000, 10, "daemon"), 8),  # 10,000 GPUs "on this host"
    "wide": ((1000, 10, "coordination"), 80),  # 10 hosts of at most 8 each
}


@pytest.mark.parametrize(
    ("claimed", "world", "host", "spans", "counted"),
    [
        (8, 1, 8, False, 8),
        (4, 2, 8, False, 4),  # fits: the claim
        (10_000, 10, 8, False, 8),
        (10_000, 10, 8, True, 80),
        (64, 8, 8, True, 64),  # an honest 8-host job
        (10_000, 10, None, True, 10_000),  # no GPU count: the claim (documented)
        (0, 1, 8, False, 1),
    ],
)
def test_vouched_gpus(claimed, world, host, spans, counted) -> None:
    assert vouched_gpus(claimed, world, host_gpus=host, spans_hosts=spans) == counted


def test_a_job_claiming_10000_gpus_counts_as_the_hosts_8(short_dir: Path) -> None:
    svc = Service(
        make(short_dir).cfg,
        notifier=Notifier(env={}),
        sampler=Sampler.default(interval=60.0, nvml_library=FixtureNvml("h100_8gpu")),
    )
    with serving(svc) as connect:
        peers = {}
        for job, ((gpus, world, agreement), _) in JOBS.items():
            peers[job] = peer = connect()
            peer.send(p.encode(p.Hello(v=VERSION, job=job, gpus=gpus, world_size=world,
                                       agreement=agreement)))  # fmt: skip
            assert peer.poll(10_000), f"{job}: no welcome"
        rate = svc.failure_rate
        assert rate is not None
        start = rate.gpu_seconds
        t0 = time.monotonic()
        for step in (10, 20, 30):
            for job, peer in peers.items():
                peer.send(p.encode(p.Steps(v=VERSION, job=job, rank=0, step=step, count=10,
                                           mean_s=0.01)))  # fmt: skip
            time.sleep(0.2)  # the exposure is the time between reports: let some pass
        registry = svc.daemon.registry
        end = time.monotonic() + 10
        while any(registry.jobs[j].tracker.step < 30 for j in JOBS):
            assert time.monotonic() < end, "the daemon did not take the reports"
            for peer in peers.values():
                peer.poll(20)  # waiting on the daemon's answers
        elapsed = time.monotonic() - t0
        counted = sum(n for _, n in JOBS.values())  # 96 GPUs, not 10,008 + 10,000
        assert rate.gpu_seconds - start <= counted * elapsed * 1.05, (
            rate.gpu_seconds - start,
            elapsed,
        )
        for job, (_, n) in JOBS.items():
            assert registry.jobs[job].tracker.exposure_gpus() == n
            assert registry.jobs[job].tracker.gpus >= n  # the job's own M keeps its claim
    for peer in peers.values():
        peer.close(0)


def test_without_a_gpu_count_the_claim_is_counted(short_dir: Path) -> None:
    svc = make(short_dir)  # a sampler without NVML: the host's GPUs are unknown
    with serving(svc) as connect:
        peer = connect()
        peer.send(p.encode(p.Hello(v=VERSION, job="cpu", gpus=4, world_size=1)))
        assert peer.poll(10_000)
        assert svc.daemon.registry.jobs["cpu"].tracker.exposure_gpus() == 4
        peer.close(0)
