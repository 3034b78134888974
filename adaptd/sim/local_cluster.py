"""A multi-worker TensorFlow job on localhost: its workers as child processes.

For the multi-worker tests and benchmarks (and for trying a job out on one machine).
:class:`Cluster` starts N worker processes at once (TensorFlow's start-up, several
seconds each, overlaps), each with a ``TF_CONFIG`` naming N free localhost ports,
``CUDA_VISIBLE_DEVICES=""``, its own process group and its output in files. Every
wait has a deadline: a worker that hangs makes :meth:`Cluster.wait` kill every
worker's process group and fail with the tails of their logs. A finalizer kills the
groups too, so a failing test never leaves workers behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Cluster", "free_ports", "tf_config"]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on localhost (bound and released at once)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: Sequence[int], index: int) -> str:
    return json.dumps(
        {
            "cluster": {"worker": [f"localhost:{port}" for port in ports]},
            "task": {"type": "worker", "index": index},
        }
    )


def _kill_groups(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


class Cluster:
    """N workers running ``script`` with ``args`` in ``cwd``; rank ``r``'s output goes
    to ``<workdir>/rank<r>.log``, and it is told (``$RESULT``) to write its results to
    ``<workdir>/rank<r>.json``. ``env`` is added to each worker's environment."""

    def __init__(
        self,
        workdir: Path,
        n: int,
        script: Path,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.cwd = Path.cwd() if cwd is None else Path(cwd)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.n = n
        self.script = Path(script)
        self.args = list(args)
        self.env = dict(env or {})
        self.procs: list[subprocess.Popen[bytes]] = []
        self._pids: list[int] = []
        self._finalizer = weakref.finalize(self, _kill_groups, self._pids)

    def start(self) -> Cluster:
        ports = free_ports(self.n)
        for rank in range(self.n):
            env = dict(os.environ)
            env.update(
                TF_CONFIG=tf_config(ports, rank),
                CUDA_VISIBLE_DEVICES="",
                TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONUNBUFFERED="1",
                RESULT=str(self.result_path(rank)),
            )
            env.pop("RANK", None)
            env.pop("WORLD_SIZE", None)
            env.update(self.env)
            log = open(self.log_path(rank), "wb")  # noqa: SIM115 - the child owns it
            try:
                proc = subprocess.Popen(
                    [sys.executable, str(self.script), *self.args],
                    cwd=str(self.cwd),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            finally:
                log.close()
            self.procs.append(proc)
            self._pids.append(proc.pid)
        return self

    def log_path(self, rank: int) -> Path:
        return self.workdir / f"rank{rank}.log"

    def result_path(self, rank: int) -> Path:
        return self.workdir / f"rank{rank}.json"

    def wait(self, timeout: float) -> list[int]:
        """Wait for every worker to exit; their return codes. Past ``timeout`` seconds
        every worker is killed and AssertionError says which were still running."""
        deadline = time.monotonic() + timeout
        while any(proc.poll() is None for proc in self.procs):
            if time.monotonic() > deadline:
                running = [r for r, proc in enumerate(self.procs) if proc.poll() is None]
                self.kill()
                raise AssertionError(
                    f"worker(s) {running} still running after {timeout:g}s (killed)\n"
                    + self.tails()
                )
            time.sleep(0.05)
        return [proc.returncode for proc in self.procs]

    def wait_ok(self, timeout: float) -> list[dict[str, Any]]:
        """Wait; every worker must exit 0. Their results."""
        codes = self.wait(timeout)
        if any(codes):
            raise AssertionError(f"workers exited with {codes}\n{self.tails()}")
        return [self.result(r) for r in range(self.n)]

    def result(self, rank: int) -> dict[str, Any]:
        path = self.result_path(rank)
        if not path.exists():
            raise AssertionError(f"rank {rank} wrote no results\n{self.tails()}")
        return json.loads(path.read_text())

    def signal(self, rank: int, sig: int) -> None:
        self.procs[rank].send_signal(sig)

    def kill(self) -> None:
        _kill_groups(self._pids)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def tails(self, lines: int = 40) -> str:
        out = []
        for rank in range(self.n):
            path = self.log_path(rank)
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            keep = [t for t in text if "cuInit" not in t and "cuda" not in t.lower()]
            out.append(f"--- rank {rank} ---\n" + "\n".join(keep[-lines:]))
        return "\n".join(out)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self._finalizer()
