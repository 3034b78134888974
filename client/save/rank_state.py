"""One rank's own part of every save, in a job of several ranks: write, tidy, restore.

Each rank writes its part alone (no collective, no waiting for the other ranks) at the
agreed step of every save, asynchronously like the replicated part, into the job's
checkpoint directory as :func:`adaptd.checkpoints.rank_parts.part_name` (``ckpt-N.rank-R-of-W``).
The part holds the rank's own trackables (:mod:`adaptd.client.save.per_rank`) and three
int64 scalars saying whose it is: ``adaptd_global_step`` (as in the replicated part),
``adaptd_rank`` and ``adaptd_world_size``, so a part under a wrong name is refused at
restore instead of loaded into the wrong rank.

The order of a save, and why:

1. :meth:`RankPart.start` (training thread, at the save call, before the replicated
   part is started on the chief) creates the part's ``.pending`` marker, then starts
   the asynchronous write. A step whose replicated part lands first is thus known as a
   step of several ranks, and incomplete, by its names alone.
2. :meth:`RankPart.finish` (the save watcher's thread) waits for the write, takes its
   error, removes a failed part's files, then the marker, then the parts that
   :func:`adaptd.checkpoints.rank_parts.stale_parts` says are superseded: its own, and on the chief
   (whose ``CheckpointManager`` dropped their replicated part) every rank's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tensorflow as tf

from adaptd.checkpoints import rank_parts
from adaptd.client.save import async_fixes, files
from adaptd.client.save.async_writes import clear_async_error, wait_for_write
from adaptd.client.save.state import RANK_KEY, STEP_KEY, WORLD_KEY, nbytes_of

log = logging.getLogger("adaptd.client")

__all__ = ["PartMismatch", "RankPart"]


class PartMismatch(ValueError):
    """A part's own step, rank or world size is not what its name says."""


class RankPart:
    """This rank's part of each save.

    Args:
        trackables: the rank's own state by checkpoint key (may be empty: the part
            then says only whose it is, and the step stays complete only with it).
        rank, world_size: who writes it.
        directory: the job's checkpoint directory.
        keep: the job's ``max_to_keep`` (None: all), for
            :func:`~adaptd.checkpoints.rank_parts.stale_parts`.
    """

    def __init__(
        self,
        trackables: Mapping[str, Any],
        *,
        rank: int,
        world_size: int,
        directory: str | os.PathLike[str],
        keep: int | None,
    ) -> None:
        self.trackables = dict(trackables)
        self.rank, self.world_size = rank, world_size
        self.directory = Path(directory)
        self.keep = keep
        meta = {
            STEP_KEY: tf.Variable(0, dtype=tf.int64, trainable=False),
            RANK_KEY: tf.Variable(rank, dtype=tf.int64, trainable=False),
            WORLD_KEY: tf.Variable(world_size, dtype=tf.int64, trainable=False),
        }
        self._meta = meta
        self.checkpoint = tf.train.Checkpoint(**self.trackables, **meta)
        self._fixed = False
        self._written = False
        self._step: int | None = None

    def prefix(self, step: int) -> str:
        """This rank's part of ``step``, as a checkpoint prefix."""
        return str(self.directory / rank_parts.part_name(step, self.rank, self.world_size))

    def start(self, step: int) -> str:
        """Mark, then start writing, this rank's part of ``step``; its prefix. Raises
        what the marker or TensorFlow raise (the caller reports the save failed)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._marker(step).touch()
        self._step = step
        self._meta[STEP_KEY].assign(step)
        if not self._fixed:
            async_fixes.fix_async_copies(tf.train.TrackableView(self.checkpoint).descendants())
            self._fixed = True
        self._written = False
        options = tf.train.CheckpointOptions(
            enable_async=True, experimental_write_callbacks=[self._on_written]
        )
        return self.checkpoint.write(self.prefix(step), options=options)

    def _on_written(self, save_path: str) -> None:  # TF's thread, after a good write
        self._written = True

    def _marker(self, step: int) -> Path:
        return self.directory / rank_parts.pending_name(step, self.rank, self.world_size)

    def finish(self) -> tuple[str, int]:
        """Wait for the write :meth:`start` began: ``(error or "", bytes written)``.
        Never raises (the save watcher's thread)."""
        step, self._step = self._step, None
        if step is None:
            return "", 0
        error = ""
        try:
            wait_for_write(self.checkpoint)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        err = clear_async_error(self.checkpoint)
        if err is not None:
            error = f"{type(err).__name__}: {err}"
        elif not self._written and not error:
            error = "the write ended without TensorFlow's completion callback"
        prefix = self.prefix(step)
        nbytes = 0
        if error:
            files.remove_checkpoint(prefix)
            error = f"rank {self.rank}'s part {Path(prefix).name}: {error}"
        else:
            nbytes = files.checkpoint_bytes(prefix)
        with contextlib.suppress(OSError):
            self._marker(step).unlink()
        self.tidy()
        return error, nbytes

    def abandon(self, step: int) -> None:
        """The save of ``step`` failed before its write started: remove its marker."""
        self._step = None
        with contextlib.suppress(OSError):  # gone, or its directory never was
            self._marker(step).unlink()

    def tidy(self) -> list[tuple[int, int]]:
        """Delete superseded parts (:func:`adaptd.checkpoints.rank_parts.stale_parts`): this rank's
        own, and on the chief every rank's (it is the one that dropped their replicated
        part, so nothing is left behind when the run ends); the ``(step, rank)``
        deleted. Failures are logged: they cost disk space, not correctness."""
        names = rank_parts.listing(self.directory)
        ranks = range(self.world_size) if self.rank == 0 else (self.rank,)
        stale = rank_parts.stale_parts(names, ranks, self.world_size, self.keep)
        for step, rank in stale:
            name = rank_parts.part_name(step, rank, self.world_size)
            files.remove_checkpoint(str(self.directory / name))
            with contextlib.suppress(FileNotFoundError):
                (self.directory / f"{name}.{rank_parts.PENDING}").unlink()
            for note in rank_parts.listing(self.directory):  # a just-in-time save's notes
                if note.startswith(f"{name}.{rank_parts.REPLAY}"):
                    with contextlib.suppress(FileNotFoundError):
                        (self.directory / note).unlink()
        if stale:
            log.debug("rank %d removed the superseded parts %s", self.rank, stale)
        return stale

    def restore(self, step: int) -> None:
        """Load this rank's part of ``step``.

        Raises:
            PartMismatch: the part says it is another step's, rank's or world size's.
            AssertionError: (TensorFlow's) it lacks a trackable of this rank's state.
        """
        prefix = self.prefix(step)
        self.checkpoint.restore(prefix).assert_existing_objects_matched()
        found = tuple(int(self._meta[k].numpy()) for k in (STEP_KEY, RANK_KEY, WORLD_KEY))
        if found != (step, self.rank, self.world_size):
            raise PartMismatch(
                f"{prefix} holds the part of step {found[0]}, rank {found[1]} of "
                f"{found[2]}, not of step {step}, rank {self.rank} of {self.world_size}: "
                "it was renamed or copied from elsewhere"
            )

    def nbytes(self) -> int:
        """Bytes of the variables in this rank's part."""
        return nbytes_of(self.checkpoint)
