"""Hosts of the fleet tests: a real ``adaptd serve`` each (its own socket, state, config
and, when asked, NVML fixture or wall clock) with a stand-in job (plan_job.py) that
saves to a target every host shares, and the checks the fleet matrix makes on them:
how many wrote at once, whether every save reached its daemon, when a daemon is back.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from adaptd.commands._spawn import stop_daemon, wait_for_path
from adaptd.protocol import admin
from adaptd.state.store import Store
from adaptd.telemetry.storage import existing_ancestor, mount_of, parse_mountinfo

HERE = Path(__file__).parent
PLAN_JOB = HERE / "plan_job.py"
SERVE_NVML = HERE / "serve_nvml.py"
SHARED = "test://shared-export"
# a save every 100 steps of 20 ms: 2 s, time enough for the daemon to sample the job's
# storage target before its first save is due
POLICY = "io_aware:inner=fixed:steps=100,max_defer=10"
SAVE_S = 0.6
TTL_S = 3


def mountpoint_of(path: Path) -> str:
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    mount = mount_of(existing_ancestor(str(path)), mounts)
    assert mount is not None
    return mount.mountpoint


def faketime(offset: str) -> dict[str, str]:
    """The environment that runs a program with its wall clock ``offset`` off (e.g.
    ``"+30s"``; libfaketime, Debian ``faketime``): another host's clock. The monotonic
    clock is left alone, as a host's is its own: without ``DONT_FAKE_MONOTONIC``
    libfaketime offsets it too, and timed waits then overshoot by the offset (the
    daemon's lease lapsed under it). The library is preloaded into the daemon itself,
    not run through the ``faketime`` program, which forks: signals sent to it did not
    reach the daemon (leaked daemons)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("needs libfaketime (Debian faketime; scripts/install-test-deps.sh installs it)")
    return {"LD_PRELOAD": found[0], "FAKETIME": offset, "DONT_FAKE_MONOTONIC": "1"}


class Host:
    """One daemon and, unless ``job=False``, its job's process.

    ``etcd``: the endpoints; ``ckpt``: the shared folder the jobs save under; ``cap``:
    the fleet-wide cap on the shared target; ``fleet``: more ``[fleet]`` lines (TLS);
    ``nvml``: an NVML fixture for the daemon's telemetry (tests/fixtures/nvml); ``env``:
    more of the daemon's environment (:func:`faketime`: another wall clock).
    ``wait=False`` only starts the daemon's process: call :meth:`ready`, then
    :meth:`start_job` (many hosts start at once).
    """

    def __init__(
        self,
        root: Path,
        name: str,
        etcd: str | Sequence[str],
        ckpt: Path,
        policy: str = POLICY,
        *,
        cap: int = 1,
        fleet: str = "",
        nvml: str | None = None,
        env: dict[str, str] | None = None,
        job: bool = True,
        save_s: float = SAVE_S,
        wait: bool = True,
    ) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(exist_ok=True)
        self.socket = self.dir / "adaptd.sock"
        self.ckpt = ckpt
        self.save_s = save_s
        urls = [etcd] if isinstance(etcd, str) else list(etcd)
        shared = mountpoint_of(ckpt)
        self.config = self.dir / "adaptd.toml"
        self.config.write_text(
            f"[daemon]\nstate_dir = {json.dumps(str(self.dir))}\n"
            f'[metrics]\nlisten = "off"\n'
            f"[policy]\ndefault = {json.dumps(policy)}\n"
            f'[storage."shared"]\npath = {json.dumps(shared)}\nmax_concurrent_saves = {cap}\n'
            f"[fleet]\netcd = {json.dumps(urls)}\nhost = {json.dumps(name)}\n"
            f"lease_ttl_s = {TTL_S}\ncall_timeout_s = 0.5\n{fleet}"
            f"[fleet.shared]\n{json.dumps(shared)} = {json.dumps(SHARED)}\n"
        )
        self.command = [sys.executable]
        self.command += [str(SERVE_NVML), nvml] if nvml else ["-m", "adaptd.cli", "serve"]
        self.command += ["--socket", str(self.socket), "--config", str(self.config)]
        self.env = {**os.environ, **(env or {})}
        self.log = open(self.dir / "daemon.log", "ab")  # noqa: SIM115 - closed in stop()
        self.saves: queue.Queue[dict] = queue.Queue()
        self.all_saves: list[dict] = []
        self.plans: list[dict] = []  # the plans the job received, in order
        self.job: subprocess.Popen | None = None
        self.daemon = self.launch()
        if wait:
            self.ready()
            if job:
                self.start_job()

    def launch(self) -> subprocess.Popen:
        """Start the daemon's process (:meth:`ready` waits until it listens)."""
        for stale in (self.socket, admin.admin_path(self.socket)):
            stale.unlink(missing_ok=True)
        return subprocess.Popen(self.command, stdout=self.log, stderr=self.log, env=self.env)

    def ready(self) -> None:
        wait_for_path(self.socket, self.daemon, 60.0)

    def start_daemon(self) -> subprocess.Popen:
        """Start the daemon again (after a kill) and wait until it listens."""
        self.daemon = self.launch()
        self.ready()
        return self.daemon

    def start_job(self) -> None:
        self.job = subprocess.Popen(
            [sys.executable, str(PLAN_JOB), f"ipc://{self.socket}", f"job-{self.name}",
             str(self.ckpt / self.name), str(self.save_s)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        threading.Thread(target=self._read, args=(self.job,), daemon=True).start()

    def _read(self, job: subprocess.Popen) -> None:
        assert job.stdout is not None
        for line in job.stdout:
            record = {**json.loads(line), "host": self.name}
            if "plan" in record:
                self.plans.append(record)
                continue
            self.all_saves.append(record)
            self.saves.put(record)

    def next_saves(self, n: int, timeout_s: float) -> list[dict]:
        out, end = [], time.monotonic() + timeout_s
        while len(out) < n:
            try:
                out.append(self.saves.get(timeout=max(0.01, end - time.monotonic())))
            except queue.Empty:
                got = f"{self.name}: {len(out)} of {n} saves in {timeout_s}s"
                raise TimeoutError(got) from None
        return out

    def status(self, timeout_s: float = 10) -> admin.StatusReply:
        reply = admin.request(self.socket, admin.StatusRequest(), timeout_s=timeout_s)
        assert isinstance(reply, admin.StatusReply)
        return reply

    def log_size(self) -> int:
        """How far the daemon's log runs now (for :meth:`went_local`)."""
        return (self.dir / "daemon.log").stat().st_size

    def went_local(self, since: int = 0) -> bool:
        """Whether the daemon said it decides locally (``event=fleet_local``: its view
        went down or was not refreshed in time; docs/fleet.md) past log offset ``since``."""
        with open(self.dir / "daemon.log", "rb") as f:
            f.seek(since)
            return b"event=fleet_local" in f.read()

    def fleet(self) -> dict:
        telemetry = self.status().telemetry
        assert telemetry is not None
        return telemetry["fleet"]

    def wait_fleet(self, pred: Callable[[dict], Any], timeout_s: float = 20) -> dict:
        """Poll the daemon's fleet status until ``pred`` holds, for ``timeout_s`` in all.

        One status request unanswered for 10 s is asked again within the wait's own
        deadline (17 daemons joining at once on a loaded 2-core box kept one from
        answering that long); the wait fails at its deadline, saying how many went
        unanswered."""
        end = time.monotonic() + timeout_s
        unanswered, f = 0, None
        while True:
            try:
                telemetry = self.status(min(10.0, max(1.0, end - time.monotonic()))).telemetry
                assert telemetry is not None
                f = telemetry["fleet"]
                if pred(f):
                    return f
            except admin.AdminError as e:
                if e.code != "timeout":
                    raise
                unanswered += 1
            assert time.monotonic() < end, (
                f"{self.name}: fleet status never matched in {timeout_s}s "
                f"({unanswered} status requests unanswered): {f}"
            )
            time.sleep(0.1)  # polling the daemon's admin socket (no event to wait on)

    def history(self) -> set[int]:
        """The steps of the saves the daemon wrote to its state database (read-only)."""
        with Store.open(self.dir / "adaptd.sqlite3", readonly=True) as db:
            return {r.step for r in db.saves(f"job-{self.name}") if r.ok}

    def signal(self, sig: signal.Signals, *, job: bool = False) -> None:
        """Send ``sig`` to the daemon (and its job: the whole host)."""
        self.daemon.send_signal(sig)
        if job and self.job is not None:
            self.job.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the host: daemon and job."""
        for proc in (self.daemon, self.job):
            if proc is not None:
                proc.kill()
                proc.wait()

    def discard(self) -> None:
        """SIGKILL the host and close its log: for a host whose jobs are the test's own
        fake ranks, which never answer the save a SIGTERM's drain asks of them (the
        daemon would wait out :func:`stop_daemon`'s 15 s before it is killed anyway)."""
        self.kill()
        self.log.close()

    def stop(self) -> None:
        self.begin_stop()
        stop_daemon(self.daemon)
        self.log.close()

    def begin_stop(self) -> None:
        """Kill the job and send the daemon SIGTERM (:meth:`stop` then waits for it)."""
        for proc in (self.daemon, self.job):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        if self.job is not None:
            self.job.kill()
            self.job.wait()
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)


def max_writers(saves: Iterable[dict]) -> int:
    """The most saves in flight at one moment (``start``/``end`` on one monotonic clock)."""
    edges = sorted(
        [(s["start"], 1) for s in saves] + [(s["end"], -1) for s in saves],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    now = peak = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


def unreported(host: Host, settle_s: float = 5.0) -> set[int]:
    """Saves the job finished that never reached its daemon's history (waits up to
    ``settle_s`` for the daemon's next flushes)."""
    done = {s["save"] for s in host.all_saves}
    end = time.monotonic() + settle_s
    while (missing := done - host.history()) and time.monotonic() < end:
        time.sleep(0.2)  # the daemon flushes every tick; nothing to wait on from here
    return missing
