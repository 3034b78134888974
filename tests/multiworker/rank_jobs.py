"""Running tests/multiworker/rank_worker.py's job: to its end, or until one rank kills
itself. Shared by tests/multiworker/test_rank_state.py and scripts/exact_resume.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

STYLES = ("plain", "distribute", "function")
STEPS, EVERY, KEEP = 50, 10, 3
#: The digests a resumed run must share with the uninterrupted one.
COMPARED = ("weights", "optimizer", "step", "next_batches")


def run(
    workdir: Path, n: int, ckpt: Path, zygote: Any = None, **env: str
) -> list[dict[str, Any]] | None:
    """The job on ``n`` workers to its end (its results), or, with ``KILL_RANK``,
    until that rank killed itself (then every worker is killed: None). With a
    ``zygote`` (tests/faults/zygote.py) the workers are forked from it, without
    TensorFlow's import in each (tests/multiworker/forked.py)."""
    full = {"CKPT": str(ckpt), "STEPS": str(STEPS), "EVERY": str(EVERY), "KEEP": str(KEEP)}
    full.update(env)
    script = HERE / "rank_worker.py"
    from multiworker.forked import cluster_of  # needs tests/ importable: not at import

    cluster = cluster_of(zygote, workdir, n, script, full)
    with cluster:
        if "KILL_RANK" not in env:
            return cluster.wait_ok(timeout=240)
        victim = cluster.procs[int(env["KILL_RANK"])]
        deadline = time.monotonic() + 240
        while victim.poll() is None:
            assert time.monotonic() < deadline, cluster.tails()
            time.sleep(0.05)
        assert victim.returncode == -9, cluster.tails()
        cluster.kill()  # the others wait in a collective for the dead rank
        return None


__all__ = ["COMPARED", "EVERY", "KEEP", "STEPS", "STYLES", "run"]
