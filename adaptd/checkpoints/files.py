"""TensorFlow's checkpoint files, read as plain files (adaptd never imports TensorFlow).

A ``tf.train.CheckpointManager`` checkpoint ``ckpt-N`` is ``ckpt-N.index`` plus data
shards ``ckpt-N.data-00000-of-0000K``; the directory's ``checkpoint`` state file (a
text-format ``CheckpointState``) names the newest one in ``model_checkpoint_path``.
The hook (sizes of its saves, ``adaptd verify``), the daemon's replicator (what is
finished locally, how big) and restore (writing a state file) all read and write
these names here, so they agree on them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
from pathlib import PurePath

__all__ = [
    "CHECKPOINT_FILE",
    "DATA_SHARD",
    "STATE_FILE",
    "checkpoint_bytes",
    "state_file_outside",
    "state_file_path",
    "state_file_step",
    "state_file_text",
]

#: TensorFlow's state file in a checkpoint directory.
STATE_FILE = "checkpoint"
#: A file of checkpoint ``ckpt-<step>``: group 1 the step, group 3/4 shard and shard count.
CHECKPOINT_FILE = re.compile(r"^ckpt-(\d+)\.(index|data-(\d{5})-of-(\d{5}))$")
#: The suffix of a data shard after the checkpoint's prefix.
DATA_SHARD = re.compile(r"\.data-(\d{5})-of-(\d{5})$")

_MODEL_PATH = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"', re.M)
_ANY_PATH = re.compile(
    r'^(model_checkpoint_path|all_model_checkpoint_paths):\s*"((?:[^"\\]|\\.)*)"', re.M
)
_NUMBERED = re.compile(r"^ckpt-(\d+)$")


def state_file_path(text: str) -> str | None:
    """The checkpoint a state file's text names as the newest (``model_checkpoint_path``,
    unescaped, relative to the directory or absolute), or ``None`` when it names none."""
    m = _MODEL_PATH.search(text)
    if not m:
        return None
    return m.group(1).encode().decode("unicode_escape")


def state_file_step(text: str) -> int | None:
    """The step of the ``ckpt-N`` a state file names as the newest, or ``None``."""
    path = state_file_path(text)
    if path is None:
        return None
    m = _NUMBERED.match(PurePath(path).name)
    return int(m.group(1)) if m else None


def state_file_text(step: int) -> str:
    """A state file naming ``ckpt-<step>`` as the newest and only checkpoint."""
    return f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n'


def checkpoint_bytes(prefix: str | os.PathLike[str]) -> int:
    """Total size of the checkpoint ``prefix`` (``dir/ckpt-N``): its ``.index`` and data
    shards; files that are gone count 0."""
    text = os.fspath(prefix)
    total = 0
    shards = (n for n in glob.glob(glob.escape(text) + ".data-*") if DATA_SHARD.search(n))
    for name in (f"{text}.index", *shards):
        with contextlib.suppress(OSError):
            total += os.stat(name).st_size
    return total


def state_file_outside(directory: str | os.PathLike[str], text: str) -> tuple[str, str] | None:
    """The first ``(field, path)`` of a state file's text that names a checkpoint outside
    ``directory`` (an absolute path elsewhere, ``..``, a symlinked folder), else ``None``.

    TensorFlow follows such a path: ``restore`` would load another run's checkpoint,
    and the ``CheckpointManager`` deletes the oldest listed checkpoints when it rotates,
    wherever they are. A state file written by another tool, or copied from another
    directory, must therefore be refused, not followed."""
    root = os.path.realpath(directory)
    for m in _ANY_PATH.finditer(text):
        path = m.group(2).encode().decode("unicode_escape")
        full = os.path.realpath(os.path.join(root, path))
        if os.path.dirname(full) != root:
            return m.group(1), path
    return None
