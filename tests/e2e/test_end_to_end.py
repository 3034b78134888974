"""The whole decision loop: a real daemon process and real TensorFlow job processes.

No part is faked: ``adaptd serve`` runs as a child process on its own ipc socket,
the training job (:mod:`adaptd.client.demo_job`, a Keras model with Dropout, Adam
and a shuffled tf.data pipeline) runs as another, and they talk over ZeroMQ.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from queue import Empty, Queue

import pytest
from faults.zygote import Zygote

from adaptd.commands._spawn import running_daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.slow, pytest.mark.tf]

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")


class Job:
    """A demo_job process whose JSON events are read on a thread; its other lines (its
    stderr too) go to ``job.log``. Forked from the session's zygote (tests/faults/zygote.py):
    a real process of its own, started without TensorFlow's import."""

    def __init__(self, zygote: Zygote, tmp: Path, socket: Path, steps: int, *extra: str) -> None:
        self.log = open(tmp / "job.log", "a")  # noqa: SIM115 - closed in stop()
        argv = ["--dir", tmp / "ckpts", "--steps", steps, "--socket", socket, *extra]
        self.proc = zygote.spawn(argv, module="adaptd.client.demo_job", reader=False)
        self.events: Queue[dict] = Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
            elif not self.log.closed:
                self.log.write(line)
                self.log.flush()
        self.events.put({"event": "eof"})

    def until(self, pred, timeout: float = 120.0) -> Iterator[dict]:
        """Yield events until one satisfies ``pred`` (returned last); fail on EOF/timeout."""
        while True:
            try:
                ev = self.events.get(timeout=timeout)
            except Empty:
                pytest.fail(f"no matching event within {timeout}s")
            if ev["event"] == "eof" and not pred(ev):
                pytest.fail(f"job exited ({self.proc.wait(30)}) before the expected event")
            yield ev
            if pred(ev):
                return

    def wait(self, timeout: float = 180.0) -> list[dict]:
        events = list(self.until(lambda e: e["event"] == "eof", timeout))
        assert self.proc.wait(timeout=30) == 0, f"the job failed; see {self.log.name}"
        return events

    def stop(self) -> None:
        self.proc.kill()
        self.log.close()


def test_daemon_plans_reach_the_job_and_saves_follow_them(tmp_path: Path, zygote: Zygote) -> None:
    sock = tmp_path / "adaptd.sock"
    with running_daemon(sock, ["--policy", "fixed:steps=40"]):
        job = Job(zygote, tmp_path, sock, 130)
        try:
            events = job.wait()
        finally:
            job.stop()
    plans = [e for e in events if e["event"] == "plan"]
    saves = [e for e in events if e["event"] == "save"]
    assert plans and plans[-1]["mode"] == "daemon", plans
    assert "every 40 steps" in plans[-1]["reason"]
    # the plan's saves, then close() saves the last step
    assert [s["step"] for s in saves] == [40, 80, 120, 130]
    assert all(s["ok"] and s["bytes"] > 1_000_000 and s["durable_s"] > 0 for s in saves)
    # checkpoints are numbered by the global step and readable by plain TF tools
    # (the demo job keeps three)
    names = sorted(p.name for p in (tmp_path / "ckpts").glob("ckpt-*.index"))
    assert names == ["ckpt-120.index", "ckpt-130.index", "ckpt-80.index"]


def test_sigkill_then_resume_continues_from_the_newest_durable_save(
    tmp_path: Path, zygote: Zygote
) -> None:
    sock = tmp_path / "adaptd.sock"
    with running_daemon(sock, ["--policy", "fixed:steps=30"]):
        job = Job(zygote, tmp_path, sock, 200)
        try:
            durable = 0
            for ev in job.until(lambda e: e["event"] == "progress" and e["step"] >= 100):
                if ev["event"] == "save" and ev["ok"]:
                    durable = max(durable, ev["step"])
            job.proc.send_signal(signal.SIGKILL)
            job.proc.wait(30)
        finally:
            job.stop()
        assert durable >= 60
        resumed = Job(zygote, tmp_path, sock, 200)
        try:
            events = resumed.wait()
        finally:
            resumed.stop()
    start = next(e for e in events if e["event"] == "start")
    assert durable <= start["step"] < 110 and start["step"] % 30 == 0
    saves = [e["step"] for e in events if e["event"] == "save" and e["ok"]]
    # numbering continues on the same grid after the resume: no ckpt-1 again
    assert saves and all(s > start["step"] and s % 30 == 0 for s in saves[:-1])
    assert not list((tmp_path / "ckpts").glob("*_temp*"))


def test_job_falls_back_without_daemon_and_reconnects_when_one_starts(
    tmp_path: Path, zygote: Zygote
) -> None:
    sock = tmp_path / "adaptd.sock"
    job = Job(zygote, tmp_path, sock, 100_000, "--policy", "fixed:steps=25")
    daemon = None
    try:
        list(job.until(lambda e: e["event"] == "plan" and e["mode"] == "embedded"))
        list(job.until(lambda e: e["event"] == "save" and e["ok"]))  # saves without a daemon
        daemon = start_daemon(sock)
        list(job.until(lambda e: e["event"] == "plan" and e["mode"] == "daemon", timeout=60))
        stop_daemon(daemon)  # and the daemon goes away again: back to the embedded policy
        daemon = None
        list(job.until(lambda e: e["event"] == "plan" and e["mode"] == "embedded", timeout=60))
        saved = list(job.until(lambda e: e["event"] == "save", timeout=60))
        assert saved[-1]["ok"]
    finally:
        job.stop()
        if daemon is not None:
            stop_daemon(daemon)


def test_demo_command_kills_resumes_and_summarises(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "demo", "--dir", str(tmp_path), "--steps", "240",
         "--kill-at", "0.5", "--policy", "fixed:steps=50", "--json"],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["completed"] and summary["steps"] == 240
    assert summary["killed_at_step"] >= 120
    # the newest durable save before the kill at 120..: step 100, or 50 if 100 was still writing
    resumed = summary["resumed_from_step"]
    assert resumed in (50, 100) and resumed >= summary["last_durable_before_kill"]
    assert summary["lost_steps"] == summary["killed_at_step"] - resumed
    assert summary["saves"] >= 4 and summary["failed_saves"] == 0
    assert summary["mean_bytes"] > 1_000_000 and summary["mean_durable_s"] > 0


def test_the_demo_with_the_daemons_own_policy_saves_kills_and_resumes(tmp_path: Path) -> None:
    """`make demo`'s path: no --policy, the daemon decides. Its first save (the default
    policy's probe) must come early enough in the run for the kill and the resume to
    happen: with production's probe (M/10 = 12 s) a quiet 2-core VM ran all 1,500
    steps before it and the demo showed no save, no kill, no resume."""
    out = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "demo", "--dir", str(tmp_path), "--steps", "600",
         "--json"],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["completed"] and summary["killed_at_step"] is not None, summary
    assert 0 < summary["resumed_from_step"] <= summary["killed_at_step"], summary
