"""Checkpoint files on disk: leftovers of killed writes, and removing a failed checkpoint.

The size of one checkpoint (:func:`checkpoint_bytes`) is
:func:`adaptd.checkpoints.files.checkpoint_bytes`, shared with the daemon's replicator.

TensorFlow writes a checkpoint ``ckpt-N`` into ``ckpt-N_temp/`` and then merges it
into ``ckpt-N.index`` + ``ckpt-N.data-*``; the ``checkpoint`` state file is replaced
atomically through ``checkpoint.tmp<uuid>``. A process killed mid-write leaves the
temporary names behind. They are never read (``latest`` only ever names merged
checkpoints), so they are safe to remove before the next run writes.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
from pathlib import Path

from adaptd.checkpoints.files import checkpoint_bytes

__all__ = ["checkpoint_bytes", "orphans", "remove_checkpoint", "remove_orphans"]

log = logging.getLogger("adaptd.client")


#: TensorFlow's temporary names: a checkpoint's ``<prefix>-N_temp/`` folder, the state
#: file's ``checkpoint.tmp<hex>``. Nothing else is a leftover of ours: any other file
#: with ``_temp`` in its name (``notes_temp.txt``) is somebody's, and was deleted.
_ORPHAN = re.compile(r"^(.+-\d+_temp|checkpoint\.tmp[0-9a-f]+)$")


def orphans(directory: str | os.PathLike[str]) -> list[Path]:
    """Temporary files and folders of interrupted writes in ``directory``."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _ORPHAN.match(entry.name)
        if m and (entry.name.startswith("checkpoint.tmp") or entry.is_dir()):
            found.append(entry)
    return sorted(found)


def remove_orphans(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove :func:`orphans`; returns what was removed. Failures are logged, not raised:
    a leftover that cannot be removed costs disk space, not correctness."""
    removed = []
    for path in orphans(directory):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as exc:
            log.warning("could not remove the leftover %s of an interrupted save: %s", path, exc)
            continue
        removed.append(path)
    if removed:
        log.info(
            "removed %d leftover(s) of interrupted saves in %s: %s",
            len(removed),
            directory,
            ", ".join(p.name for p in removed),
        )
    return removed


def remove_checkpoint(prefix: str) -> None:
    """Best-effort removal of a failed checkpoint's files, so nothing half-written lingers."""
    for name in [
        f"{prefix}.index",
        *glob.glob(glob.escape(prefix) + ".data-*"),
        f"{prefix}_temp",
    ]:
        try:
            if os.path.isdir(name):
                shutil.rmtree(name)
            elif os.path.lexists(name):
                os.unlink(name)
        except OSError as exc:
            log.warning("could not remove %s of the failed save: %s", name, exc)
