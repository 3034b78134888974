"""Several real ``adaptd serve`` daemons (separate sockets and state directories, standing
in for hosts) against one real etcd, each with a job that follows its plans."""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_helpers import Etcd

from adaptd import admin
from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.failures import FailureRecord
from adaptd.fleet.session import FleetSettings
from adaptd.spawn import start_daemon, stop_daemon
from adaptd.telemetry.storage import existing_ancestor, mount_of, parse_mountinfo

PLAN_JOB = Path(__file__).with_name("plan_job.py")
SHARED = "test://shared-export"
# a save every 100 steps of 20 ms: 2 s, time enough for the daemon to sample the job's
# storage target before its first save is due
POLICY = "io_aware:inner=fixed:steps=100,max_defer=10"
SAVE_S = 0.6


def mountpoint_of(path: Path) -> str:
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    mount = mount_of(existing_ancestor(str(path)), mounts)
    assert mount is not None
    return mount.mountpoint


class Host:
    """One daemon (its own socket, state and config) and its job's process."""

    def __init__(
        self, root: Path, name: str, etcd_url: str, ckpt: Path, policy: str = POLICY
    ) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir()
        self.socket = self.dir / "adaptd.sock"
        shared = mountpoint_of(ckpt)
        config = self.dir / "adaptd.toml"
        config.write_text(
            f"[daemon]\nstate_dir = {json.dumps(str(self.dir))}\n"
            f'[metrics]\nlisten = "off"\n'
            f"[policy]\ndefault = {json.dumps(policy)}\n"
            f'[storage."shared"]\npath = {json.dumps(shared)}\nmax_concurrent_saves = 1\n'
            f"[fleet]\netcd = [{json.dumps(etcd_url)}]\nhost = {json.dumps(name)}\n"
            f"lease_ttl_s = 3\ncall_timeout_s = 0.5\n"
            f"[fleet.shared]\n{json.dumps(shared)} = {json.dumps(SHARED)}\n"
        )
        self.log = open(self.dir / "daemon.log", "wb")  # noqa: SIM115 - closed in stop()
        self.daemon = start_daemon(self.socket, ["--config", str(config)], log=self.log)
        self.saves: queue.Queue[dict] = queue.Queue()
        self.job = subprocess.Popen(
            [sys.executable, str(PLAN_JOB), f"ipc://{self.socket}", f"job-{name}",
             str(ckpt / name), str(SAVE_S)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.job.stdout is not None
        for line in self.job.stdout:
            self.saves.put(json.loads(line))

    def next_saves(self, n: int, timeout_s: float) -> list[dict]:
        out, end = [], time.monotonic() + timeout_s
        while len(out) < n:
            try:
                out.append(self.saves.get(timeout=max(0.01, end - time.monotonic())))
            except queue.Empty:
                got = f"{self.name}: {len(out)} of {n} saves in {timeout_s}s"
                raise TimeoutError(got) from None
        return out

    def status(self) -> admin.StatusReply:
        reply = admin.request(self.socket, admin.StatusRequest(), timeout_s=10)
        assert isinstance(reply, admin.StatusReply)
        return reply

    def fleet(self) -> dict:
        telemetry = self.status().telemetry
        assert telemetry is not None
        return telemetry["fleet"]

    def wait_fleet(self, pred, timeout_s: float = 20) -> dict:
        end = time.monotonic() + timeout_s
        while True:
            f = self.fleet()
            if pred(f):
                return f
            assert time.monotonic() < end, f"{self.name}: fleet status never matched: {f}"
            time.sleep(0.1)  # polling the daemon's admin socket (no event to wait on)

    def stop(self) -> None:
        self.job.kill()
        self.job.wait()
        stop_daemon(self.daemon)
        self.log.close()


@pytest.fixture
def hosts_root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="adf-", dir="/tmp"))  # ipc paths stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)


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
        m = float(job.plan.reason.split("M=")[1].split("s")[0])
        assert m * 8 == pytest.approx(f["gpu_mtbf_s"], rel=0.05)  # 8 GPUs: the job's M
    finally:
        h.stop()


def test_without_fleet_nothing_is_imported(tmp_path: Path):
    """A daemon with no [fleet] never imports the etcd client (it may not be installed)."""
    code = (
        "import sys, adaptd.config as c, adaptd.service\n"
        "cfg = c.from_mapping({})\n"
        "assert cfg.fleet is None\n"
        "assert 'etcd3gw' not in sys.modules, sorted(sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ADAPTD_ETCD"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_a_daemon_killed_holding_a_slot_frees_it_within_the_ttl(own_etcd: Etcd, hosts_root: Path):
    ckpt = hosts_root / "ckpt"
    ckpt.mkdir()
    a, b = (Host(hosts_root, n, own_etcd.url, ckpt) for n in ("host-a", "host-b"))
    try:
        b.wait_fleet(lambda f: f["up"] and len(f["hosts"]) == 2)
        a_holds = ["host-a/job-host-a"]
        b.wait_fleet(lambda f: f["targets"].get(SHARED, {}).get("holders") == a_holds, 60)
        a.daemon.kill()  # SIGKILL while its job holds the slot
        killed = time.monotonic()
        b.wait_fleet(
            lambda f: (
                "host-a" not in f["hosts"]
                and f["targets"].get(SHARED, {}).get("holders") != a_holds
            ),
            timeout_s=15,
        )
        assert time.monotonic() - killed <= 3 + 1.5  # lease TTL 3 s, plus a round
        b.next_saves(2, 30)  # and host-b's job goes on taking the slot
    finally:
        a.stop()
        b.stop()
