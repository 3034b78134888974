"""The operator commands against a real daemon: save-now, drain, set-policy, pause, resume,
status with telemetry, and the shutdown drain of ``Daemon.stop(drain_s=...)``.

Jobs are real processes (``saving_job.py`` answers SaveNow with a SaveReport after a
chosen write time; ``fake_job.py`` never does) or raw DEALER peers; the commands run
through :func:`adaptd.cli.main` (and one as a subprocess) against a daemon process or a
daemon thread whose events a sink records.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import DEADLINE, HERE, DaemonProc, FakeJob, LogWatch, Peer, thread_daemon

from adaptd import events as ev
from adaptd.cli import main as cli_main
from adaptd.daemon.assembly import build
from adaptd.daemon.options import DaemonOptions
from adaptd.protocol import admin
from adaptd.protocol import job as p

CLI = [sys.executable, "-m", "adaptd.cli"]


class SavingJob:
    """A ``saving_job.py`` rank: answers SaveNow after ``save_s`` (or fails, or ignores)."""

    def __init__(
        self, endpoint: str, job: str, rank: int = 0, world: int = 1, save_s: float = 0.0,
        mode: str = "ok",
    ) -> None:  # fmt: skip
        self.job = job
        args = [endpoint, job, str(rank), str(world), str(save_s), mode]
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "saving_job.py"), *args], stdout=subprocess.PIPE
        )
        self.log = LogWatch(self.proc.stdout)

    def wait_plan(self, timeout: float = DEADLINE) -> dict:
        return json.loads(self.log.wait_for('"got": "plan"', timeout=timeout))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def jobs():
    started: list = []
    yield started
    for j in started:
        j.close()


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli_main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------ no daemon


@pytest.mark.parametrize(
    "args",
    [
        ("save-now", "--all"),
        ("drain", "--timeout", "5"),
        ("set-policy", "--job", "j", "fixed:steps=5"),
        ("pause", "--job", "j"),
        ("resume", "--all"),
    ],
)
def test_without_a_daemon_one_line_exit_1(short_dir, capsys, args) -> None:
    t0 = time.monotonic()
    rc, out, err = run_cli(capsys, *args, "--socket", str(short_dir / "adaptd.sock"))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and "no adaptd daemon is running" in err
    assert err.startswith(f"adaptd {args[0]}: ") and str(short_dir) in err
    assert time.monotonic() - t0 < 2.0


def test_stale_socket_drain_gives_up_at_its_answer_timeout(short_dir) -> None:
    """A socket file nobody serves: the command times out, it does not hang (subprocess)."""
    import socket

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(short_dir / "adaptd.admin.sock"))
    stale.close()
    r = subprocess.run(
        [*CLI, "save-now", "--all", "--socket", str(short_dir / "adaptd.sock"),
         "--answer-timeout", "0.5"],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert r.returncode == 1 and "did not answer within 0.5s" in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ drain


def test_drain_several_jobs_waits_for_every_rank(short_dir, jobs, capsys) -> None:
    d = DaemonProc(short_dir / "adaptd.sock")
    try:
        fast = SavingJob(d.endpoint, "fast", save_s=0.0)
        slow = SavingJob(d.endpoint, "slow", save_s=0.8)
        wide = [SavingJob(d.endpoint, "wide", rank=r, world=2, save_s=0.3 * r) for r in (0, 1)]
        jobs.extend([fast, slow, *wide])
        for j in jobs:
            j.wait_plan()
        rc, out, err = run_cli(capsys, "drain", "--timeout", "20", "--json", "--socket",
                               str(d.socket))  # fmt: skip
        assert rc == 0, err
        reply = json.loads(out)
        by_job = {j["job"]: j for j in reply["jobs"]}
        assert set(by_job) == {"fast", "slow", "wide"} and not reply["timed_out"]
        assert all(j["durable"] and j["error"] == "" for j in by_job.values())
        assert by_job["wide"]["ranks"] == 2
        assert by_job["slow"]["seconds"] >= 0.8 > by_job["fast"]["seconds"]
        assert by_job["wide"]["seconds"] >= 0.3  # waited for rank 1, the slower one
        for name in ("fast", "slow"):
            (j,) = [x for x in jobs if x.job == name]
            assert json.loads(j.log.wait_for('"got": "save_now"'))["reason"] == "drain"
            # the job prints its save after sending the report the drain waited for: wait
            # for that line (read at once, it was missing once in a two-process run)
            j.log.wait_for(f'"saved": {by_job[name]["step"]},')
        # two ranks, each saved its own step: the drain reports the older one
        wide_saved = [json.loads(r.log.wait_for('"saved": '))["saved"] for r in wide]
        assert by_job["wide"]["step"] == min(wide_saved)
        d.log.wait_for("event=operator_action", "action=drain", "jobs=3")
        d.log.wait_for("event=drain_job", "job=slow", "durable=True")
        # the human table
        rc, out, _ = run_cli(capsys, "drain", "--timeout", "20", "--socket", str(d.socket))
        assert rc == 0 and "3/3 job(s) durable" in out
        assert out.splitlines()[0].split() == ["JOB", "STEP", "DURABLE", "SECONDS", "NOTE"]
    finally:
        d.stop()


def test_drain_reports_timeout_failure_and_keeps_serving(short_dir, jobs, capsys) -> None:
    """A job that never answers times the drain out; a failed save is not durable; the
    daemon answers other requests while the drain waits (its reply is deferred)."""
    d = DaemonProc(short_dir / "adaptd.sock")
    deaf = FakeJob(d.endpoint, "deaf")
    try:
        good = SavingJob(d.endpoint, "good")
        bad = SavingJob(d.endpoint, "bad", mode="fail")
        jobs.extend([good, bad])
        deaf.wait_ready()
        good.wait_plan()
        bad.wait_plan()
        drain = subprocess.Popen(
            [*CLI, "drain", "--timeout", "3", "--json", "--socket", str(d.socket)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        d.log.wait_for("action=drain")
        # timed from here: the CLI's own start-up (a Python process on a loaded box) is
        # not the daemon's doing. A daemon blocked by the drain would answer only at its
        # end, 3 s after it began: half of that is the bound.
        t0 = time.monotonic()
        status = d.status()  # answered while the drain is still waiting on "deaf"
        assert time.monotonic() - t0 < 1.5 and drain.poll() is None
        assert {j.job for j in status.jobs} >= {"deaf", "good", "bad"}
        out, err = drain.communicate(timeout=DEADLINE)
        assert drain.returncode == 1, err
        reply = json.loads(out)
        # the daemon held its reply for the whole timeout, and not much longer (its own
        # clock, so neither the CLI's start nor its exit counts)
        assert 3.0 <= reply["seconds"] < 3.0 + 1.5, reply["seconds"]
        by_job = {j["job"]: j for j in reply["jobs"]}
        assert reply["timed_out"] is True
        assert by_job["good"]["durable"] is True
        assert by_job["bad"]["durable"] is False and "disk full (test)" in by_job["bad"]["error"]
        assert by_job["deaf"]["durable"] is False and by_job["deaf"]["step"] is None
        assert "timeout after 3s" in by_job["deaf"]["error"]
    finally:
        deaf.close()
        d.stop()


def test_drain_with_no_jobs_answers_at_once(shared_daemon, capsys) -> None:
    rc, out, _ = run_cli(capsys, "drain", "--socket", str(shared_daemon.socket))
    assert (rc, out) == (0, "no active jobs: nothing to drain\n")


def test_drain_timeout_is_validated(short_dir, capsys) -> None:
    rc, _, err = run_cli(capsys, "drain", "--timeout", "0", "--socket", str(short_dir / "x.sock"))
    assert rc == 2 and "--timeout must be in (0, 86400]" in err and "got 0" in err


# ------------------------------------------------------------------ save-now


def test_save_now_one_job_and_all(shared_daemon, zctx, capsys) -> None:
    a, b = Peer(zctx, shared_daemon.endpoint), Peer(zctx, shared_daemon.endpoint)
    a.hello("sn-a")
    b.hello("sn-b")
    sock = str(shared_daemon.socket)
    rc, out, _ = run_cli(capsys, "save-now", "--job", "sn-a", "--reason", "before upgrade",
                         "--socket", sock)  # fmt: skip
    assert rc == 0 and "sn-a" in out
    assert a.expect(p.SaveNow).reason == "before upgrade"
    assert b.silent_for(0.2)
    rc, out, _ = run_cli(capsys, "save-now", "--all", "--json", "--socket", sock)
    assert rc == 0 and {"sn-a", "sn-b"} <= set(json.loads(out)["jobs"])
    assert a.expect(p.SaveNow).reason == b.expect(p.SaveNow).reason == "operator request"
    shared_daemon.log.wait_for("event=operator_action", "action=save_now", "job=sn-a")
    rc, _, err = run_cli(capsys, "save-now", "--job", "nope", "--socket", sock)
    assert rc == 1 and "job 'nope' is unknown" in err and err.count("\n") == 1


def test_save_now_needs_a_target(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["save-now"])
    assert exc.value.code == 2 and "one of the arguments --job --all is required" in (
        capsys.readouterr().err
    )


# ------------------------------------------------------------------ set-policy


def test_set_policy_pushes_the_new_plan_at_once(shared_daemon, zctx, capsys) -> None:
    peer = Peer(zctx, shared_daemon.endpoint)
    first = peer.hello("sp-a")
    assert first.every_steps != 13
    sock = str(shared_daemon.socket)
    rc, out, _ = run_cli(capsys, "set-policy", "--job", "sp-a", "fixed:steps=13", "--socket", sock)
    assert rc == 0 and "policy fixed:steps=13 (was phased)" in out
    plan = peer.expect(p.Plan, timeout=2.0)
    assert plan.policy == "fixed" and plan.every_steps == 13 and plan.seq > first.seq
    info = shared_daemon.job("sp-a")
    assert info.policy == "fixed:steps=13" and info.policy_set
    shared_daemon.log.wait_for("action=set_policy", "job=sp-a", "previous=phased")
    # a reconnect keeps the operator's policy over the one the hello asks for
    peer.send(p.Hello(v=p.VERSION, job="sp-a", rank=0, policy="phased"))
    peer.expect(p.Welcome)
    assert peer.expect(p.Plan).every_steps == 13


def test_set_policy_bad_spec_and_unknown_job(shared_daemon, zctx, capsys) -> None:
    Peer(zctx, shared_daemon.endpoint).hello("sp-b")
    sock = str(shared_daemon.socket)
    rc, _, err = run_cli(capsys, "set-policy", "--job", "sp-b", "fixed:steps=0", "--socket", sock)
    assert rc == 2 and "policy spec 'fixed:steps=0'" in err and "steps must be >= 1" in err
    # the daemon checks too (a client that skips the local check)
    with pytest.raises(admin.AdminError) as exc:
        admin.request(sock, admin.SetPolicyRequest(job="sp-b", spec="nosuch"), timeout_s=DEADLINE)
    assert exc.value.code == "bad_policy" and "'nosuch'" in str(exc.value)
    assert shared_daemon.job("sp-b").policy == "phased"
    rc, _, err = run_cli(capsys, "set-policy", "--job", "ghost", "phased", "--socket", sock)
    assert rc == 1 and "job 'ghost' is unknown" in err


def test_every_example_spec_in_the_help_texts_is_accepted(capsys) -> None:
    """``set-policy --help`` showed 'fixed:every=500', which set-policy refuses."""
    import importlib
    import re

    from adaptd.cli import COMMANDS, build_parser
    from adaptd.core.policy import parse

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    specs = []
    for name, command in sub.choices.items():
        importlib.import_module(COMMANDS[name]).configure(command)
        quoted = re.findall(r"'([a-z_]+(?::[^' ]*)?(?:\+[a-z_:=,.;]+)*)'", command.format_help())
        for spec in quoted:
            if ":" in spec or spec in ("phased", "daly", "default"):
                specs.append((name, spec))
    assert ("set-policy", "fixed:steps=500") in specs
    for _, spec in specs:
        parse(spec)  # raises PolicyError for a bad example


# ------------------------------------------------------------------ pause / resume


def test_pause_holds_planned_saves_but_not_urgent_ones(short_dir, jobs, capsys) -> None:
    with thread_daemon(short_dir / "adaptd.sock", default_policy="fixed:steps=50") as (d, sink):
        job = SavingJob(d.endpoint, "pz")
        jobs.append(job)
        assert job.wait_plan()["every"] == 50
        sock = str(d.socket_path)
        rc, out, _ = run_cli(capsys, "pause", "--job", "pz", "--socket", sock)
        assert (rc, out) == (0, "paused: pz\n")
        held = json.loads(job.log.wait_for('"got": "plan"', "paused by operator"))
        assert held["next_step"] is None and held["every"] is None
        changed = sink.wait_for(ev.JobSettingsChanged)
        assert (changed.job, changed.policy, changed.paused) == ("pz", None, True)
        info = next(j for j in d.status().jobs if j.job == "pz")
        assert info.paused and info.next_save_step is None
        rc, out, _ = run_cli(capsys, "status", "--socket", sock)
        assert "paused" in out and "pz: paused by operator" in out
        # an urgent save still goes through
        rc, _, _ = run_cli(capsys, "save-now", "--job", "pz", "--socket", sock)
        sink.wait_for(ev.SaveReported, lambda e: e.job == "pz")
        rc, out, _ = run_cli(capsys, "pause", "--all", "--socket", sock)
        assert out == "nothing to pause: every active job is already paused\n"
        rc, out, _ = run_cli(capsys, "resume", "--all", "--socket", sock)
        assert (rc, out) == (0, "resumed: pz\n")
        job.log.wait_for('"got": "plan"', '"every": 50')
        assert sink.of(ev.JobSettingsChanged)[-1].paused is False
        assert not next(j for j in d.status().jobs if j.job == "pz").paused
        rc, out, _ = run_cli(capsys, "resume", "--all", "--socket", sock)
        assert (rc, out) == (0, "nothing to resume: no paused job to resume\n")
        rc, _, err = run_cli(capsys, "pause", "--job", "ghost", "--socket", sock)
        assert rc == 1 and "unknown" in err


def test_pause_all_without_active_jobs_says_so(short_dir, capsys) -> None:
    with thread_daemon(short_dir / "adaptd.sock") as (d, _):
        rc, out, _ = run_cli(capsys, "pause", "--all", "--socket", str(d.socket_path))
    assert (rc, out) == (0, "nothing to pause: no active jobs\n")


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("status", "--json"),
        ("save-now", "--all"),
        ("drain", "--timeout", "0.5"),
        ("pause", "--all"),
        ("resume", "--all"),
        ("set-policy", "--job", "ipc-job", "fixed:steps=7"),
    ],
)
def test_operator_commands_take_the_ipc_form_serve_takes(shared_daemon, zctx, capsys, args):
    """``--socket ipc:///run/x/adaptd.sock`` as ``serve --socket`` and ADAPTD_SOCKET take
    it: it said "no adaptd daemon is running (no socket at ipc:/run/x/adaptd.admin.sock)"."""
    Peer(zctx, shared_daemon.endpoint).hello("ipc-job")
    rc, out, err = run_cli(capsys, *args, "--socket", f"ipc://{shared_daemon.socket}")
    assert "no adaptd daemon" not in err and out
    assert rc == (1 if args[0] == "drain" else 0), err  # the peer never saves: drain times out


def test_settings_restored_at_start_apply_to_the_job(short_dir, zctx, caplog) -> None:
    """What the store hands back (job_settings) holds from the job's first hello; a stored
    policy that no longer parses is dropped with a warning, not a start-up failure."""
    settings = {
        "kept": admin.JobSettings(policy="fixed:steps=9", paused=True),
        "broken": admin.JobSettings(policy="nosuch:x=1", paused=False),
    }
    with thread_daemon(short_dir / "adaptd.sock", job_settings=settings) as (d, sink):
        plan = Peer(zctx, d.endpoint).hello("kept")
        assert plan.policy == "fixed" and plan.next_step is None
        assert plan.reason.startswith("paused by operator")
        assert Peer(zctx, d.endpoint).hello("broken").policy == "phased"
        # resume a job restored as paused: the next plan has its saves again
        reply = admin.request(d.socket_path, admin.PauseRequest(job="kept", paused=False))
        assert isinstance(reply, admin.PauseReply) and reply.jobs == ["kept"]
        assert d.job_settings["kept"] == admin.JobSettings(policy="fixed:steps=9", paused=False)
        assert sink.wait_for(ev.JobSettingsChanged).policy == "fixed:steps=9"
    assert "setting_ignored" in caplog.text and "nosuch" in caplog.text


# ------------------------------------------------------------------ events for the sinks


def test_rejected_messages_and_saves_in_flight_are_events(short_dir, zctx) -> None:
    with thread_daemon(short_dir / "adaptd.sock") as (d, sink):
        peer = Peer(zctx, d.endpoint)
        peer.send_raw(b"not msgpack")
        peer.expect(p.Error)
        assert sink.wait_for(ev.MessageRejected).code == "invalid"
        peer.hello("fl")
        peer.send(p.Steps(v=p.VERSION, job="fl", rank=0, step=3, count=1, mean_s=0.01,
                          save_in_flight=True))  # fmt: skip
        assert sink.wait_for(ev.SaveInFlight).writing is True
        peer.send(p.SaveReport(v=p.VERSION, job="fl", rank=0, step=3, blocking_s=0.0,
                               durable_s=0.1, bytes=1))  # fmt: skip
        sink.wait_for(ev.SaveInFlight, lambda e: not e.writing)
        assert [e.writing for e in sink.of(ev.SaveInFlight)] == [True, False]
        with pytest.raises(admin.AdminError):
            admin.request(d.socket_path, admin.SaveNowRequest(job="ghost"))
        sink.wait_for(ev.MessageRejected, lambda e: e.code == "admin_unknown_job")


# ------------------------------------------------------------------ status with telemetry


def test_status_shows_telemetry_and_survives_a_failing_source(short_dir, zctx, capsys) -> None:
    from nvml_fixture import FixtureNvml

    from adaptd.telemetry import report
    from adaptd.telemetry.sampler import Sampler

    sampler = Sampler.default(interval=1.0, nvml_library=FixtureNvml("h100_8gpu"))
    source = {"telemetry": lambda: report.to_dict(sampler.latest())}  # swapped below
    try:
        sampler.tick(time.monotonic())
        with thread_daemon(
            short_dir / "adaptd.sock",
            status_extra=lambda: source["telemetry"](),
            snapshot_source=sampler.latest,
        ) as (d, _):
            Peer(zctx, d.endpoint).hello("tele")
            sock = str(d.socket_path)
            rc, out, _ = run_cli(capsys, "status", "--socket", sock)
            assert rc == 0 and "telemetry (" in out and "INTERVAL" in out
            assert "H100" in out  # the fixture's GPU table
            rc, out, _ = run_cli(capsys, "status", "--json", "--socket", sock)
            data = json.loads(out)
            assert len(data["telemetry"]["gpus"]) == 8 and data["jobs"][0]["job"] == "tele"

            def broken() -> dict:
                raise RuntimeError("sampler gone")

            source["telemetry"] = broken
            rc, out, _ = run_cli(capsys, "status", "--json", "--socket", sock)
            assert rc == 0 and json.loads(out)["telemetry"] is None
            assert d.counters["status_extra_errors"] == 1
    finally:
        sampler.close()


# ------------------------------------------------------------------ shutdown drain


def test_stop_with_drain_waits_for_every_jobs_save(short_dir, jobs) -> None:
    with thread_daemon(short_dir / "adaptd.sock") as (d, sink):
        quick = SavingJob(d.endpoint, "sd-quick")
        slow = SavingJob(d.endpoint, "sd-slow", save_s=0.7)
        jobs.extend([quick, slow])
        quick.wait_plan()
        slow.wait_plan()
        t0 = time.monotonic()
        d.stop(timeout_s=DEADLINE, drain_s=DEADLINE)
        elapsed = time.monotonic() - t0
        assert not d._thread.is_alive() and not d.socket_path.exists()
        assert 0.7 <= elapsed < 5.0
        reports = {e.job: e.report for e in sink.of(ev.SaveReported)}
        assert set(reports) == {"sd-quick", "sd-slow"}
        assert all(r.ok and r.reason == "shutdown" for r in reports.values())
        asked = sink.of(ev.SaveRequested)
        assert {e.job for e in asked} == {"sd-quick", "sd-slow"}
        assert {e.reason for e in asked} == {"shutdown"}


def test_stop_with_drain_gives_up_after_drain_s_and_a_second_stop_is_at_once(
    short_dir,
) -> None:
    with thread_daemon(short_dir / "adaptd.sock") as (d, sink):
        deaf = FakeJob(d.endpoint, "sd-deaf")
        try:
            deaf.wait_ready()
            t0 = time.monotonic()
            d.stop(timeout_s=DEADLINE, drain_s=1.0)
            assert 1.0 <= time.monotonic() - t0 < 3.0 and not d._thread.is_alive()
            assert sink.wait_for(ev.SaveRequested).reason == "shutdown"
        finally:
            deaf.close()
    with thread_daemon(short_dir / "adaptd.sock") as (d, _):
        deaf = FakeJob(d.endpoint, "sd-deaf2")
        try:
            deaf.wait_ready()
            t0 = time.monotonic()
            d.stop(timeout_s=None, drain_s=60.0)  # returns at once: no join
            d.stop(timeout_s=DEADLINE)  # "now"
            assert time.monotonic() - t0 < 2.0 and not d._thread.is_alive()
        finally:
            deaf.close()


def test_sigterm_drains_a_real_daemon_process(short_dir, jobs) -> None:
    """``adaptd serve`` wires SIGTERM to ``stop(drain_s=--drain-grace)``: the jobs save
    (reason ``shutdown``) and the daemon exits 0 once they are durable."""
    d = DaemonProc(short_dir / "adaptd.sock", drain_grace=20)
    try:
        a = SavingJob(d.endpoint, "term-a", save_s=0.5)
        b = SavingJob(d.endpoint, "term-b")
        jobs.extend([a, b])
        a.wait_plan()
        b.wait_plan()
        t0 = time.monotonic()
        d.proc.terminate()
        assert d.proc.wait(timeout=DEADLINE) == 0
        assert 0.5 <= time.monotonic() - t0 < 8.0
        for j in (a, b):
            assert json.loads(j.log.wait_for('"got": "save_now"'))["reason"] == "shutdown"
            j.log.wait_for('"saved"')
        d.log.wait_for("event=drain_done", "reason=shutdown", "jobs=2", "durable=2")
    finally:
        d.stop()


def test_stop_with_drain_and_no_jobs_is_immediate(short_dir) -> None:
    d = build(DaemonOptions(socket=short_dir / "adaptd.sock", default_policy="phased")).start()
    t0 = time.monotonic()
    d.stop(timeout_s=DEADLINE, drain_s=30.0)
    assert time.monotonic() - t0 < 1.0 and not d._thread.is_alive()


@pytest.mark.slow
@pytest.mark.tf
def test_drain_with_a_real_tensorflow_job(tmp_path: Path, capsys) -> None:
    """The real hook: a Keras demo job saves on `adaptd drain` and the checkpoint is durable."""
    import os
    import shutil
    import tempfile

    from adaptd.commands._spawn import running_daemon

    short = Path(tempfile.mkdtemp(prefix="adt-", dir="/tmp"))  # ipc paths: 107 bytes at most
    sock = short / "adaptd.sock"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    isolate = ["--state-dir", str(sock.parent), "--metrics-listen", "off", "--drain-grace", "0"]
    with running_daemon(sock, ["--policy", "fixed:steps=100000", *isolate]):
        log = open(tmp_path / "job.log", "w")  # noqa: SIM115
        job = subprocess.Popen(
            [sys.executable, "-m", "adaptd.client.demo_job", "--dir", str(tmp_path / "ck"),
             "--steps", "100000", "--socket", str(sock)],
            stdout=subprocess.PIPE, stderr=log, env=env,
        )  # fmt: skip
        try:
            watch = LogWatch(job.stdout)
            # the daemon's plan is in force: the job said hello and heard back
            watch.wait_for('"event": "plan"', '"mode": "daemon"', timeout=120)
            rc, out, err = run_cli(capsys, "drain", "--timeout", "60", "--json",
                                   "--socket", str(sock))  # fmt: skip
            assert rc == 0, err
            (entry,) = json.loads(out)["jobs"]
            assert entry["durable"] and entry["step"] > 0
            # the job's own report of that save, and the checkpoint on disk
            saved = json.loads(watch.wait_for('"event": "save"', f'"step": {entry["step"]}, '))
            assert saved["ok"] is True
            assert list((tmp_path / "ck").rglob("*.index")), "no checkpoint written"
        finally:
            job.kill()
            job.wait()
            log.close()
            shutil.rmtree(short, ignore_errors=True)
