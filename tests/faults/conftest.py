"""Fixtures for the fault-injection tests: a TensorFlow zygote, short socket paths,
and small real filesystems (tmpfs) that a test can fill up or make read-only."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptd.commands._spawn import LogWatch, start_daemon, stop_daemon
from adaptd.protocol import admin

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = ROOT / "tests" / "client" / "train_script.py"


class Serve:
    """``adaptd serve`` on ``socket`` (state in ``state``) with its log watched; it can be
    SIGKILLed and started again. ``job()``: the status of the job ``job``."""

    def __init__(self, socket: Path, state: Path, job: str) -> None:
        self.socket, self.state, self.job_id = socket, state, job
        self.proc: subprocess.Popen | None = None
        self.log: LogWatch | None = None

    def start(self) -> None:
        # a SIGKILLed daemon leaves its socket file behind, so wait for the log line
        self.proc = start_daemon(
            self.socket, ("--drain-grace", "0"), state_dir=self.state, log=subprocess.PIPE
        )
        self.log = LogWatch(self.proc.stderr, 60.0)
        self.log.wait_for("event=listening")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL

    def job(self) -> admin.JobInfo:
        reply = admin.request(self.socket, admin.StatusRequest(), timeout_s=10)
        assert isinstance(reply, admin.StatusReply)
        return next(j for j in reply.jobs if j.job == self.job_id)

    def wait_job(self, pred, what: str, timeout: float = 60.0) -> admin.JobInfo:
        """Poll the job's status (the admin socket) until ``pred(info)``: a report the
        job printed as sent may not have been handled by the daemon yet."""
        end = time.monotonic() + timeout
        while True:
            info = self.job()
            if pred(info):
                return info
            assert time.monotonic() < end, f"no {what} within {timeout}s; last status {info}"
            time.sleep(0.05)  # the poll period

    def stop(self) -> None:
        if self.proc is not None:
            stop_daemon(self.proc)


def state(ckpt: Path) -> tuple[int | None, set[int]]:
    """(latest step, every step listed) from TensorFlow's ``checkpoint`` state file."""
    path = ckpt / "checkpoint"
    if not path.exists():
        return None, set()
    text = path.read_text()
    latest = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', text, re.M)
    listed = {int(s) for s in re.findall(r'^all_model_checkpoint_paths: "ckpt-(\d+)"', text, re.M)}
    return (int(latest.group(1)) if latest else None), listed


def on_disk(ckpt: Path) -> set[int]:
    """Steps with any ``ckpt-N.*`` file (not the temporary names of a write)."""
    return {
        int(m.group(1))
        for p in ckpt.iterdir()
        if (m := re.fullmatch(r"ckpt-(\d+)\.(index|data-\d+-of-\d+)", p.name))
    }


class SmallFS:
    """A tmpfs of a fixed size mounted at ``path``: fill it, make it read-only, and back."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        self.size = size

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        _mount("-t", "tmpfs", "-o", f"size={self.size},mode=0755", "tmpfs", str(self.path))

    def remount(self, mode: str) -> None:
        """``mode``: ``"ro"`` or ``"rw"``."""
        _mount("-o", f"remount,{mode}", str(self.path))

    def fill(self, name: str = "filler") -> Path:
        """Write zeros into ``name`` until the filesystem is full (ENOSPC)."""
        filler = self.path / name
        block = b"\0" * (1 << 16)
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(block)
            except OSError:  # ENOSPC: full
                pass
        # the last partial page too, one byte at a time is too slow: 4 KiB then bytes
        with open(filler, "ab", buffering=0) as f:
            for chunk in (4096, 1):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError:
                    continue
        return filler

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)


def _mount(*args: str) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise PermissionError(f"mount {' '.join(args)}: {res.stderr.strip() or res.returncode}")


@pytest.fixture
def small_fs(short_dir: Path) -> Iterator[SmallFS]:
    """A 24 MiB tmpfs at ``short_dir/fs``; skipped where mounting is not permitted."""
    fs = SmallFS(short_dir / "fs", "24m")
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) on this host: cannot make a small filesystem to fill")
    try:
        fs.mount()
    except PermissionError as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {exc}")
    yield fs
    fs.unmount()
