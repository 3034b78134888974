"""Which of the hook's trackables are each rank's own, in a job of several ranks.

Under ``MultiWorkerMirroredStrategy`` the model and the optimizer are mirrored: the
same on every rank, so they are written once, in the replicated part. What differs
between ranks goes in each rank's own part (:mod:`adaptd.checkpoints.rank_parts`):

* a ``tf.data`` iterator: each rank reads its own shard, with its own shuffle buffer;
* a ``tf.distribute`` iterator (``experimental_distribute_dataset``,
  ``distribute_datasets_from_function``): the plain iterators it reads through, one
  per input worker of the process (:mod:`adaptd.client.save.distributed_input`);
* a ``tf.random.Generator`` whose state is not a distributed variable (made outside
  the strategy's scope: each rank its own stream);
* whatever the user names in ``per_rank=`` (a counter of the rank's own, a module
  holding per-rank variables).

A generator made inside the strategy's scope is mirrored, and so replicated. The
rule is the same in a job of one rank, where there is no part to put anything in:
:func:`prepared` is applied to every job, :func:`split` only to jobs of several.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import tensorflow as tf

from adaptd.client.save import distributed_input

__all__ = ["check_names", "is_per_rank", "prepared", "split"]


def prepared(trackables: Mapping[str, Any]) -> dict[str, Any]:
    """``trackables`` with each ``tf.distribute`` iterator replaced by the list of the
    plain iterators it reads through, which ``tf.train.Checkpoint`` can save.

    Raises:
        UnsupportedInput: a distributed input the hook cannot resume exactly (the
            message names what is supported).
    """
    out = {}
    for key, value in trackables.items():
        if distributed_input.is_distributed(value):
            value = distributed_input.per_worker_iterators(key, value)
        out[key] = value
    return out


def is_per_rank(value: Any) -> bool:
    """Whether ``value`` (a prepared trackable) differs between ranks by its kind."""
    if isinstance(value, tf.data.Iterator):
        return True
    if isinstance(value, list) and value and all(isinstance(v, tf.data.Iterator) for v in value):
        return True  # a tf.distribute iterator, prepared
    if isinstance(value, tf.random.Generator):
        return not isinstance(value.state, tf.distribute.DistributedValues)
    return False


def check_names(per_rank: Any, trackables: Mapping[str, Any]) -> tuple[str, ...]:
    """``per_rank`` as a tuple of the trackable keys it names.

    Raises:
        ValueError: it is not a collection of strings, or names a key that is not
            among the trackables (the message lists them).
    """
    if isinstance(per_rank, str) or not isinstance(per_rank, Collection):
        raise ValueError(
            f"per_rank must be a collection of the trackables' keywords, e.g. "
            f"per_rank=('counter',), got {per_rank!r}"
        )
    names = tuple(per_rank)
    for name in names:
        if not isinstance(name, str) or name not in trackables:
            raise ValueError(
                f"per_rank names {name!r}, which is not one of the state's keywords "
                f"({', '.join(sorted(trackables)) or 'none'})"
            )
    return names


def split(
    trackables: Mapping[str, Any], per_rank: Collection[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(replicated, own)``: the prepared trackables written once for the job, and
    those each rank writes for itself (by kind, or named in ``per_rank``)."""
    own = {k: v for k, v in trackables.items() if k in per_rank or is_per_rank(v)}
    return {k: v for k, v in trackables.items() if k not in own}, own
