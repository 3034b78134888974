"""Several real ``adaptd serve`` daemons (separate sockets and state directories, standing
in for hosts) against one real etcd, each with a job that follows its plans."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fleet_helpers import Etcd
from fleet_hosts import SHARED, Host

from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.failures import FailureRecord
from adaptd.fleet.session import FleetSettings


@pytest.mark.slow
def test_two_daemons_take_turns_on_a_shared_target(own_etcd: Etcd, hosts_root: Path):
    """A cap of 1 across two daemons: their jobs' saves never overlap; both keep saving;
    status shows the fleet. Then etcd dies: the jobs keep saving on local decisions,
    the status says so, and when etcd is back both daemons rejoin by themselves."""
    ckpt = hosts_root / "ckpt"
    ckpt.mkdir()
    hosts = [Host(hosts_root, n, own_etcd.url, ckpt) for n in ("host-a", "host-b")]
    try:
        for h in hosts:
            h.wait_fleet(lambda f: f["up"] and len(f["hosts"]) == 2)
        saves = [s for h in hosts for s in h.next_saves(3, 90)]
        spans = sorted((s["start"], s["end"]) for s in saves)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start > end, f"two saves at once on a cap of 1: {spans}"
        f = hosts[0].fleet()
        assert sorted(f["hosts"]) == ["host-a", "host-b"] and f["grants"] >= 3
        assert SHARED in f["targets"] and f["targets"][SHARED]["cap"] == 1

        own_etcd.kill()
        t0 = time.monotonic()
        for h in hosts:
            down = h.wait_fleet(lambda f: not f["up"], timeout_s=10)
            assert down["reason"]
        assert time.monotonic() - t0 <= 5.0 + 1.0  # (status polled every 0.1 s)
        for h in hosts:
            h.next_saves(2, 60)  # jobs keep saving, decided locally
        own_etcd.start()
        for h in hosts:
            back = h.wait_fleet(lambda f: f["up"] and len(f["hosts"]) == 2, timeout_s=30)
            assert back["errors"] >= 1
        for h in hosts:
            h.next_saves(1, 60)
    finally:
        for h in hosts:
            h.stop()


@pytest.mark.slow
def test_a_new_daemon_starts_from_the_fleets_failures(own_etcd: Etcd, hosts_root: Path):
    """Another host published 40 failures in 5e8 GPU-seconds: a daemon that has seen
    none shows the fleet's posterior, and its jobs' M comes from it."""
    other = FleetAgent(
        FleetSettings(endpoints=(own_etcd.url,), host="host-old", lease_ttl_s=3), poll_s=0.5
    )
    other.publish(FailureRecord("host-old", "unknown", gpu_seconds=5e8, failures=40))
    assert other.poll_once().up
    other.stop()
    ckpt = hosts_root / "ckpt"
    ckpt.mkdir()
    h = Host(hosts_root, "host-new", own_etcd.url, ckpt, policy="daly:probe_s=2")
    try:
        f = h.wait_fleet(lambda f: f["up"] and f["fleet_failures"] >= 40)
        assert f["gpu_mtbf_s"] < 0.5 * 180e6  # far below the prior's ~180e6 s
        h.next_saves(1, 60)  # Daly knows δ after one save; its reason names M
        end = time.monotonic() + 20
        while True:
            job = next(j for j in h.status().jobs if j.job == "job-host-new")
            if job.plan is not None and "M=" in job.plan.reason:
                break
            assert time.monotonic() < end, job.plan
            time.sleep(0.1)  # polling the admin socket
        value, unit = job.plan.reason.split("M=")[1].split()[:2]  # "M=12.5 h"
        m = float(value) * {"s": 1.0, "min": 60.0, "h": 3600.0}[unit]
        assert m * 8 == pytest.approx(f["gpu_mtbf_s"], rel=0.05)  # 8 GPUs: the job's M
    finally:
        h.stop()


def test_without_fleet_nothing_is_imported(tmp_path: Path):
    """A daemon with no [fleet] never imports the etcd client (it may not be installed)."""
    code = (
        "import sys, adaptd.config.loader as c, adaptd.daemon.service\n"
        "cfg = c.from_mapping({})\n"
        "assert cfg.fleet is None\n"
        "assert 'etcd3gw' not in sys.modules, sorted(sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ADAPTD_ETCD"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
