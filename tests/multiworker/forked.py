"""A multi-worker job whose workers are forked from a zygote (tests/faults/zygote.py):
the same workers as :class:`adaptd.sim.local_cluster.Cluster` starts (a ``TF_CONFIG``
on free localhost ports each, no GPU, ``$RESULT``), without TensorFlow's import in each
(about 3.5 s of CPU per worker); each ends as a process does (its ``atexit`` handlers,
the hook's close among them, run). For tests that start many short jobs; a forked job's
results are bit-identical to a started one's (tests/multiworker/test_crash_matrix.py's
uninterrupted run has the digests of scripts/exact_resume.py's).

Every wait has a deadline; a worker still running then is killed and the wait fails
with the tails of every worker's output. Leaving the ``with`` block kills what runs.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from faults.zygote import Child, Zygote

from adaptd.sim.local_cluster import free_ports, tf_config

__all__ = ["ForkedCluster"]


class ForkedCluster:
    """``n`` workers of ``script`` forked from ``zygote``; rank ``r`` writes its results
    to ``<workdir>/rank<r>.json``. ``env`` is added to each worker's environment."""

    def __init__(
        self,
        zygote: Zygote,
        workdir: Path,
        n: int,
        script: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.zygote = zygote
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.n = n
        self.script = Path(script)
        self.env = dict(env or {})
        self.procs: list[Child] = []

    def start(self) -> ForkedCluster:
        ports = free_ports(self.n)
        for rank in range(self.n):
            env = {
                "TF_CONFIG": tf_config(ports, rank),
                "CUDA_VISIBLE_DEVICES": "",
                "RESULT": str(self.result_path(rank)),
                **self.env,
            }
            unset = ("ADAPTD_SOCKET", "RANK", "WORLD_SIZE")
            child = self.zygote.spawn(
                [], script=self.script, env=env, unset=unset, normal_exit=True
            )
            self.procs.append(child)
        return self

    def result_path(self, rank: int) -> Path:
        return self.workdir / f"rank{rank}.json"

    def wait(self, timeout: float) -> list[int]:
        """Wait for every worker to exit; their exit codes (negative: the signal). Past
        ``timeout`` every worker is killed and AssertionError names those still running."""
        deadline = time.monotonic() + timeout
        while any(proc.poll() is None for proc in self.procs):
            if time.monotonic() > deadline:
                running = [r for r, proc in enumerate(self.procs) if proc.poll() is None]
                self.kill()
                raise AssertionError(
                    f"worker(s) {running} still running after {timeout:g}s (killed)\n"
                    + self.tails()
                )
            time.sleep(0.02)
        return [proc.wait() for proc in self.procs]

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

    def kill(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(TimeoutError):
                proc.kill()

    def tails(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- rank {rank} ---\n" + "\n".join(proc.log.lines[-lines:])
            for rank, proc in enumerate(self.procs)
        )

    def __enter__(self) -> ForkedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
