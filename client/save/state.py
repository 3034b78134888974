"""What a checkpoint holds: the user's trackables, the global step and the Keras seeds.

:class:`CheckpointState` builds the ``tf.train.Checkpoint`` the hook saves (the user's
trackables plus :data:`STEP_KEY` and, when Keras seed generators are in use,
:data:`SEEDS_KEY`) and loads a checkpoint back into it. Nothing here talks to the
daemon or decides when to save.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from adaptd.client.save import async_fixes

log = logging.getLogger("adaptd.client")

#: Checkpoint keys the hook adds next to the user's trackables.
STEP_KEY = "adaptd_global_step"
SEEDS_KEY = "adaptd_keras_seeds"
#: Keys of a rank's own part (:mod:`adaptd.client.save.rank_state`): whose part it is.
RANK_KEY = "adaptd_rank"
WORLD_KEY = "adaptd_world_size"
RESERVED = frozenset({STEP_KEY, SEEDS_KEY, RANK_KEY, WORLD_KEY, "save_counter"})


class CheckpointState:
    """The checkpoint of ``trackables`` with the global step beside them.

    Args:
        trackables: the user's state by checkpoint key (validated by the caller).
    """

    def __init__(self, trackables: Mapping[str, Any]) -> None:
        self.trackables = dict(trackables)
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name=STEP_KEY)
        extra: dict[str, Any] = {STEP_KEY: self.step_var}
        seeds = async_fixes.seed_states(self.trackables)
        if seeds:
            extra[SEEDS_KEY] = seeds
        self.checkpoint = tf.train.Checkpoint(**self.trackables, **extra)
        self._async_fixed = False

    def restore(self, prefix: str) -> None:
        """Load checkpoint ``prefix`` into the state (raises if it does not match)."""
        self._drop_seeds_missing_from(prefix)
        async_fixes.build_optimizers(self.trackables)
        self.checkpoint.restore(prefix).assert_existing_objects_matched()

    def restored_step(self, prefix: str) -> int:
        """The global step of the checkpoint just restored from ``prefix``: the step
        variable, or the number in the name ``ckpt-N`` when it was written without it."""
        step = int(self.step_var.numpy())
        return step or number_of(prefix)

    def before_save(self, step: int) -> None:
        """Stamp ``step`` into the state and make its first async save safe."""
        self.step_var.assign(step)
        if not self._async_fixed:
            async_fixes.fix_async_copies(tf.train.TrackableView(self.checkpoint).descendants())
            self._async_fixed = True

    def nbytes(self) -> int:
        """Bytes of the variables in the state (each counted once)."""
        return nbytes_of(self.checkpoint)

    def _drop_seeds_missing_from(self, path: str) -> None:
        """Keras creates its global seed generator lazily, so an older checkpoint may
        lack it; it is then left as it is instead of failing the restore."""
        seeds = getattr(self.checkpoint, SEEDS_KEY, None)
        if seeds is None:
            return
        names = {name for name, _ in tf.train.list_variables(path)}
        for key in list(seeds):
            if f"{SEEDS_KEY}/{key}/.ATTRIBUTES/VARIABLE_VALUE" not in names:
                log.info("%s has no state for the Keras seed generator %r: left as is", path, key)
                del seeds[key]


def nbytes_of(checkpoint: tf.train.Checkpoint) -> int:
    """Bytes of the variables ``checkpoint`` reaches (each counted once)."""
    total = 0
    seen: set[int] = set()
    for obj in tf.train.TrackableView(checkpoint).descendants():
        shape, dtype = getattr(obj, "shape", None), getattr(obj, "dtype", None)
        if shape is None or dtype is None or not hasattr(obj, "assign") or id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            total += int(tf.TensorShape(shape).num_elements() or 0) * tf.as_dtype(dtype).size
        except (TypeError, ValueError):
            continue
    return total


def number_of(path: str) -> int:
    """The N of a checkpoint prefix ``.../ckpt-N`` (0 when it has none)."""
    tail = path.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


__all__ = [
    "RANK_KEY",
    "RESERVED",
    "SEEDS_KEY",
    "STEP_KEY",
    "WORLD_KEY",
    "CheckpointState",
    "nbytes_of",
    "number_of",
]
