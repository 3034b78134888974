"""Running tests/multiworker/jit_worker.py's job: to its end, or until a rank fails and
the survivors have ended. Shared by tests/multiworker/test_just_in_time.py and
benchmarks/jit_failures.py."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

STEPS, EVERY = 16, 5
#: The digests a resumed run must share with the uninterrupted one.
COMPARED = ("weights", "optimizer", "step", "next_batches")


@dataclass
class Ended:
    """How each rank ended: ``codes`` (None: still running when the others were done,
    e.g. SIGSTOPped: then killed), ``results`` (None where a rank wrote none),
    ``seconds`` the run took."""

    codes: list[int | None]
    results: list[dict[str, Any] | None]
    seconds: float

    def survivors(self) -> list[dict[str, Any]]:
        return [r for r, c in zip(self.results, self.codes, strict=True) if c == 3 and r]


def run(
    workdir: Path, n: int, ckpt: Path, timeout: float = 240, zygote: Any = None, **env: str
) -> Ended:
    """The job on ``n`` workers until every rank that is not the ``KILL_RANK`` or
    ``STOP_RANK`` ended; past ``timeout`` seconds AssertionError (a hang) with the logs.
    With a ``zygote`` (tests/faults/zygote.py) the workers are forked from it, without
    TensorFlow's import in each (tests/multiworker/forked.py)."""
    full = {"CKPT": str(ckpt), "STEPS": str(STEPS), "EVERY": str(EVERY), **env}
    out = {int(env[k]) for k in ("KILL_RANK", "STOP_RANK") if k in env}
    script = HERE / "jit_worker.py"
    from multiworker.forked import cluster_of  # needs tests/ importable: not at import

    cluster = cluster_of(zygote, workdir, n, script, full)
    t0 = time.monotonic()
    with cluster:
        deadline = t0 + timeout
        waited = [p for r, p in enumerate(cluster.procs) if r not in out]
        while any(p.poll() is None for p in waited):
            if time.monotonic() > deadline:
                tails = cluster.tails()
                cluster.kill()
                raise AssertionError(f"the job hung for {timeout:g}s\n{tails}")
            time.sleep(0.05)
        seconds = time.monotonic() - t0
        codes = [p.poll() for p in cluster.procs]
        for r in out:  # a stopped rank would never end: it is killed (its group, if started)
            if zygote is not None:
                cluster.procs[r].kill()
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(cluster.procs[r].pid, signal.SIGKILL)
        results = [cluster.result(r) if cluster.result_path(r).exists() else None for r in range(n)]
        if any(c not in (0, 3, -9, None) for c in codes):
            # a crash's Python stacks (faulthandler) run to ~60 lines: show its head too
            raise AssertionError(f"workers exited with {codes}\n{cluster.tails(150)}")
        return Ended(codes, results, seconds)


__all__ = ["COMPARED", "EVERY", "STEPS", "Ended", "run"]
