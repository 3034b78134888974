"""The TensorFlow hook's side of :class:`~adaptd.client.framework.FrameworkAdapter`.

The TensorFlow hook drives its saves itself (:mod:`adaptd.client.checkpointer`), so it
does not go through :class:`~adaptd.client.follower.Follower`; what TensorFlow provides
to the core is the same four answers as any framework's, read here from TensorFlow and
from the checkpoint directory its ``CheckpointManager`` writes. The hook asks it for
the GPUs it names in Hello (:func:`adaptd.client.assembly.tracker`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import tensorflow as tf

from adaptd.client.save.peer_failure import peer_failure

__all__ = ["TensorFlowAdapter"]

_STEP = re.compile(r"ckpt-(\d+)$")


class TensorFlowAdapter:
    """TensorFlow, for the checkpoint ``directory`` (None: not told) the hook's
    ``tf.train.CheckpointManager`` writes (``ckpt-<step>.index`` and its data shards,
    made durable when the ``checkpoint`` state file names them)."""

    framework = "tensorflow"

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory

    def accelerators(self) -> int:
        """The GPUs TensorFlow sees in this process."""
        return len(tf.config.list_physical_devices("GPU"))

    def finalized(self, step: int) -> int | None:
        """Bytes of ``ckpt-<step>``'s files once the state file lists it; else None."""
        if self.directory is None or step not in self._listed():
            return None
        prefix = f"ckpt-{step}."
        files = [e for e in os.scandir(self.directory) if e.name.startswith(prefix)]
        return sum(e.stat().st_size for e in files) if files else None

    def newest_durable(self) -> int | None:
        """The step of the newest checkpoint the state file names (None: none)."""
        listed = self._listed()
        return max(listed) if listed else None

    def peer_failure(self, exc: BaseException) -> str | None:
        """TensorFlow's errors for a lost peer or a timed-out collective
        (:func:`adaptd.client.save.peer_failure.peer_failure`)."""
        return peer_failure(exc)

    def _listed(self) -> set[int]:
        if self.directory is None:
            return set()
        state = tf.train.get_checkpoint_state(str(self.directory))
        if state is None:
            return set()
        names = [*state.all_model_checkpoint_paths, state.model_checkpoint_path]
        return {int(m[1]) for p in names if (m := _STEP.search(p))}
