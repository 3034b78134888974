"""``adaptd serve`` as systemd runs it: config, sockets, sd_notify, drain on SIGTERM,
metrics over HTTP, and learned state that survives a restart (real processes)."""

from __future__ import annotations

import grp
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from adaptd.config import loader as config
from adaptd.config.schema import METRICS_LISTEN
from adaptd.core.estimators import JobTracker
from adaptd.protocol import admin
from adaptd.protocol import job as p
from adaptd.state.store import GLOBAL, Store, job_scope

from ._serve import NotifyListener, Peer, Serve

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "adaptd.service"
EXAMPLE = ROOT / "systemd" / "adaptd.toml"


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adaptd.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    promtool = shutil.which("promtool")
    if promtool:
        lint = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


# ---------------------------------------------------------------------------- config


def test_unit_exec_start_parses_and_check_config_prints_effective_settings() -> None:
    line = next(ln for ln in UNIT.read_text().splitlines() if ln.startswith("ExecStart="))
    argv = line.removeprefix("ExecStart=").split()
    assert argv[:2] == ["/usr/bin/adaptd", "serve"]
    args = [str(EXAMPLE) if a == "/etc/adaptd/adaptd.toml" else a for a in argv[2:]]
    r = cli("serve", *args, "--check-config", "--json", "--socket", "/run/adaptd/adaptd.sock")
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    assert cfg["source"] == str(EXAMPLE)
    d = cfg["daemon"]
    assert d["socket"] == "/run/adaptd/adaptd.sock"
    assert d["admin_socket"] == "/run/adaptd/adaptd.admin.sock"  # where the daemon binds it
    assert d["drain_grace_s"] == 90.0 and cfg["metrics"]["listen"] == "127.0.0.1:9465"


def test_check_config_prints_the_settings_as_a_config_file() -> None:
    r = cli("serve", "--config", str(EXAMPLE), "--check-config", "--socket", "/run/adaptd/x.sock")
    assert r.returncode == 0, r.stderr
    printed = config.loads(r.stdout)  # a config file adaptd itself accepts
    assert printed.socket == "/run/adaptd/x.sock" and printed.socket_mode == 0o660
    assert 'socket_mode = "0660"' in r.stdout and "gpu_mtbf_hours = " in r.stdout


def test_check_config_reports_a_bad_setting_on_one_line(short_dir: Path) -> None:
    bad = short_dir / "bad.toml"
    bad.write_text("[daemon]\nsample_intervl_s = 2\n")
    r = cli("serve", "--config", str(bad), "--check-config")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert "daemon.sample_intervl_s" in r.stderr and "sample_interval_s" in r.stderr
    r = cli("serve", "--check-config", "--silence-timeout", "-1")
    assert r.returncode == 1 and "--silence-timeout" in r.stderr


def test_busy_metrics_port_named_on_the_command_line_is_a_startup_error(
    short_dir: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = cli("serve", "--socket", str(short_dir / "a.sock"), "--state-dir",
                str(short_dir / "st"), "--metrics-listen", f"127.0.0.1:{port}")  # fmt: skip
    assert r.returncode == 1
    assert "metrics.listen" in r.stderr and str(port) in r.stderr
    assert not (short_dir / "a.sock").exists()  # the daemon's sockets were closed again


def _hold_the_default_metrics_port(deadline_s: float = 60.0) -> socket.socket:
    """A listening socket on the built-in metrics address (127.0.0.1:9465), once it is
    free: another daemon of the machine may hold it for a while (a suite in two
    processes); waiting for it, not taking "held by someone" for busy, keeps the port
    busy for the whole test."""
    host, port = METRICS_LISTEN
    end = time.monotonic() + deadline_s
    while True:
        s = socket.socket()
        try:
            s.bind((host, port))
        except OSError:
            s.close()
            assert time.monotonic() < end, f"{host}:{port} stayed busy for {deadline_s}s"
            time.sleep(0.2)  # another process holds it: nothing to wait on but the clock
            continue
        s.listen()
        return s


def test_a_config_file_without_metrics_listen_runs_without_metrics_on_a_busy_default_port(
    short_dir: Path,
) -> None:
    """A busy metrics port is a start-up error only when someone chose the address
    (docs/operations.md): a config file for other settings leaves the built-in default,
    and a busy default turns metrics off with a warning; the same file naming that
    address refuses to start. (Any config file used to make it fatal.)"""
    conf = short_dir / "adaptd.toml"
    conf.write_text('[daemon]\nlog_level = "info"\n')
    where = ["--socket", str(short_dir / "a.sock"), "--state-dir", str(short_dir / "st")]
    with _hold_the_default_metrics_port():
        notify = NotifyListener(short_dir / "notify")
        d = Serve(["--config", str(conf), *where], notify, {})
        try:
            d.ready()
            d.log.wait_for("event=metrics_off")
            d.terminate()
            assert d.wait() == 0
        finally:
            d.kill()
            notify.close()
        conf.write_text('[daemon]\nlog_level = "info"\n[metrics]\nlisten = "127.0.0.1:9465"\n')
        r = cli("serve", "--config", str(conf), *where)
    assert r.returncode == 1
    assert "metrics.listen" in r.stderr and "9465" in r.stderr


# ---------------------------------------------------------------------------- sockets


def test_socket_modes_group_and_default_state_dir(short_dir: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    conf = short_dir / "adaptd.toml"
    conf.write_text(
        f'[daemon]\nsocket = "{short_dir}/run/j.sock"\nsocket_mode = "0640"\n'
        f'socket_group = "{group}"\nadmin_socket_mode = "0600"\n[metrics]\nlisten = "off"\n'
    )
    notify = NotifyListener(short_dir / "notify")
    xdg = short_dir / "xdg"
    env = {"XDG_STATE_HOME": str(xdg), "WATCHDOG_USEC": "1000000"}
    d = Serve(["--config", str(conf)], notify, env)
    try:
        d.ready()
        notify.wait_for("WATCHDOG", "1")  # from the loop's tick, WatchdogSec/2 apart
        job, adm = short_dir / "run" / "j.sock", short_dir / "run" / "j.admin.sock"
        assert stat.S_IMODE(job.stat().st_mode) == 0o640
        assert job.stat().st_gid == os.getgid()
        assert stat.S_IMODE(adm.stat().st_mode) == 0o600
        # a normal user's state lives in the XDG state directory
        assert (xdg / "adaptd" / "adaptd.sqlite3").is_file()
        reply = admin.request(job, admin.StatusRequest())
        assert reply.daemon.admin_socket == str(adm)
        # the sampler's newest snapshot rides along in status (probed before READY)
        assert reply.telemetry is not None and reply.telemetry["host"] is not None
        r = cli("status", "--socket", str(job), "--json")
        assert r.returncode == 0 and "host" in json.loads(r.stdout)["telemetry"]
        d.terminate()
        assert d.wait() == 0
        notify.wait_for("STOPPING", "1")
    finally:
        d.kill()
        notify.close()


# ---------------------------------------------------------------------------- lifecycle


def run_once(
    short_dir: Path, ctx: zmq.Context, *, saves: list[float], pause: bool
) -> tuple[admin.JobInfo, admin.JobInfo, dict, str]:
    """Start the daemon, let job j1 say hello (and save), stop it with SIGTERM while
    the job answers the drain. Returns the job as status showed it right after its
    hello and after its saves, the metrics scraped then, and the daemon's log."""
    conf = short_dir / "adaptd.toml"
    notify = NotifyListener(short_dir / f"notify-{time.monotonic_ns()}")
    sock = short_dir / "a.sock"
    d = Serve(["--config", str(conf), "--socket", str(sock)], notify, {})
    peer: Peer | None = None
    try:
        d.ready()
        assert notify.messages[0]["READY"] == "1"  # the first thing systemd hears
        assert sock.exists()
        url = re.search(r"url=(\S+)", d.log.wait_for("event=metrics")).group(1)
        peer = Peer(ctx, f"ipc://{sock}", "j1")
        peer.sock.send(b"\xc1 not msgpack")  # refused, and counted in metrics by code
        peer.until(p.Error)
        peer.hello()
        after_hello = admin.request(sock, admin.StatusRequest()).jobs[0]
        step = 0
        for cost in saves:
            step += 10
            peer.steps(step)
            peer.saved(step, blocking_s=cost)
        if pause:
            reply = admin.request(sock, admin.PauseRequest(job="j1", paused=True))
            assert not isinstance(reply, admin.ErrorReply), reply
        # status is answered after everything the peer sent before (one loop, in order)
        deadline = time.monotonic() + 10
        while (info := admin.request(sock, admin.StatusRequest()).jobs[0]).saves < (
            after_hello.saves + len(saves)
        ):
            assert time.monotonic() < deadline, info
        metrics = scrape(url)
        notify.wait_for("STATUS", prefix="1 jobs connected")  # from the next tick
        d.terminate()
        ask = peer.until(p.SaveNow)
        assert ask.reason == "shutdown"
        peer.steps(step + 1, count=1)
        peer.saved(step + 1, blocking_s=0.5)
        assert d.wait() == 0, d.log.text()
        notify.wait_for("STOPPING", "1")
        d.log.wait_for("event=drain_done", "durable=1")
        return after_hello, info, metrics, d.log.text()
    finally:
        if peer is not None:
            peer.close()
        d.kill()
        notify.close()


@pytest.mark.slow
def test_restart_keeps_learned_costs_failure_rate_history_and_settings(
    short_dir: Path, ctx: zmq.Context
) -> None:
    state = short_dir / "state"
    (short_dir / "adaptd.toml").write_text(
        f'[daemon]\nstate_dir = "{state}"\ndrain_grace_s = 20\n'
        f'[policy]\ndefault = "fixed:steps=10"\n[metrics]\nlisten = "127.0.0.1:0"\n'
    )
    fresh, first, metrics, log = run_once(short_dir, ctx, saves=[0.2, 0.3, 0.25], pause=True)
    assert fresh.saves == 0 and fresh.save_cost_s is None
    assert first.saves == 3 and first.save_cost_s is not None and first.paused
    assert "learned_restored" not in log  # nothing to restore the first time
    # metrics over HTTP, from the real daemon
    job = (("job_id", "j1"),)
    assert metrics[("adaptd_saves_total", (*job, ("result", "ok")))] == 3
    assert metrics[("adaptd_job_paused", job)] == 1
    assert metrics[("adaptd_save_blocking_seconds_count", (*job, ("tier", "durable")))] == 3
    assert metrics[("adaptd_jobs_connected", ())] == 1
    assert (
        sum(v for (name, _), v in metrics.items() if name == "adaptd_rejected_messages_total") == 1
    )

    with Store.open(state / "adaptd.sqlite3", readonly=True) as db:
        history = [s.blocking_s for s in db.saves("j1")]
        learned = db.param(job_scope("j1"), "learned")
        rate = db.param(GLOBAL, "failure_rate")
        setting = db.job_setting("j1")
    assert history == [0.2, 0.3, 0.25, 0.5]  # the drain's save too
    assert learned["saves"] == 4
    assert rate["gpu_seconds"] > 0
    assert setting is not None and setting.paused
    expected = JobTracker("j1")
    expected.load_learned(learned)

    # restart: the job says hello again and finds what the daemon had learned
    again, _, metrics, log = run_once(short_dir, ctx, saves=[], pause=False)
    assert "event=learned_restored what=failure_rate" in log
    assert "event=learned_restored job=j1 saves=4" in log
    assert again.saves == 4
    assert again.save_cost_s == pytest.approx(expected.save_cost_s)
    assert again.paused  # the operator's pause survived the restart
    # the plan made at the hello knew the restored step time: in the gauge and the row
    assert metrics[("adaptd_job_step_seconds", job)] == pytest.approx(0.05)
    with Store.open(state / "adaptd.sqlite3", readonly=True) as db:
        plans = [d for d in db.decisions("j1") if not d.urgent]
        assert plans[-1].step_time_s == pytest.approx(0.05)
        assert db.decisions("j1")[-1].reason == "shutdown"  # the drain's request
        assert len(db.saves("j1")) == 5
        assert db.param(GLOBAL, "failure_rate")["gpu_seconds"] >= rate["gpu_seconds"]
        assert db.param(job_scope("j1"), "learned")["saves"] == 5


def test_drain_waits_for_the_job_until_a_second_signal_or_with_no_grace(
    short_dir: Path, ctx: zmq.Context
) -> None:
    base = ["--socket", str(short_dir / "a.sock"), "--state-dir", str(short_dir / "st"),
            "--metrics-listen", "off"]  # fmt: skip
    for extra, signals in ((["--drain-grace", "0"], 1), ([], 2)):
        notify = NotifyListener(short_dir / f"notify-{signals}")
        d = Serve([*base, *extra], notify, {})
        peer = Peer(ctx, f"ipc://{short_dir / 'a.sock'}", "silent")
        try:
            d.ready()
            peer.hello()
            d.terminate()
            notify.wait_for("STOPPING", "1")
            if signals == 2:  # draining (90 s grace): the job is asked, never answers
                assert peer.until(p.SaveNow).reason == "shutdown"
                assert d.proc.poll() is None
                d.terminate()  # a second signal stops at once
            t0 = time.monotonic()
            assert d.wait() == 0
            assert time.monotonic() - t0 < 5.0
        finally:
            peer.close()
            d.kill()
            notify.close()


def test_a_second_daemon_on_the_same_state_refuses_and_names_the_first(short_dir: Path) -> None:
    """Two daemons on different sockets shared one state database, each overwriting the
    other's learned figures; started together, one said "database is locked; move it
    aside", which is the wrong advice."""
    state = short_dir / "state"

    def serve(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "adaptd.cli", "serve", "--socket", str(short_dir / name),
             "--state-dir", str(state), "--metrics-listen", "off", "--drain-grace", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def wait_until(cond, what: str) -> None:
        deadline = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < deadline, f"{what} within 30 s"
            time.sleep(0.02)  # the poll period

    first = serve("a.sock")
    try:
        wait_until(lambda: (short_dir / "a.sock").exists(), "the first daemon listening")
        second = serve("b.sock")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 1
        assert err.strip().splitlines() == [
            f"adaptd serve: daemon.db_path: {state / 'adaptd.sqlite3'}: in use by another "
            f"adaptd daemon (pid {first.pid}, socket {short_dir / 'a.sock'}); two daemons "
            "must not share a state database: stop that one first, or give this one its own "
            "daemon.state_dir (--state-dir)"
        ]
        assert not (short_dir / "b.sock").exists()
    finally:
        first.terminate()
        first.communicate(timeout=60)
    # started at the same moment: one serves, the other says which one holds the state
    for _ in range(3):
        both = [serve("c.sock"), serve("d.sock")]
        try:
            wait_until(lambda b=both: any(p.poll() is not None for p in b), "one of two exiting")
            lost = next(p for p in both if p.poll() is not None)
            won = next(p for p in both if p is not lost)
            _, err = lost.communicate(timeout=60)
            assert lost.returncode == 1 and "move it aside" not in err, err
            won_socket = "c.sock" if won is both[0] else "d.sock"
            assert f"(pid {won.pid}, socket {short_dir / won_socket})" in err, err
            assert won.poll() is None  # still serving
        finally:
            for p in both:
                if p.poll() is None:
                    p.terminate()
                p.communicate(timeout=60)
