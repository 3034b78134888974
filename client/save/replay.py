"""A rank's data position rebuilt by replay: its part of an older step, then the batches
of the steps since.

A just-in-time save (:mod:`adaptd.client.save.just_in_time`) is taken after a peer
died, when the survivors' iterators have already handed out the failed step's batch
and the dead rank's position is nowhere. What is known for sure is each rank's part of
an older save ``S`` (or, with ``S`` = 0, the fresh input of a job that started from
nothing) and that every rank consumed one batch per step from each of its iterators
since. So the part of step ``N`` is written as a replay note
(:func:`adaptd.checkpoints.rank_parts.replay_name`), and each rank rebuilds its own
position when it restores ``N``: its part of ``S``, then ``N - S`` batches drawn and
dropped (:func:`restore`). That is exact for a deterministic ``tf.data`` pipeline (the
same one the periodic saves resume exactly).

Only iterators can be replayed: a rank's part that holds anything else (a per-rank
``tf.random.Generator``, a counter named in ``per_rank=``) cannot be rebuilt for a
later step, and :func:`why_not` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from adaptd.checkpoints import rank_parts
from adaptd.client.save.rank_state import RankPart

log = logging.getLogger("adaptd.client")

__all__ = ["advance", "restore", "why_not"]


def _iterators(value: Any) -> list[Any] | None:
    if isinstance(value, tf.data.Iterator):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, tf.data.Iterator) for v in value):
        return list(value)  # a tf.distribute iterator, prepared: one per input worker
    return None


def why_not(trackables: Mapping[str, Any]) -> str:
    """ "" when every one of a rank's own ``trackables`` can be replayed (data
    iterators), else which one cannot, and why."""
    for key, value in trackables.items():
        if _iterators(value) is None:
            return (
                f"the rank's own state {key!r} ({type(value).__name__}) is not a data "
                "iterator: its value at the last completed step cannot be rebuilt by replay"
            )
    return ""


def advance(trackables: Mapping[str, Any], batches: int) -> None:
    """Draw and drop ``batches`` elements from each iterator of ``trackables``."""
    for value in trackables.values():
        for it in _iterators(value) or ():
            for _ in range(batches):
                next(it)


def restore(part: RankPart, step: int) -> None:
    """Load this rank's part of ``step``: as written, or, where only a replay note stands
    for it, rebuilt from the part the note names.

    Raises:
        PartMismatch, AssertionError: as :meth:`RankPart.restore` (also for a part
            that is neither written nor noted).
    """
    names = rank_parts.listing(part.directory)
    base = None
    if not rank_parts.written(names, step, part.rank, part.world_size):
        base = rank_parts.replay_base(names, step, part.rank, part.world_size)
    if base is None:
        part.restore(step)
        return
    if base:
        part.restore(base)
    advance(part.trackables, step - base)
    log.info(
        "rank %d's data position at step %d rebuilt: its part of step %d, then %d batches",
        part.rank,
        step,
        base,
        step - base,
    )
