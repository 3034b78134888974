"""Where a save is written: its target.

A :class:`Target` takes the replicated state of one save (the model, the optimizer,
the global step: what every rank of a mirrored job holds alike), starts its
asynchronous write and says under which prefix; :class:`~adaptd.client.save.saves.Saves`
waits for the write, measures it and reports it, whatever the target.

* :class:`Durable` is the job's checkpoint directory, through TensorFlow's
  ``CheckpointManager``, which numbers the checkpoints ``ckpt-<step>``, lists them in
  the ``checkpoint`` state file and keeps ``max_to_keep`` of them. It is what a
  restore reads (:mod:`adaptd.client.restore`) and what the daemon replicates.
* :class:`~adaptd.client.save.scratch.Scratch` is where a worker of a mirrored job
  that is not the chief writes its required copy: host-local, outside the manager's
  list, removed as soon as its write ended.

A tier beside the durable one (host memory or local disk, saved more often than the
durable copy: docs/architecture.md, "Two tiers and just-in-time saves") is one more
target, chosen per save by the tier the plan names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import tensorflow as tf

__all__ = ["Durable", "Target"]


class Target(Protocol):
    """Where the replicated state of a save goes."""

    def prefix(self, step: int) -> str:
        """The checkpoint prefix the save of ``step`` gets."""
        ...

    def write(
        self, checkpoint: tf.train.Checkpoint, step: int, options: tf.train.CheckpointOptions
    ) -> str:
        """Start the asynchronous write of ``checkpoint`` as the save of ``step``; its
        prefix. Raises what TensorFlow raises (the save is then reported failed)."""
        ...

    def ended(self, prefix: str) -> None:
        """The write at ``prefix`` ended (well or not; a failed one's files are gone)."""
        ...

    def close(self) -> None:
        """No more saves (the hook closes)."""
        ...


class Durable:
    """The job's checkpoint directory, kept by a ``tf.train.CheckpointManager``.

    Args:
        checkpoint: the state saved (the manager is built on it).
        directory: the checkpoint directory.
        max_to_keep: checkpoints the manager keeps (None: all).
    """

    def __init__(
        self, checkpoint: tf.train.Checkpoint, directory: Path, max_to_keep: int | None
    ) -> None:
        self.checkpoint = checkpoint
        self.directory = directory
        self.max_to_keep = max_to_keep
        self.manager = self._open()

    def _open(self) -> tf.train.CheckpointManager:
        return tf.train.CheckpointManager(
            self.checkpoint, str(self.directory), max_to_keep=self.max_to_keep
        )

    def reopen(self) -> None:
        """Read the directory's state file again: the manager reads it once, when it is
        made, so a restore that changed it (damaged checkpoints set aside, a pull from a
        destination) must be followed by this before the first save."""
        self.manager = self._open()

    @property
    def latest(self) -> str | None:
        """The newest checkpoint the state file names (None: none)."""
        return self.manager.latest_checkpoint

    def prefix(self, step: int) -> str:
        return os.path.join(str(self.directory), f"ckpt-{step}")  # the manager's name

    def write(
        self, checkpoint: tf.train.Checkpoint, step: int, options: tf.train.CheckpointOptions
    ) -> str:
        """Save through the manager, which also rotates the oldest out."""
        return self.manager.save(checkpoint_number=step, options=options)

    def ended(self, prefix: str) -> None:
        """Nothing to tidy: the manager listed it (once its write ended well)."""

    def close(self) -> None:
        """Nothing to release."""
