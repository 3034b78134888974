"""The restore-agreement scenarios one worker of coord_worker.py runs (``restore``).

Each scenario gives every rank a checkpoint directory with some steps (files named
and sized like TensorFlow's; the agreement only looks at which are complete, and a
pull checks them against the destination's manifest) and runs
:class:`adaptd.client.job_restore.JobRestore` through offer, choice, pull and confirm.
``$RESTORE_ROOT`` holds the directories; ``$RESTORE_DEST`` is a durable destination
the test filled with steps 20 and 30.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from adaptd.client.coordination import Coordination
from adaptd.client.job_restore import JobRestore, RestoreAgreementError, local_steps
from adaptd.client.kv import Keys, next_session

#: scenario -> steps each rank holds (rank -> steps; ranks not named hold none)
HOLDINGS: dict[str, dict[int, tuple[int, ...]]] = {
    "common": {0: (10, 20, 30), 1: (10, 20), 2: (10, 20, 30)},
    "pull": {0: (20, 30)},
    "missing": {0: (20, 30)},
    "fails": {0: (10,), 1: (10,), 2: (10,)},
    "fresh": {},
    "silent": {0: (10,), 1: (10,), 2: (10,)},
}


def write_checkpoint(directory: Path, step: int, size: int = 1000) -> None:
    """Files shaped like TensorFlow's ``ckpt-<step>`` (index and one data shard)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"ckpt-{step}.data-00000-of-00001").write_bytes(bytes([step % 256]) * size)
    (directory / f"ckpt-{step}.index").write_bytes(b"index-%d" % step)


def run(store: Coordination, rank: int, world: int) -> dict[str, Any]:
    root = Path(os.environ["RESTORE_ROOT"])
    dest = os.environ["RESTORE_DEST"]
    out: dict[str, Any] = {}
    for name, holdings in HOLDINGS.items():
        directory = root / name / f"rank{rank}"
        for step in holdings.get(rank, ()):
            write_checkpoint(directory, step)
        job = f"restore-{name}"
        restore = JobRestore(
            store,
            Keys.of(job, next_session(job)),
            job=job,
            rank=rank,
            world_size=world,
            directory=directory,
            restore_from=dest if name == "pull" else None,
            host=f"host{rank}",
            offer_timeout_s=2.0 if name == "silent" else 60.0,
            restore_timeout_s=60.0,
        )
        result: dict[str, Any] = {}
        try:
            if name == "silent" and rank == world - 1:
                result["skipped"] = True  # this rank never offers
            else:
                choice = restore.agree()
                result["step"] = choice.step
                result["source"] = {str(r): s for r, s in choice.source.items()}
                result["newer"] = {str(r): list(s) for r, s in choice.newer.items()}
                result["pulled_s"] = restore.fetch(choice)
                error = "boom: the state does not match" if name == "fails" and rank == 1 else ""
                restore.confirm(choice.step or 0, error)
                result["confirmed"] = True
        except RestoreAgreementError as exc:
            result["error"] = str(exc)
        result["local_after"] = local_steps(directory)
        out[name] = result
        store.barrier(f"restore-{name}-done", 60)
    return out
