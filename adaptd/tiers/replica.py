"""One job's folder on a durable destination: upload, list, verify, prune.

A destination is any fsspec URL: a plain path or ``file://`` for a mounted filesystem
(NFS, a second disk), ``s3://bucket/prefix`` through s3fs, others where fsspec has
them. The layout, shared with the daemon's replicator, the restore path and the
benchmark (docs/tiers.md)::

    ckpt-<step>.index, ckpt-<step>.data-00000-of-0000N   TF's files, same names as locally
    ckpt-<step>.manifest.json   written last for that step: sizes and sha256 of every file
    LATEST                      {"step": N, ...}: replaced in one piece, never moved back

Why it is safe to read at any moment:

* A step exists for a reader only once its manifest exists, and the manifest is
  written after every file of the step is complete. A reader checks each file's
  size and sha256 against it, so a truncated, replaced or bit-flipped object is
  detected and never used.
* On a mounted path a file is written under a hidden temporary name, fsync'ed and
  renamed (``os.replace``), and the directory fsync'ed: nothing partial ever carries
  a final name. An object store has no rename, but a PUT of a whole object is
  atomic and a multipart upload is invisible until completed, so objects are
  written under their final key (an aborted one is discarded).
* ``LATEST`` is replaced only after the manifest is there, and only by a newer step.

Interrupted uploads resume: a small journal (``.ckpt-<step>.upload.json``) records
each file once it is complete at the destination (its size, sha256 and the local
file's mtime), so a new attempt skips those; on a mounted path the partial file of
the interrupted one is kept, the prefix that matches the local file is kept and only
the rest is sent.

Three modules, one concern each: :mod:`adaptd.tiers.folder` is the folder as every
reader and the writer see it (:class:`~adaptd.tiers.folder.Folder`: its files, reading
and verifying a step, ``LATEST``), :mod:`adaptd.tiers.upload` the write path of one
checkpoint, and :class:`Replica` here the folder with both and its retention
(:meth:`Replica.prune`). This module never imports TensorFlow.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

from adaptd.tiers.folder import Folder, is_storage_error
from adaptd.tiers.layout import (
    ABANDONED_AFTER_S,
    MANIFEST_FILE,
    Manifest,
    TierError,
    local_files,
    manifest_name,
    step_of,
)
from adaptd.tiers.throttle import CHUNK, Throttle
from adaptd.tiers.upload import Upload, UploadResult

__all__ = [
    "ABANDONED_AFTER_S",
    "CHUNK",
    "Manifest",
    "Replica",
    "Throttle",
    "TierError",
    "UploadResult",
    "is_storage_error",
    "local_files",
    "manifest_name",
]

log = logging.getLogger("adaptd.tiers")


class Replica(Folder):
    """One job's folder at a durable destination (see the module docstring for the layout),
    with its write path (:meth:`upload`) and its retention (:meth:`prune`); reading,
    verifying and the folder's files are :class:`~adaptd.tiers.folder.Folder`'s.

    One writer per folder: the daemon uploads a job's checkpoints one at a time.
    Readers (:meth:`verify`, restore) may run at any time, from any host.

    Raises:
        TierError: the URL is empty, its protocol unknown, or its filesystem not
            installed (``s3://`` needs ``pip install 'adaptd[s3]'``).
    """

    #: Poll period while ``should_yield()`` holds an upload.
    yield_poll_s: float = 0.05
    #: Longest single pause for ``should_yield``; then at least one chunk is sent,
    #: so a job that saves back to back cannot starve its own replication.
    max_yield_s: float = 30.0

    # ------------------------------------------------------------------ writing

    def upload(
        self,
        local_dir: str | os.PathLike[str],
        step: int,
        job: str,
        *,
        throttle: Throttle | None = None,
        should_yield: Callable[[], bool] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> UploadResult:
        """Copy checkpoint ``ckpt-<step>`` from ``local_dir``, then publish it.

        Streams each file in chunks (sha256 computed on the way), data shards first
        and the index last; before each chunk ``throttle.take(n)`` (blocks to honour
        the cap) and, while ``should_yield()`` is true, a pause (polled, at most
        :attr:`max_yield_s` at a time); ``progress(n)`` after each chunk with the bytes
        just sent. Then the manifest, then ``LATEST`` if ``step`` is newer than it.

        An interrupted upload of the same step resumes: files recorded complete in
        the journal (same local size and mtime, same size at the destination) are not
        sent again, and on a mounted path the matching prefix of a partial file is
        kept. A step whose manifest already lists these very files (names, sizes and
        sha256 of the local files) is not sent again, only ``LATEST`` is advanced if
        a crash came before it; a manifest of other content is deleted first, then
        the step is sent whole.

        Raises:
            FileNotFoundError: the local checkpoint is not (or no longer) there.
            TierError: the destination could not be written (named, with the cause).
        """
        upload = Upload(
            self,
            throttle=throttle,
            should_yield=should_yield,
            progress=progress,
            yield_poll_s=self.yield_poll_s,
            max_yield_s=self.max_yield_s,
        )
        return upload.run(local_dir, step, job)

    # ------------------------------------------------------------------ retention

    def prune(self, *, keep_last: int, keep_every_s: float | None, now: float) -> list[int]:
        """Delete the steps that are fully superseded; returns the deleted steps.

        Kept: the newest ``keep_last`` steps, LATEST's step and anything newer (it may
        be being published), and with ``keep_every_s`` the oldest step of each
        ``keep_every_s``-long window of manifest ``created`` times (windows aligned to
        the epoch, so a step kept for its window stays kept). Nothing is deleted while
        there is no LATEST. Per deleted step the manifest goes first (readers stop
        trusting the step), then its files. Leftovers of abandoned uploads (files of
        a step older than LATEST with no manifest, untouched for an hour by ``now``)
        are deleted too.

        Raises:
            ValueError: ``keep_last`` < 1 or ``keep_every_s`` <= 0.
            TierError: the destination could not be listed or written.
        """
        if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1, got {keep_last!r}")
        if keep_every_s is not None and not keep_every_s > 0:
            raise ValueError(f"keep_every_s must be > 0 seconds or None, got {keep_every_s!r}")
        latest = self.latest()
        if latest is None:
            return []
        names = self.listing()
        steps = sorted({int(m.group(1)) for n in names if (m := MANIFEST_FILE.match(n))})
        keep = {s for s in steps if s >= latest} | set(steps[-keep_last:])
        if keep_every_s is not None:
            first_in_window: dict[int, tuple[float, int]] = {}
            for s in steps:
                try:
                    created = self.manifest(s).created
                except TierError:
                    continue  # an unreadable manifest cannot hold a window
                window = math.floor(created / keep_every_s)
                if window not in first_in_window or created < first_in_window[window][0]:
                    first_in_window[window] = (created, s)
            keep |= {s for _, s in first_in_window.values()}
        deleted = []
        for s in steps:
            if s in keep:
                continue
            self.remove([manifest_name(s)])
            self.remove(sorted(n for n in names if step_of(n) == s and not MANIFEST_FILE.match(n)))
            deleted.append(s)
        self._prune_abandoned(names, set(steps), latest, now)
        if deleted:
            log.info("%s: pruned steps %s", self.url, deleted)
        return deleted

    def _prune_abandoned(self, names: dict[str, int], steps: set[int], latest: int, now: float):
        abandoned: dict[int, list[str]] = {}
        for name in names:
            s = step_of(name)
            if s is not None and s < latest and s not in steps:
                abandoned.setdefault(s, []).append(name)
        for s, files in sorted(abandoned.items()):
            with self.errors(f"looking at step {s}'s leftovers"):
                newest = max(self.fs.modified(self.path_of(n)).timestamp() for n in files)
            if now - newest >= ABANDONED_AFTER_S:
                log.info("%s: deleting leftovers of an abandoned upload: %s", self.url, files)
                self.remove(sorted(files))
