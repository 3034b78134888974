"""Per-rank parts of a multi-worker checkpoint: their names, and when a step is whole.

A data-parallel job's state is of two kinds. The *replicated* state (model, optimizer,
the global step) is the same on every rank; the chief writes it once, as the plain
TensorFlow checkpoint ``ckpt-N`` that ``tf.train.Checkpoint(...).restore`` reads. What
differs between ranks (each rank's data iterator with its shuffle buffer, a per-rank
``tf.random.Generator``, whatever the user marks per-rank) each rank writes as its own
*part*, a small TensorFlow checkpoint beside it::

    ckpt-50.index, ckpt-50.data-00000-of-00001        the replicated part (the chief's)
    ckpt-50.rank-00000-of-00002.index, .data-...       rank 0's part, in a 2-rank job
    ckpt-50.rank-00001-of-00002.index, .data-...       rank 1's part
    ckpt-50.rank-00001-of-00002.pending                rank 1's write has not ended
    ckpt-57.rank-00001-of-00002.replay-from-50         rank 1's part of 57 (just in time):
                                                       its part of 50, then 7 steps' batches

A part's name holds its rank and the job's world size, so the names of a step say
alone whether it is whole and for how many ranks. A rank creates its ``.pending``
marker when its save starts, before any of its files (and, on the chief, before the
replicated part) can land, and removes it once its part is written: so a step whose
replicated part landed while no part did is still known as a step of several ranks.
The same names are used in a checkpoint directory and at a durable destination
(without the markers: only whole steps are replicated).

**A step is complete for the job only when its replicated part and every rank's part
are there**, each an index with all the data shards it names (TensorFlow writes the
index last). A step with no part-named file at all is a one-rank step (a single
process): complete with its replicated part. Every reader decides with
:func:`status` over a listing of file names (the hook's restore, ``adaptd verify``,
retention, the replicator, manifests and ``adaptd restore``), so all apply one rule.

A *replay note* (empty, :func:`replay_name`) stands for a rank's part of a step saved
just in time after a peer failed (:mod:`adaptd.client.save.just_in_time`): the rank's
position is its part of an older step ``S`` (``S`` = 0: a fresh input, the job's
start) advanced by the batches of the steps since, so the rank rebuilds it at restore
by replaying them (:mod:`adaptd.client.save.replay`). A noted part is whole while the
part it names is whole (or names step 0).

A rank writes its part alone, without collectives; :func:`stale_parts` says which of
its own parts it may delete. Nothing here imports TensorFlow (the daemon uses it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from adaptd.checkpoints.files import CHECKPOINT_FILE

__all__ = [
    "PENDING",
    "RANK_FILE",
    "StepStatus",
    "files_of",
    "listing",
    "part_name",
    "part_of",
    "pending_name",
    "replay_base",
    "replay_name",
    "stale_parts",
    "status",
    "step_bytes",
    "step_of",
    "steps",
    "world_changed",
    "written",
]

#: A file of a rank's part: group 1 the step, 2 the rank, 3 the world size, 4 what it
#: is (``index``, ``data-SSSSS-of-NNNNN``, ``pending`` or ``replay-from-S``), 5/6 shard
#: and shard count, 7 the step a replay note starts from.
RANK_FILE = re.compile(
    r"^ckpt-(\d+)\.rank-(\d{5})-of-(\d{5})\."
    r"(index|data-(\d{5})-of-(\d{5})|pending|replay-from-(\d+))$"
)
#: The suffix of the marker a rank keeps while its part is being written.
PENDING = "pending"
#: The suffix of a replay note, before its base step.
REPLAY = "replay-from-"


def part_name(step: int, rank: int, world: int) -> str:
    """The checkpoint prefix (a name in the directory) of ``rank``'s part of ``step``."""
    return f"ckpt-{step}.rank-{rank:05d}-of-{world:05d}"


def pending_name(step: int, rank: int, world: int) -> str:
    return f"{part_name(step, rank, world)}.{PENDING}"


def replay_name(step: int, rank: int, world: int, base: int) -> str:
    """The replay note saying that ``rank``'s part of ``step`` is its part of ``base``
    advanced by the batches of steps ``base+1 .. step`` (``base`` 0: from a fresh input)."""
    return f"{part_name(step, rank, world)}.{REPLAY}{base}"


def replay_base(names: Collection[str], step: int, rank: int, world: int) -> int | None:
    """The base step of ``rank``'s replay note for ``step`` whose base is usable (step 0,
    or a whole part of that rank), the newest if several; None when there is none."""
    lead = f"{part_name(step, rank, world)}.{REPLAY}"
    bases = sorted(
        (int(n[len(lead) :]) for n in names if n.startswith(lead) and n[len(lead) :].isdigit()),
        reverse=True,
    )
    for base in bases:
        if base < step and (base == 0 or _bundle_complete(names, part_name(base, rank, world))):
            return base
    return None


def part_of(name: str) -> tuple[int, int, int] | None:
    """``(step, rank, world)`` of a part's file, or None for any other name."""
    m = RANK_FILE.match(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def step_of(name: str) -> int | None:
    """The step a checkpoint file belongs to (the replicated part's or a rank's), or None."""
    m = CHECKPOINT_FILE.match(name) or RANK_FILE.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class StepStatus:
    """What the names say about one step: ``world`` (1: no rank parts, a one-rank
    step), whether it is ``complete`` for the job, and if not ``why`` (one line) and
    the ``missing`` ranks' parts."""

    step: int
    world: int
    complete: bool
    why: str = ""
    missing: tuple[int, ...] = field(default_factory=tuple)
    replicated: bool = False  # its replicated part is whole
    parts: tuple[int, ...] = field(default_factory=tuple)  # ranks whose part is whole


def _bundle_complete(names: Collection[str], prefix: str) -> bool:
    """``prefix.index`` and every ``prefix.data-i-of-n`` are among ``names``."""
    if f"{prefix}.index" not in names:
        return False
    counts = set()
    lead = f"{prefix}.data-"
    for name in names:
        if name.startswith(lead):
            tail = name[len(lead) :]
            if len(tail) == 14 and tail[5:9] == "-of-" and tail[:5].isdigit():
                counts.add(tail[9:])
    if len(counts) != 1:
        return False
    n = int(counts.pop())
    return n > 0 and all(f"{lead}{i:05d}-of-{n:05d}" in names for i in range(n))


def status(names: Collection[str], step: int) -> StepStatus:
    """Whether ``step`` is complete for the job, from the file names of its directory
    (or a destination's listing, or a manifest's file list)."""
    names = names if isinstance(names, (set, frozenset)) else set(names)
    replicated = _bundle_complete(names, f"ckpt-{step}")
    worlds = sorted({p[2] for p in map(part_of, names) if p is not None and p[0] == step})
    if len(worlds) > 1:
        sizes = ", ".join(map(str, worlds))
        why = f"ckpt-{step} has rank parts of several world sizes ({sizes}); it is not usable"
        return StepStatus(step, worlds[-1], False, why, (), replicated)
    world = worlds[0] if worlds else 1
    parts = tuple(r for r in range(world) if world > 1 and _part_complete(names, step, r, world))
    missing = tuple(r for r in range(world) if world > 1 and r not in parts)
    whys = []
    if not replicated:
        whys.append(f"its replicated part ckpt-{step} is missing or incomplete")
    if missing:
        listed = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        whys.append(
            f"rank(s) {listed} of {world} have no complete part "
            f"(e.g. {part_name(step, missing[0], world)})"
        )
    why = f"step {step} is not complete for the job: " + "; ".join(whys) if whys else ""
    return StepStatus(step, world, not whys, why, missing, replicated, parts)


def written(names: Collection[str], step: int, rank: int, world: int) -> bool:
    """``rank``'s part of ``step`` is written whole (not merely noted for replay)."""
    return _bundle_complete(names, part_name(step, rank, world))


def _part_complete(names: Collection[str], step: int, rank: int, world: int) -> bool:
    """The part is written, or a replay note stands for it (:func:`replay_base`)."""
    if _bundle_complete(names, part_name(step, rank, world)):
        return True
    return replay_base(names, step, rank, world) is not None


def steps(names: Iterable[str]) -> list[int]:
    """Every step some checkpoint file (replicated or a part) is of, newest first."""
    return sorted({s for n in names if (s := step_of(n)) is not None}, reverse=True)


def files_of(names: Collection[str], step: int) -> list[str]:
    """The checkpoint files of ``step`` among ``names``, data shards before indexes (so a
    copy made in this order is never read as complete before it is): the replicated
    part's and every part's. Markers are left out."""
    mine = [n for n in names if step_of(n) == step and not n.endswith(f".{PENDING}")]
    return sorted(mine, key=lambda n: (n.endswith(".index"), n))


def listing(directory: str | os.PathLike[str]) -> set[str]:
    """The names in ``directory`` (empty when it does not exist)."""
    try:
        return set(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return set()


def step_bytes(directory: str | os.PathLike[str], step: int) -> int:
    """Bytes of ``step``'s checkpoint files in ``directory`` (replicated and parts)."""
    root = Path(directory)
    total = 0
    for name in files_of(listing(root), step):
        try:
            total += (root / name).stat().st_size
        except OSError:
            continue
    return total


def stale_parts(
    names: Collection[str], ranks: Collection[int], world: int, keep: int | None
) -> list[tuple[int, int]]:
    """``(step, rank)`` of the parts of ``ranks`` (of ``world`` ranks) that may be
    deleted, oldest first.

    A part goes with its replicated part: once ``ckpt-M`` is gone (the chief's
    ``CheckpointManager`` dropped it, or its save failed) while a newer replicated
    part exists. The newer one proves ``ckpt-M`` is not still being written: the chief
    has one save in flight at a time, so it finished (or abandoned) ``M`` before
    writing anything newer. Where no replicated part ever appears (a rank's own
    directory without shared storage), each rank keeps its newest ``keep + 1`` parts
    (``keep``: the job's ``max_to_keep``; None keeps all).
    """
    held: dict[int, set[int]] = {}
    for p in map(part_of, names):
        if p is not None and p[2] == world and p[1] in ranks:
            held.setdefault(p[1], set()).add(p[0])
    mains = [s for s in steps(names) if f"ckpt-{s}.index" in names]
    based = _replay_bases(names, mains, world)  # parts a kept step's replay note needs
    stale: set[tuple[int, int]] = set()
    for rank, mine in held.items():
        ordered = sorted(mine)
        if mains:
            stale |= {
                (s, rank)
                for s in ordered
                if f"ckpt-{s}.index" not in names and s < mains[0] and (s, rank) not in based
            }
        elif keep is not None:
            stale |= {(s, rank) for s in ordered[: max(0, len(ordered) - (keep + 1))]}
    return sorted(stale)


def _replay_bases(
    names: Collection[str], kept: Collection[int], world: int
) -> set[tuple[int, int]]:
    """``(base, rank)`` of the parts that replay notes of the ``kept`` steps start from."""
    kept = set(kept)
    out = set()
    for name in names:
        m = RANK_FILE.match(name)
        if m and m.group(7) is not None and int(m.group(3)) == world and int(m.group(1)) in kept:
            out.add((int(m.group(7)), int(m.group(2))))
    return out


def world_changed(step: int, where: str, was: int, now: int) -> str:
    """The refusal of a resume by a job of ``now`` ranks from ``step``, written by a job
    of ``was`` ranks (one message for every place that refuses it)."""
    written = f"{was} worker(s)" if was > 1 else "a single process (no per-rank parts)"
    return (
        f"ckpt-{step} in {where} was written by {written}; this job has {now} worker(s). "
        "Each worker's own state (its data position, its random generators) is saved for "
        "its rank and cannot be handed to a different number of workers exactly, so the "
        f"job does not resume. Restart it with {was} worker(s), or move those checkpoints "
        f"aside to start afresh with {now}; plain TensorFlow still reads the model and "
        f"optimizer from ckpt-{step} (docs/multiworker.md, 'Changing the number of workers')"
    )
