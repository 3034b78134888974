"""The restore-agreement scenarios one worker of coord_worker.py runs (``restore``).

Each scenario gives every rank a checkpoint directory with some steps (files named
and sized like TensorFlow's, with each rank's part beside the replicated part, as a
job of 3 ranks writes them; the agreement looks at which are complete for the job,
and a pull checks them against the destination's manifest) and runs
:class:`adaptd.client.restore.job_restore.JobRestore` through offer, choice, pull and confirm.
``$RESTORE_ROOT`` holds the directories; ``$RESTORE_DEST`` is a durable destination
the test filled with steps 20 and 30.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from adaptd.checkpoints.rank_parts import part_name, pending_name
from adaptd.client.agreement.coordination import Coordination
from adaptd.client.agreement.kv import Keys, next_session
from adaptd.client.agreement.ranks import Identity
from adaptd.client.restore.job_restore import JobRestore, JobRestoreOptions, RestoreAgreementError
from adaptd.client.restore.job_steps import local_offer
from adaptd.client.restore.remote import Source

WORLD = 3
#: scenario -> steps each rank holds whole (rank -> steps; ranks not named hold none)
HOLDINGS: dict[str, dict[int, tuple[int, ...]]] = {
    "common": {0: (10, 20, 30), 1: (10, 20), 2: (10, 20, 30)},
    "pull": {0: (20, 30)},
    "missing": {0: (20, 30)},
    "fails": {0: (10,), 1: (10,), 2: (10,)},
    "fresh": {},
    "silent": {0: (10,), 1: (10,), 2: (10,)},
    # step 30 lacks rank 2's part (every directory alike, as on shared storage)
    "partless": {0: (10, 20), 1: (10, 20), 2: (10, 20)},
    # killed at the first save: the replicated part and rank 0's part landed, no other
    "first": {},
    # step 20 written by a job of 2 ranks (every directory alike)
    "world": {0: (10,), 1: (10,), 2: (10,)},
    # no shared storage: the replicated part on rank 0's host, each part on its own
    "spread": {},
}


def write_checkpoint(
    directory: Path,
    step: int,
    size: int = 1000,
    *,
    world: int = WORLD,
    ranks: Iterable[int] | None = None,
    replicated: bool = True,
) -> None:
    """Files shaped like TensorFlow's ``ckpt-<step>`` (index and one data shard) and, for a
    job of several ranks, each of ``ranks``' parts (default: all of ``world``)."""
    directory.mkdir(parents=True, exist_ok=True)
    prefixes = [f"ckpt-{step}"] if replicated else []
    if world > 1:
        prefixes += [part_name(step, r, world) for r in (range(world) if ranks is None else ranks)]
    for prefix in prefixes:
        (directory / f"{prefix}.data-00000-of-00001").write_bytes(bytes([step % 256]) * size)
        (directory / f"{prefix}.index").write_bytes(b"index-%d" % step)


def _special(name: str, directory: Path, rank: int) -> None:
    """The scenarios that are not "whole steps per rank"."""
    if name == "partless":
        write_checkpoint(directory, 30, ranks=(0, 1))
    elif name == "first":
        write_checkpoint(directory, 10, ranks=(0,))
        (directory / pending_name(10, 1, WORLD)).touch()
        (directory / pending_name(10, 2, WORLD)).touch()
    elif name == "world":
        write_checkpoint(directory, 20, world=2)
    elif name == "spread":
        write_checkpoint(directory, 10, ranks=(rank,), replicated=rank == 0)


def names_only(prefix: Path) -> str:
    """The quick check of a local checkpoint, for files that only look like TensorFlow's:
    they are whole when their names say so (the real check is tested on real ones)."""
    return ""


def run(store: Coordination, rank: int, world: int) -> dict[str, Any]:
    assert world == WORLD
    root = Path(os.environ["RESTORE_ROOT"])
    dest = os.environ["RESTORE_DEST"]
    out: dict[str, Any] = {}
    for name, holdings in HOLDINGS.items():
        directory = root / name / f"rank{rank}"
        for step in holdings.get(rank, ()):
            write_checkpoint(directory, step)
        _special(name, directory, rank)
        job = f"restore-{name}"
        restore = JobRestore(
            store,
            Keys.of(job, next_session(job)),
            Identity(job, rank, world, host=f"host{rank}"),
            directory,
            Source(dest) if name == "pull" else None,
            options=JobRestoreOptions(
                offer_timeout_s=2.0 if name == "silent" else 60.0, restore_timeout_s=60.0
            ),
            check=names_only,
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
                result["not_usable"] = [[d.name, d.why] for d in restore.offerable.skipped]
                result["pulled_s"] = restore.fetch(choice)
                error = "boom: the state does not match" if name == "fails" and rank == 1 else ""
                restore.confirm(choice.step or 0, error)
                result["confirmed"] = True
        except RestoreAgreementError as exc:
            result["error"] = str(exc)
        result["local_after"] = local_offer(directory, rank, world, names_only).local
        out[name] = result
        store.barrier(f"restore-{name}-done", 60)
    return out
