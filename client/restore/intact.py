"""Which checkpoint a run resumes from: the newest one that is whole.

A newest checkpoint can be damaged: a disk fault, a copy cut short, a file removed
by hand. Restoring it raised a raw TensorFlow error (``IndexError: Read less bytes
than requested``) and the job could not start, while an older intact checkpoint sat
beside it. Keras' ``BackupAndRestore`` falls back to its previous backup in this
case; so does the hook:

1. the candidates are :func:`adaptd.client.restore.verify.candidates`, newest first;
2. each gets the quick check of ``adaptd verify`` (index checksums, every shard's
   size, the object graph; ``verify(read_tensors=False)``), whose cost is the index's
   size, not the checkpoint's;
3. the first that passes is restored; TensorFlow checks every tensor's CRC32C as it
   reads it, so a flipped byte fails the restore (``DataLossError``) and the next
   older candidate is tried.

After a resume that skipped damaged checkpoints, :func:`set_aside` moves their files
into ``damaged/`` in the directory (the previous resume's leftovers there are removed:
one set is kept, for a look at what went wrong) and drops them from the ``checkpoint``
state file; otherwise they stayed in the directory for ever and the
``CheckpointManager`` counted them among its ``max_to_keep``, deleting intact ones
first.

A checkpoint that does not match the model (a wrong or renamed variable) is not
damage: that error is raised as it is, since an older checkpoint would not match
either. Only when no candidate is intact does :class:`NoIntactCheckpoint` stop the
run, naming each checkpoint found and what is wrong with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("adaptd.client")

#: Longest reason kept per damaged checkpoint (reports and the Hello field).
_MAX_WHY = 400
#: Where :func:`set_aside` moves damaged checkpoints, inside the checkpoint directory.
DAMAGED_DIR = "damaged"


@dataclass(frozen=True, slots=True)
class Damaged:
    """A checkpoint a resume skipped: its name (``ckpt-35``) and what is wrong."""

    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.name} ({self.why})"


class NoIntactCheckpoint(RuntimeError):
    """Every checkpoint in ``directory`` is damaged; ``damaged`` says how, newest first.

    Raised by ``restore_or_initialize()`` instead of TensorFlow's error, so the run
    stops with what was found. Move the damaged checkpoints aside to start over, or
    restore an intact copy (e.g. ``adaptd restore``) into the directory.
    """

    def __init__(self, directory: str | os.PathLike[str], damaged: list[Damaged]) -> None:
        self.directory = str(directory)
        self.damaged = list(damaged)
        listing = "; ".join(str(d) for d in damaged)
        super().__init__(
            f"no intact checkpoint in {self.directory}: {len(damaged)} found, all damaged: "
            f"{listing}. Move them aside to start over, or restore an intact copy "
            "(adaptd restore) into the directory"
        )


class WorldSizeChanged(RuntimeError):
    """The newest checkpoint was written by a job of another number of ranks (the
    message names both and what to do; :func:`adaptd.checkpoints.rank_parts.world_changed`).
    Raised by ``restore_or_initialize()`` instead of an inexact resume."""


class ForeignStateFile(ValueError):
    """The directory's ``checkpoint`` state file names a checkpoint outside the
    directory (written by another tool, or copied from another run's directory).

    Raised by ``restore_or_initialize()`` before anything is loaded or written:
    TensorFlow would restore another run's state from there, and the
    ``CheckpointManager`` would delete the oldest listed checkpoints there when it
    rotates. Fix the state file (or remove it: the newest checkpoint in the directory
    is then restored), then start again; nothing was changed.
    """

    def __init__(self, directory: str | os.PathLike[str], field: str, path: str) -> None:
        self.directory, self.field, self.path = str(directory), field, path
        super().__init__(
            f"{os.path.join(self.directory, 'checkpoint')}: {field} is {path!r}, outside "
            f"{self.directory}; refused (a resume would load another run's checkpoint, and "
            "saving would delete checkpoints there). Fix or remove that state file: the "
            "checkpoints in the directory are untouched"
        )


@dataclass(frozen=True, slots=True)
class Resume:
    """What :func:`restore_newest_intact` did: the checkpoint restored (None: none
    existed) and the newer ones it skipped as damaged."""

    restored: str | None
    skipped: tuple[Damaged, ...] = ()

    def describe(self) -> str:
        """One line for logs and the daemon: ``""`` when nothing was skipped."""
        if not self.skipped:
            return ""
        skipped = "; ".join(str(d) for d in self.skipped)
        where = f"resumed from {Path(self.restored).name}" if self.restored else "started afresh"
        return f"skipped damaged {skipped}; {where}"


def warn_skipped(resume: Resume, directory: str | os.PathLike[str]) -> None:
    """Log and warn (``RuntimeWarning``) the newer checkpoints ``resume`` skipped."""
    if not resume.skipped:
        return
    text = f"adaptd: the newest checkpoint in {directory} is not usable: {resume.describe()}"
    log.warning("%s", text)
    warnings.warn(text, RuntimeWarning, stacklevel=3)


def restore_newest_intact(
    directory: str | os.PathLike[str], restore: Callable[[str], None]
) -> Resume:
    """Restore the newest intact checkpoint of ``directory`` with ``restore(prefix)``.

    ``restore`` loads the state (it raises for a checkpoint that does not match the
    state; that error is not caught). Raises :class:`NoIntactCheckpoint` when there
    are checkpoints but none is intact, :class:`ForeignStateFile` when the state file
    names a checkpoint outside ``directory``.
    """
    from adaptd.checkpoints.files import STATE_FILE, state_file_outside
    from adaptd.client.restore import verify

    state = Path(directory) / STATE_FILE
    with contextlib.suppress(OSError):  # unreadable: verify's notes say so
        outside = state_file_outside(directory, state.read_text(errors="replace"))
        if outside is not None:
            raise ForeignStateFile(directory, *outside)
    skipped: list[Damaged] = []
    for prefix in verify.candidates(directory):
        damaged = try_restore(prefix, restore)
        if damaged is not None:
            skipped.append(damaged)
            continue
        return Resume(str(prefix), tuple(skipped))
    if skipped:
        raise NoIntactCheckpoint(directory, skipped)
    return Resume(None)


def try_restore(prefix: Path, restore: Callable[[str], None]) -> Damaged | None:
    """Restore the checkpoint ``prefix`` with ``restore`` after the quick check; what
    is wrong with it (None: restored). A checkpoint that does not match the state
    raises, as :func:`restore_newest_intact` says."""
    import tensorflow as tf

    from adaptd.client.restore import verify

    report = verify.verify(prefix, read_tensors=False)
    if not report.ok:
        why = "; ".join(f"{p.kind}: {p.message}" for p in report.problems)
        return Damaged(prefix.name, why[:_MAX_WHY])
    try:
        restore(str(prefix))
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError, IndexError) as exc:
        # a checksum mismatch (flipped bytes) or a short read while restoring
        message = " ".join((getattr(exc, "message", None) or str(exc)).split())
        return Damaged(prefix.name, f"{verify.CORRUPTED}: {message}"[:_MAX_WHY])
    return None


def set_aside(directory: str | os.PathLike[str], resume: Resume) -> list[Path]:
    """Move the checkpoints ``resume`` skipped into ``directory/damaged/`` and drop
    them from the state file, which then names the restored one as latest; returns
    the files moved. Logged; a file that cannot be moved is logged and left (it then
    still costs disk space, nothing else: the state file no longer lists it)."""
    if not resume.skipped or resume.restored is None:
        return []
    import tensorflow as tf

    d = Path(directory)
    aside = d / DAMAGED_DIR
    names = {s.name for s in resume.skipped}
    moved: list[Path] = []
    try:
        if aside.is_dir():
            shutil.rmtree(aside)  # the previous resume's: one set is kept
        aside.mkdir()
        for name in sorted(names):
            for f in sorted((*d.glob(f"{name}.index"), *d.glob(f"{name}.data-*"))):
                moved.append(Path(shutil.move(str(f), str(aside / f.name))))
    except OSError as exc:
        log.warning("could not move the damaged checkpoints %s aside: %s", sorted(names), exc)
    state = tf.train.get_checkpoint_state(str(d))
    if state is not None:
        kept = [
            (p, t)
            for p, t in zip(
                state.all_model_checkpoint_paths,
                [*state.all_model_checkpoint_timestamps]
                or [None] * len(state.all_model_checkpoint_paths),
                strict=True,
            )
            if Path(p).name not in names
        ]
        tf.compat.v1.train.update_checkpoint_state(
            str(d),
            resume.restored,
            all_model_checkpoint_paths=[p for p, _ in kept],
            all_model_checkpoint_timestamps=[t for _, t in kept] if kept and kept[0][1] else None,
            last_preserved_timestamp=state.last_preserved_timestamp or None,
        )
    log.warning(
        "moved the damaged checkpoint(s) %s to %s and out of the state file: %s",
        ", ".join(sorted(names)),
        aside,
        ", ".join(p.name for p in moved) or "no file was left to move",
    )
    return moved
