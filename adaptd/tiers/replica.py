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

This module never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from adaptd.tiers.layout import (
    ABANDONED_AFTER_S,
    LATEST,
    MANIFEST_FILE,
    FileEntry,
    Manifest,
    TierError,
    fsync_dir,
    local_files,
    manifest_name,
    part_name,
    step_of,
)
from adaptd.tiers.throttle import CHUNK, Throttle
from adaptd.tiers.upload import OBJECT_BLOCK, Upload, UploadResult

__all__ = [
    "ABANDONED_AFTER_S",
    "CHUNK",
    "LATEST",
    "OBJECT_BLOCK",
    "OBJECT_STORES",
    "STORAGE_PACKAGES",
    "FileEntry",
    "Manifest",
    "Replica",
    "Throttle",
    "TierError",
    "UploadResult",
    "fsync_dir",
    "is_storage_error",
    "local_files",
    "manifest_name",
    "part_name",
]

log = logging.getLogger("adaptd.tiers")

#: Object stores: no rename, but a whole-object PUT (or a completed multipart upload) is
#: atomic, so files are written under their final key.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})


#: Packages whose exceptions mean the destination (or its storage_options) is at fault.
STORAGE_PACKAGES = frozenset({"botocore", "aiobotocore", "aiohttp", "s3fs", "fsspec", "gcsfs"})


def is_storage_error(exc: BaseException) -> bool:
    """Errors that mean "the destination could not be used" rather than a bug here:
    OSError (fsspec's and s3fs's translation of most failures), the remote-storage
    clients' own types (botocore, aiohttp ...), and anything raised inside those
    libraries (a TypeError for an unknown storage option, for instance)."""
    if isinstance(exc, OSError):
        return True
    if (type(exc).__module__ or "").split(".", 1)[0] in STORAGE_PACKAGES:
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return str(module).split(".", 1)[0] in STORAGE_PACKAGES


class Replica:
    """One job's folder at a durable destination (see the module docstring for the layout).

    ``url`` is that folder: a path, ``file://...``, ``s3://bucket/prefix/job``, or
    another fsspec URL; ``storage_options`` go to fsspec (e.g. ``endpoint_url`` for
    an S3-compatible server; credentials normally come from the environment).

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

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(url, str) or not url.strip():
            raise TierError(f"a destination URL must be a non-empty string, got {url!r}")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TierError(
                f"storage_options must be a mapping of fsspec options, got {storage_options!r}"
            )
        import fsspec

        self.url = url.strip().rstrip("/") or "/"
        protocol, _ = fsspec.core.split_protocol(self.url)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **dict(storage_options or {}))
        except ImportError as exc:
            extra = " (pip install 'adaptd[s3]')" if protocol in ("s3", "s3a") else ""
            raise TierError(
                f"{self.url}: the {protocol}:// filesystem is not installed{extra}: {exc}"
            ) from None
        except ValueError as exc:
            raise TierError(f"{self.url}: not a usable destination URL ({exc})") from None
        self.root = self.root.rstrip("/") or "/"
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.local = "file" in protocols or "local" in protocols
        self.object_store = not self.local and bool(OBJECT_STORES.intersection(protocols))

    def __repr__(self) -> str:
        return f"Replica({self.url!r})"

    # ------------------------------------------------------------------ paths, errors

    def path_of(self, name: str) -> str:
        """The fsspec path of the folder's file ``name``."""
        return f"{self.root}/{name}" if self.root != "/" else f"/{name}"

    def where(self, name: str | None = None) -> str:
        """The URL of the folder, or of its file ``name``, for messages."""
        return self.url if name is None else f"{self.url}/{name}"

    @contextlib.contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Turn the filesystem's own exceptions into a TierError that names the URL."""
        try:
            yield
        except TierError:
            raise
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            raise TierError(f"{self.url}: {doing} failed ({type(exc).__name__}: {exc})") from exc

    def listing(self) -> dict[str, int]:
        """name -> size of every file in the folder (empty when the folder is absent)."""
        with self.errors("listing the folder"):
            self.fs.invalidate_cache(self.root)
            try:
                entries = self.fs.ls(self.root, detail=True)
            except FileNotFoundError:
                return {}
        out = {}
        for e in entries:
            if e.get("type", "file") == "file":
                out[e["name"].rstrip("/").rsplit("/", 1)[-1]] = int(e.get("size") or 0)
        return out

    def read_small(self, name: str) -> bytes | None:
        """A small file's content, or None when it does not exist."""
        with self.errors(f"reading {name}"):
            try:
                return self.fs.cat_file(self.path_of(name))
            except FileNotFoundError:
                return None

    def write_small(self, name: str, data: bytes) -> None:
        """Replace a small file in one piece (manifest, LATEST, journal)."""
        path = self.path_of(name)
        with self.errors(f"writing {name}"):
            if self.local:
                tmp = Path(self.path_of(part_name(name)))
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                fsync_dir(self.root)
            elif self.object_store:
                self.fs.pipe_file(path, data)
            else:
                tmp = self.path_of(part_name(name))
                self.fs.pipe_file(tmp, data)
                self.fs.mv(tmp, path)

    def remove(self, names: Sequence[str]) -> None:
        """Delete the folder's files ``names`` (those already gone are no error)."""
        with self.errors(f"deleting {', '.join(names)}"):
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(self.path_of(name))

    # ------------------------------------------------------------------ reading

    def steps(self) -> list[int]:
        """Steps that have a manifest, ascending (whether their files verify or not)."""
        found = (MANIFEST_FILE.match(name) for name in self.listing())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> int | None:
        """``LATEST``'s step, or None when there is none.

        Raises:
            TierError: LATEST exists but is not ``{"step": N, ...}``.
        """
        raw = self.read_small(LATEST)
        if raw is None:
            return None
        try:
            step = json.loads(raw)["step"]
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise TypeError(f"step {step!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise TierError(f"{self.where(LATEST)}: not a LATEST marker ({exc})") from None
        return step

    def manifest(self, step: int) -> Manifest:
        """The step's manifest.

        Raises:
            TierError: it does not exist or does not parse.
        """
        name = manifest_name(step)
        raw = self.read_small(name)
        if raw is None:
            raise TierError(f"{self.where(name)}: no manifest, so step {step} is not there")
        return Manifest.from_json(raw, step=step, where=self.where(name))

    def check_sizes(self, manifest: Manifest) -> None:
        """Every file of the manifest exists with its size: the cheap check, no reads.

        Raises:
            TierError: naming the first missing or wrongly sized file.
        """
        sizes = self.listing()
        for f in manifest.files:
            if f.name not in sizes:
                raise TierError(f"{self.where(f.name)}: missing (step {manifest.step})")
            if sizes[f.name] != f.size:
                raise TierError(
                    f"{self.where(f.name)}: {sizes[f.name]} bytes, the manifest says {f.size} "
                    f"(truncated or replaced); step {manifest.step} is not usable"
                )

    def read_verified(
        self,
        entry: FileEntry,
        out: IO[bytes] | None = None,
        *,
        step: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Stream one file, checking its size and sha256 against ``entry``.

        Writes it to ``out`` when given (restore), else only hashes it (verify).
        ``progress(n)`` after each chunk read.

        Raises:
            TierError: the file is missing, or its size or sha256 differs.
        """
        name = entry.name
        what = f"step {step}" if step is not None else "this checkpoint"
        h = hashlib.sha256()
        n = 0
        with self.errors(f"reading {name}"):
            try:
                src = self.fs.open(self.path_of(name), "rb", block_size=OBJECT_BLOCK)
            except FileNotFoundError:
                raise TierError(f"{self.where(name)}: missing ({what})") from None
            with src:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    n += len(chunk)
                    if out is not None:
                        out.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
        if n != entry.size:
            raise TierError(
                f"{self.where(name)}: {n} bytes, the manifest says {entry.size} "
                f"(truncated or replaced); {what} is not usable"
            )
        if h.hexdigest() != entry.sha256:
            raise TierError(
                f"{self.where(name)}: sha256 {h.hexdigest()[:12]}..., the manifest says "
                f"{entry.sha256[:12]}... (corrupted); {what} is not usable"
            )

    def verify(self, step: int) -> Manifest:
        """Check every file of a step (size, then a full read and sha256).

        Raises:
            TierError: naming the first bad or missing file (or the bad manifest).
        """
        manifest = self.manifest(step)
        self.check_sizes(manifest)
        for entry in manifest.files:
            self.read_verified(entry, step=step)
        return manifest

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
        return Upload(self, throttle=throttle, should_yield=should_yield, progress=progress).run(
            local_dir, step, job
        )

    def advance_latest(self, step: int) -> None:
        """Point LATEST at ``step`` unless it already names that step or a newer one."""
        try:
            current = self.latest()
        except TierError as exc:
            log.warning("%s; replacing it with step %d", exc, step)
            current = None
        if current is not None and current >= step:
            if current > step:
                log.info("%s: LATEST stays at step %d (uploaded %d)", self.url, current, step)
            return
        doc = {"step": step, "manifest": manifest_name(step), "updated": time.time()}
        self.write_small(LATEST, (json.dumps(doc) + "\n").encode())

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
