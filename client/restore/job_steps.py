"""What one rank of a multi-worker job can restore: the steps of its directory and of
its durable destination that are complete for the job, and why the others are not.

A step is usable only when it is complete for the job (its replicated part and every
rank's part, :func:`adaptd.checkpoints.rank_parts.status`) and was written by a job of this
number of ranks; locally, the replicated part and this rank's own part must also
pass ``adaptd verify``'s quick check (index checksums, shard sizes, object graph:
:func:`adaptd.client.restore.verify.verify` with ``read_tensors=False``), so a damaged
newest step is skipped for an older one on every rank, not restored half. Each rank
checks only its own part: every rank's offer together covers every part.

What is not usable is kept with its reason (:class:`~adaptd.client.restore.intact.Damaged`)
for the log and the daemon, and the steps of another world size for the refusal
(:func:`adaptd.checkpoints.rank_parts.world_changed`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from adaptd.checkpoints import rank_parts
from adaptd.client.restore.intact import Damaged
from adaptd.client.restore.remote import Source
from adaptd.protocol import job as p

log = logging.getLogger("adaptd.client")

__all__ = ["Offerable", "Pullable", "local_offer", "pullable", "quick_check", "tier_offer"]

#: ``check(prefix)``: "" when the checkpoint at ``prefix`` looks whole, else why not.
Check = Callable[[Path], str]


def quick_check(prefix: Path) -> str:
    """``adaptd verify``'s quick check of one checkpoint (this part only)."""
    from adaptd.client.restore import verify

    report = verify.verify(prefix, read_tensors=False, parts=False)
    return "; ".join(f"{x.kind}: {x.message}" for x in report.problems)


@dataclass(frozen=True)
class Offerable:
    """A rank's directory as the restore agreement sees it, newest first: ``local`` the
    usable steps; ``replicated`` and ``own`` those whose replicated part, and whose
    part of this rank, are whole and intact here (whatever the other parts);
    ``other_world`` complete steps of a job of ``other_world_size`` ranks; ``skipped``
    every other step, with why."""

    local: list[int] = field(default_factory=list)
    replicated: list[int] = field(default_factory=list)
    own: list[int] = field(default_factory=list)
    other_world: list[int] = field(default_factory=list)
    other_world_size: int = 0
    skipped: list[Damaged] = field(default_factory=list)


def local_offer(
    directory: str | os.PathLike[str], rank: int, world: int, check: Check = quick_check
) -> Offerable:
    """What this rank's ``directory`` offers (see :class:`Offerable`)."""
    root = Path(directory)
    names = rank_parts.listing(root)
    local: list[int] = []
    replicated: list[int] = []
    own: list[int] = []
    other: list[tuple[int, int]] = []  # (step, its world size)
    skipped: list[Damaged] = []
    for step in rank_parts.steps(names)[: p.MAX_OFFERED]:
        st = rank_parts.status(names, step)
        whys = [] if st.complete else [st.why]
        has_replicated = st.replicated and not _damaged(check, root / f"ckpt-{step}", whys)
        has_own = st.world == world and rank in st.parts
        mine = root / rank_parts.part_name(step, rank, world)
        if has_own and not (root / f"{mine.name}.index").exists():  # a replay note (just in time)
            base = rank_parts.replay_base(names, step, rank, world)
            mine = root / rank_parts.part_name(base, rank, world) if base else None
        has_own = has_own and (mine is None or not _damaged(check, mine, whys))
        replicated += [step] if has_replicated else []
        own += [step] if has_own else []
        if st.complete and st.world != world:
            other.append((step, st.world))
        elif st.complete and has_replicated and has_own:
            local.append(step)
        elif not local:  # newer than every usable step: the resume skips it, say why
            skipped.append(Damaged(f"ckpt-{step}", "; ".join(whys)))
    return Offerable(
        local, replicated, own, [s for s, _ in other], other[0][1] if other else 0, skipped
    )


def tier_offer(
    directory: str | os.PathLike[str], rank: int, world: int, check: Check = quick_check
) -> list[int]:
    """The steps this rank's local tier (two tiers, ``directory``) can restore, newest
    first: its copy of the replicated state and its own part of the step, both whole
    and intact (a rank's local tier holds no other rank's part: the job's other ranks
    offer theirs). A damaged or incomplete copy is logged and not offered."""
    root = Path(directory)
    names = rank_parts.listing(root)
    found: list[int] = []
    for step in rank_parts.steps(names)[: p.MAX_OFFERED]:
        whys: list[str] = []
        mine = rank_parts.part_name(step, rank, world)
        if rank_parts.pending_name(step, rank, world) in names:
            whys.append(f"{mine} was being written")
        elif f"{mine}.index" not in names:
            whys.append(f"{mine} is missing")
        else:
            _damaged(check, root / mine, whys)
        _damaged(check, root / f"ckpt-{step}", whys)
        if whys:
            log.warning("not offering the local tier's step %d: %s", step, "; ".join(whys))
        else:
            found.append(step)
    return found


def _damaged(check: Check, prefix: Path, whys: list[str]) -> bool:
    why = check(prefix)
    if why:
        whys.append(f"{prefix.name} is damaged ({why})")
    return bool(why)


@dataclass(frozen=True)
class Pullable:
    """A destination's steps that are complete for a job of ``world`` ranks, and
    those written by a job of another size."""

    steps: list[int] = field(default_factory=list)
    other_world: list[int] = field(default_factory=list)
    other_world_size: int = 0


def pullable(source: Source | None, world: int) -> Pullable:
    """The steps at ``source`` (each manifest's files say whether the step is complete,
    and for how many ranks), newest first; none without a destination or when it cannot
    be read (a warning: the other ranks' offers may still make a choice)."""
    if source is None:
        return Pullable()
    from adaptd.tiers.replica import Replica, TierError, is_storage_error

    url = source.url
    found: list[int] = []
    other: list[tuple[int, int]] = []
    try:
        replica = Replica(url, storage_options=dict(source.storage_options))
        for step in sorted(replica.steps(), reverse=True)[: p.MAX_OFFERED]:
            try:
                names = {f.name for f in replica.manifest(step).files}
            except TierError as exc:  # an incomplete or damaged manifest
                log.warning("step %d at %s is skipped: %s", step, url, exc)
                continue
            size = rank_parts.status(names, step).world
            if size == world:
                found.append(step)
            else:
                other.append((step, size))
    except TierError as exc:
        log.warning("cannot list the checkpoints at %s: %s", url, exc)
    except Exception as exc:
        if not is_storage_error(exc):
            raise
        log.warning("cannot list the checkpoints at %s: %s: %s", url, type(exc).__name__, exc)
    return Pullable(found, [s for s, _ in other], other[0][1] if other else 0)
