"""Helpers of tests/jax_orbax (a folder not named orbax: it would shadow the package).

Real JAX jobs on CPU that checkpoint with Orbax under adaptd's policy
(tests/jax_orbax/orbax_job.py), run as processes of their own; the test modules skip
where the jax extra is not installed (``pip install 'adaptd[jax]'``; ``make test``
installs it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
JOB_SCRIPT = HERE / "orbax_job.py"

#: Why a test module skips where the jax extra is missing (each calls importorskip).
MISSING = "needs JAX and Orbax (pip install 'adaptd[jax]'; make test installs it)"

#: JAX and Orbax quiet, and no TensorFlow anywhere near (``import tensorflow`` fails in
#: the job: the Orbax adapter must not need it).
ENV = dict(
    os.environ,
    PYTHONUNBUFFERED="1",
    JAX_PLATFORMS="cpu",
    TF_CPP_MIN_LOG_LEVEL="3",
    PYTHONPATH=str(HERE),
)


class OrbaxJob:
    """One process of tests/jax_orbax/orbax_job.py; its JSON events are read on a thread,
    its stderr goes to ``log``."""

    def __init__(self, log: Path, *args: object) -> None:
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115 - closed in close()
        cmd = [sys.executable, "-c", _NO_TF, str(JOB_SCRIPT), *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, env=ENV)
        self.events: list[dict] = []
        self._cond = threading.Condition()
        self._eof = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith("{"):
                with self._cond:
                    self.events.append(json.loads(line))
                    self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[dict], bool], timeout: float = 90.0) -> dict:
        """The first event satisfying ``pred``; fails on the job's exit or the timeout."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                hit = next((e for e in self.events if pred(e)), None)
                if hit is not None:
                    return hit
                if self._eof:
                    pytest.fail(f"job exited ({self.proc.wait(30)}) first; log: {self.stderr()}")
                left = end - time.monotonic()
                if left <= 0:
                    pytest.fail(f"no such event within {timeout}s; log: {self.stderr()}")
                self._cond.wait(left)

    def finish(self, timeout: float = 120.0) -> dict:
        """Wait for the job's end; its ``end`` event. Fails unless it exited 0."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"job still running after {timeout}s; log: {self.stderr()}")
        assert rc == 0, f"job exited {rc}; log: {self.stderr()}"
        return self.wait_for(lambda e: e["event"] == "end", 10)

    def step_digests(self) -> dict[int, str]:
        with self._cond:
            return {e["step"]: e["digest"] for e in self.events if e["event"] == "step"}

    def wait_text(self, needle: str, timeout: float = 60.0) -> str:
        """The job's stderr once it holds ``needle``; fails on its exit or the timeout."""
        end = time.monotonic() + timeout
        while needle not in (text := self.stderr()):
            if self.proc.poll() is not None:
                pytest.fail(f"job exited ({self.proc.returncode}) first; log: {text}")
            if time.monotonic() > end:
                pytest.fail(f"no {needle!r} within {timeout}s; log: {text}")
            time.sleep(0.05)  # the poll period
        return text

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stderr(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def close(self) -> None:
        self.kill()
        self._log.close()


#: Runs the job script with ``import tensorflow`` failing (the job must not need it).
_NO_TF = """
import runpy, sys
sys.modules["tensorflow"] = None  # as if not installed: import fails, find_spec says None
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def free_port() -> int:
    """A TCP port free on loopback now (for jax.distributed's coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finalized(directory: Path) -> list[int]:
    """The finalized Orbax steps in ``directory`` (adaptd's reading of Orbax's commits)."""
    from adaptd.client.orbax.adapter import finalized_steps

    return sorted(finalized_steps(directory))
