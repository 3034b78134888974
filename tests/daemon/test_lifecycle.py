"""Starting and stopping `adaptd serve`: files, permissions, the lock, signals, `adaptd status`."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest
from daemon_helpers import DEADLINE, DaemonProc, Peer

from adaptd.daemon.assembly import build
from adaptd.daemon.options import DaemonOptions
from adaptd.daemon.server import DaemonError
from adaptd.protocol import job as p
from adaptd.protocol import paths

CLI = [sys.executable, "-m", "adaptd.cli"]


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_socket_files_and_modes(daemon_proc) -> None:
    sock = daemon_proc.socket
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o660
    admin_sock = sock.with_name("adaptd.admin.sock")
    assert stat.S_IMODE(os.stat(admin_sock).st_mode) == 0o600
    assert daemon_proc.status().daemon.socket == str(sock)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_zero_and_removes_sockets(short_dir, zctx, sig) -> None:
    d = DaemonProc(short_dir / "adaptd.sock")
    assert Peer(zctx, d.endpoint).hello("sig-job").seq == 1
    t0 = time.monotonic()
    d.proc.send_signal(sig)
    assert d.proc.wait(timeout=DEADLINE) == 0
    assert time.monotonic() - t0 < 2.0  # the poll woke at once, it did not wait for a tick
    assert not d.socket.exists() and not d.socket.with_name("adaptd.admin.sock").exists()
    d.log.wait_for("event=stopped")


def test_in_process_daemon_stops_at_once_and_refuses_a_twin(short_dir, zctx) -> None:
    """stop() wakes the poll through its wake-up socket, not at the next tick."""
    d = build(
        DaemonOptions(
            socket=short_dir / "adaptd.sock", default_policy="phased", tick_interval_s=3600
        )
    ).start()
    try:
        assert Peer(zctx, d.endpoint).hello("thread-job").seq == 1
        with pytest.raises(DaemonError, match="another adaptd daemon"):
            build(DaemonOptions(socket=short_dir / "adaptd.sock")).start()
        assert Peer(zctx, d.endpoint).hello("thread-job-2").seq == 1  # the first serves on
    finally:
        t0 = time.monotonic()
        d.stop(timeout_s=DEADLINE)
    assert time.monotonic() - t0 < 1.0 and not d._thread.is_alive()
    assert not d.socket_path.exists() and not d.admin_path.exists()


def test_second_daemon_on_same_socket_is_refused(daemon_proc, zctx) -> None:
    r = cli("serve", "--socket", str(daemon_proc.socket), timeout=DEADLINE)
    assert r.returncode == 1
    assert "another adaptd daemon" in r.stderr and str(daemon_proc.proc.pid) in r.stderr
    assert "Traceback" not in r.stderr
    # the first one still serves, its socket intact
    assert Peer(zctx, daemon_proc.endpoint).hello("still-here").seq == 1


def test_stale_socket_file_is_replaced(short_dir, zctx) -> None:
    path = short_dir / "adaptd.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a socket file nobody listens on, as a killed daemon leaves it
    stale.close()
    d = DaemonProc(path)
    try:
        d.log.wait_for("event=listening")
        assert Peer(zctx, d.endpoint).hello("after-stale").seq == 1
    finally:
        assert d.stop() == 0


def test_per_user_runtime_dir_is_created_private(tmp_path, monkeypatch) -> None:
    runtime = tmp_path / "xdg"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("ADAPTD_SOCKET", raising=False)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    if len(str(runtime)) > 80:
        pytest.skip("tmp_path too long for an ipc path")
    if paths.SYSTEM_RUNTIME_DIR.is_dir() and os.access(paths.SYSTEM_RUNTIME_DIR, os.W_OK):
        pytest.skip("/run/adaptd is writable here and would take precedence")
    d = build(DaemonOptions()).start()
    try:
        assert d.socket_path.parent == runtime / "adaptd"
        assert stat.S_IMODE(os.stat(runtime / "adaptd").st_mode) == 0o700
    finally:
        d.stop()
    assert not d.socket_path.exists()


def test_bad_options_are_one_line_and_exit_1(short_dir) -> None:
    r = cli("serve", "--socket", str(short_dir / "a.sock"), "--policy", "nosuch")
    assert r.returncode == 1 and "--policy 'nosuch'" in r.stderr and "unknown policy" in r.stderr
    long = short_dir / ("x" * 120) / "a.sock"
    r = cli("serve", "--socket", str(long))
    assert r.returncode == 1 and "limited to 107" in r.stderr
    r = cli("serve", "--socket", "tcp://127.0.0.1:5555")
    assert r.returncode == 1 and "CURVE" in r.stderr
    with pytest.raises(DaemonError, match="silence-timeout"):
        DaemonOptions(socket=short_dir / "a.sock", liveness_timeout_s=0)


def test_status_without_daemon_is_one_line_exit_1(short_dir) -> None:
    r = cli("status", "--socket", str(short_dir / "adaptd.sock"), timeout=DEADLINE)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no adaptd daemon is running" in r.stderr


def test_status_with_stale_socket_times_out_quickly(short_dir) -> None:
    admin_sock = short_dir / "adaptd.admin.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(admin_sock))
    stale.close()
    t0 = time.monotonic()
    r = cli("status", "--socket", str(short_dir / "adaptd.sock"), "--timeout", "0.5")
    assert r.returncode == 1 and "did not answer within 0.5s" in r.stderr
    assert time.monotonic() - t0 < DEADLINE


def test_status_table_and_json(daemon_proc, zctx) -> None:
    r0 = Peer(zctx, daemon_proc.endpoint)
    r0.hello("table-job", 0, world_size=2, pid=os.getpid(), policy="fixed:steps=40")
    r0.steps("table-job", 17, mean_s=0.25)
    r0.send(
        p.SaveReport(
            v=p.VERSION,
            job="table-job",
            rank=0,
            step=17,
            blocking_s=0.004,
            durable_s=0.120,
            bytes=2048,
            ok=False,
            error="disk full",
        )
    )
    daemon_proc.log.wait_for("event=save", "job=table-job")
    r = cli("status", "--socket", str(daemon_proc.socket))
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("table-job "))
    assert row.split()[:8] == [
        "table-job",
        "active",
        "1/2",
        "17",
        "0.25s",
        "fixed:steps=40",
        "40",
        "40",
    ]
    assert "0+1err" in row
    assert "last save failed: disk full" in r.stdout
    r = cli("status", "--json", "--socket", str(daemon_proc.socket))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    job = next(j for j in data["jobs"] if j["job"] == "table-job")
    assert job["ranks"][0]["pid"] == os.getpid() and job["ranks"][0]["alive"] is True
    assert job["plan"]["every_steps"] == 40 and job["plan"]["reason"] == "every 40 steps"
    assert job["last_save"]["ok"] is False and job["failed_saves"] == 1
    assert data["daemon"]["by_kind"] == {"hello": 1, "steps": 1, "save_report": 1}
    assert data["daemon"]["uptime_s"] > 0


def test_status_prints_long_intervals_without_exponents(daemon_proc, zctx) -> None:
    """``status`` printed intervals such as ``4.72e+03s``."""
    r0 = Peer(zctx, daemon_proc.endpoint)
    r0.hello("long-job", 0, pid=os.getpid(), policy="daly:save_cost_s=100,mtbf_s=100000")
    r0.steps("long-job", 20, count=20, mean_s=0.1)
    daemon_proc.log.wait_for("event=plan", "job=long-job", "every_steps=4")
    interval = daemon_proc.job("long-job").plan.interval_s
    assert interval > 1000
    r = cli("status", "--socket", str(daemon_proc.socket))
    row = next(line for line in r.stdout.splitlines() if line.startswith("long-job "))
    assert "e+" not in row and f"{interval:.0f}s" in row.split(), row
