"""adaptd's SavePolicy inside real JAX jobs on CPU that save with Orbax, one process each.

The job (orbax_job.py) cannot import TensorFlow. Its state after step ``s`` is a
function of ``s`` (JAX on CPU is deterministic), so a resumed run is compared with the
run it continues by the digests both print.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jax_orbax.jobs import MISSING, OrbaxJob, finalized

pytest.importorskip("orbax.checkpoint", reason=MISSING)

from adaptd.commands._spawn import LogWatch, start_daemon, stop_daemon
from adaptd.protocol import admin

pytestmark = [pytest.mark.slow, pytest.mark.jax]


def status_of(sock: Path, job: str) -> admin.JobInfo | None:
    reply = admin.request(sock, admin.StatusRequest(), timeout_s=10)
    assert isinstance(reply, admin.StatusReply)
    return next((j for j in reply.jobs if j.job == job), None)


def wait_status(sock: Path, job: str, pred, what: str, timeout: float = 60.0) -> admin.JobInfo:
    end = time.monotonic() + timeout
    while True:
        info = status_of(sock, job)
        if info is not None and pred(info):
            return info
        assert time.monotonic() < end, f"no {what} within {timeout}s; last status {info}"
        time.sleep(0.05)  # the poll period


def wait_history(sock: Path, job: str, pred, what: str, timeout: float = 60.0):
    """The first save of ``job``'s history (the daemon's state database) with ``pred``."""
    end = time.monotonic() + timeout
    while True:
        reply = admin.request(sock, admin.HistoryRequest(job=job, limit=1000), timeout_s=10)
        assert isinstance(reply, admin.HistoryReply)
        hit = next((s for s in reply.saves if pred(s)), None)
        if hit is not None:
            return hit
        assert time.monotonic() < end, f"no {what} within {timeout}s: {reply.saves[-5:]}"
        time.sleep(0.05)  # the poll period


def test_the_daemons_plan_decides_orbax_saves_and_hears_what_they_cost(short_dir: Path) -> None:
    """The daemon plans by the job's spec, Orbax saves exactly at the planned steps, and
    each save's report (blocked, durable, bytes) reaches the daemon; the run ends with
    a Goodbye (finished, not lost)."""
    sock = short_dir / "d.sock"
    daemon = start_daemon(sock)
    job = OrbaxJob(short_dir / "job.log", "--dir", short_dir / "ckpt", "--job", "jx",
                   "--steps", 60, "--socket", sock, "--policy", "fixed:steps=15")  # fmt: skip
    try:
        end = job.finish()
        info = wait_status(sock, "jx", lambda i: i.state == "finished", "finished job")
    finally:
        job.close()
        stop_daemon(daemon)
    assert end["steps"][-3:] == [30, 45, 60]  # max_to_keep=3
    assert [r["step"] for r in end["reports"]] == [15, 30, 45, 60]
    assert all(r["ok"] and r["bytes"] > 0 and r["durable_s"] > 0 for r in end["reports"])
    assert all(r["reason"] for r in end["reports"])
    assert info.saves == 4 and info.failed_saves == 0
    assert info.last_save is not None and info.last_save.step == 60
    assert info.policy == "fixed:steps=15"
    assert info.checkpoint_dir == str((short_dir / "ckpt").resolve())
    assert "adaptd: starting fresh: no Orbax checkpoint" in job.stderr()


def test_sigkilled_job_resumes_from_the_newest_finalized_step_exactly(short_dir: Path) -> None:
    """A job SIGKILLed mid-run resumes from the newest step Orbax finalized, with
    exactly the state the killed run had at that step, and goes on as it did."""
    ckpt = short_dir / "ckpt"
    first = OrbaxJob(short_dir / "a.log", "--dir", ckpt, "--job", "jk", "--steps", 100000,
                     "--socket", short_dir / "none.sock", "--policy", "fixed:steps=10",
                     "--step-sleep", 0.002)  # fmt: skip
    try:
        first.wait_for(lambda e: e["event"] == "step" and e["step"] >= 45)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
    finally:
        first.close()
    ran = first.step_digests()
    steps = finalized(ckpt)
    assert steps, "no step was finalized before the kill"
    newest = steps[-1]
    assert newest % 10 == 0 and newest < max(ran)
    checked = verify(ckpt)
    assert checked.returncode == 0, checked.stdout
    assert json.loads(checked.stdout)["step"] == newest
    second = OrbaxJob(short_dir / "b.log", "--dir", ckpt, "--job", "jk",
                      "--steps", max(ran) + 5, "--socket", short_dir / "none.sock",
                      "--policy", "fixed:steps=10")  # fmt: skip
    try:
        second.finish()
    finally:
        second.close()
    start = next(e for e in second.events if e["event"] == "start")
    assert start["step"] == newest
    assert start["digest"] == ran[newest]
    again = second.step_digests()
    assert all(again[s] == ran[s] for s in range(newest + 1, max(ran) + 1))
    assert f"adaptd: resumed from step {newest} (Orbax step {newest}, finalized" in second.stderr()
    for step in finalized(ckpt):  # as if every write had been cut short
        (ckpt / str(step)).rename(ckpt / f"{step}.orbax-checkpoint-tmp-1")
    refused = verify(ckpt)
    assert refused.returncode == 1
    assert "never committed" in json.dumps(json.loads(refused.stdout)["problems"])


def verify(path: Path) -> subprocess.CompletedProcess:
    """``adaptd verify --json PATH`` (an Orbax directory: no TensorFlow needed)."""
    cmd = [sys.executable, "-m", "adaptd.cli", "verify", "--json", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_save_now_reaches_the_job_and_a_daemon_killed_mid_run_leaves_it_on_its_own(
    short_dir: Path,
) -> None:
    """An operator's ``adaptd save-now`` makes the running job save at its next step,
    with the operator's reason; then the daemon dies under it: the
    job says so, goes on saving by its embedded policy (the same spec), and trains on."""
    sock = short_dir / "d.sock"
    daemon = start_daemon(sock, log=subprocess.PIPE)
    LogWatch(daemon.stderr, 30)
    job = OrbaxJob(short_dir / "job.log", "--dir", short_dir / "ckpt", "--job", "jd",
                   "--steps", 100000, "--socket", sock, "--policy", "fixed:steps=20",
                   "--daemon-timeout", 0.5, "--step-sleep", 0.005)  # fmt: skip
    try:
        wait_status(sock, "jd", lambda i: i.step > 0, "the job's first step report")
        why = "before the upgrade"
        asked = adaptd("save-now", "--job", "jd", "--reason", why, "--socket", sock)
        assert asked.returncode == 0, asked.stderr
        save = wait_history(sock, "jd", lambda s: s.reason == why, "the save-now's report")
        assert save.ok
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(30)
        killed_at = max(job.step_digests())
        text = job.wait_text(f"no daemon at ipc://{sock}")
        assert "deciding in-process with policy 'fixed:steps=20'" in text
        job.wait_for(lambda e: e["event"] == "step" and e["step"] >= killed_at + 100)
        after = [s for s in finalized(short_dir / "ckpt") if s > killed_at]
        assert after and all(s % 20 == 0 for s in after)  # the embedded fixed:steps=20
        assert job.proc.poll() is None  # still training
    finally:
        job.close()
        stop_daemon(daemon)


def adaptd(*args: object) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "adaptd.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_sigterm_saves_the_next_step_waits_for_its_commit_then_exits(short_dir: Path) -> None:
    """SIGTERM (a preemption) to a job whose plan has no save for a million steps: the
    next step is saved, finalized by Orbax before the process goes, and the signal ends
    the process; a restart resumes from that step with exactly its state."""
    ckpt = short_dir / "ckpt"
    args = ("--dir", ckpt, "--job", "jt", "--socket", short_dir / "none.sock",
            "--policy", "fixed:steps=1000000")  # fmt: skip
    first = OrbaxJob(short_dir / "a.log", *args, "--steps", 100000, "--step-sleep", 0.005)
    try:
        first.wait_for(lambda e: e["event"] == "step" and e["step"] >= 20)
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(120) == -signal.SIGTERM
    finally:
        first.close()
    ran = first.step_digests()
    saved = max(ran) - 1  # the step saved; the next call waited for its commit
    assert finalized(ckpt) == [saved]
    assert f"SIGTERM: saving step {saved}, then exiting" in first.stderr()
    second = OrbaxJob(short_dir / "b.log", *args, "--steps", saved + 1)
    try:
        second.finish()
    finally:
        second.close()
    start = next(e for e in second.events if e["event"] == "start")
    assert (start["step"], start["digest"]) == (saved, ran[saved])
