"""What Orbax commits, read from its checkpoint directory without JAX or Orbax.

Orbax's ``CheckpointManager`` commits a step atomically: it writes
``<step>.orbax-checkpoint-tmp-<time>/`` and renames it to ``<step>/`` once every process
is done (on object stores, where a rename is not atomic, it writes
``commit_success.txt`` into ``<step>/`` instead; recent versions write it everywhere).
A step directory under its final name, holding Orbax's checkpoint metadata, is a
finalized step. The one copy of that reading: the Orbax adapter
(:mod:`adaptd.client.orbax.adapter`), ``adaptd verify`` and the replicator
(:mod:`adaptd.tiers.replicator`, which does not copy Orbax steps) all use it.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

__all__ = [
    "COMMIT_FILE",
    "METADATA_FILE",
    "TMP_MARK",
    "finalized_steps",
    "holds_orbax",
    "step_bytes",
]

#: Written into every step directory Orbax's ``CheckpointManager`` saves.
METADATA_FILE = "_CHECKPOINT_METADATA"
#: Orbax's commit marker (object stores; recent versions write it on every filesystem).
COMMIT_FILE = "commit_success.txt"
#: The part of a name Orbax gives a step directory while it is being written.
TMP_MARK = ".orbax-checkpoint-tmp"
_STEP = re.compile(r"(?:.*_)?(\d+)")


def finalized_steps(directory: str | os.PathLike[str]) -> dict[int, Path]:
    """The finalized steps Orbax's ``CheckpointManager`` committed in ``directory``
    (default step names ``<step>``, or ``<prefix>_<step>``), each with its directory.
    A directory being written (its temporary name) is not one; nor is one that lacks
    Orbax's checkpoint metadata (not Orbax's). A missing directory has none."""
    found: dict[int, Path] = {}
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        if TMP_MARK in entry.name or not entry.is_dir():
            continue
        m = _STEP.fullmatch(entry.name)
        if m and os.path.exists(os.path.join(entry.path, METADATA_FILE)):
            found[int(m.group(1))] = Path(entry.path)
    return found


def holds_orbax(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds Orbax steps, finalized or being written (False when
    it is missing or unreadable)."""
    if finalized_steps(directory):
        return True
    try:
        with os.scandir(directory) as it:
            return any(TMP_MARK in e.name for e in it)
    except OSError:
        return False


def step_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of the files under ``path`` (a step directory)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed (Orbax's retention)
                total += os.lstat(os.path.join(root, name)).st_size
    return total
