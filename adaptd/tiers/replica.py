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

:class:`Replica` is the folder as the writer and every reader see it: its files by
name, each filesystem error turned into a :class:`~adaptd.tiers.layout.TierError` that
names the URL, small files replaced in one piece (manifest, ``LATEST``, an upload's
journal), the checks a reader makes before it trusts a step (sizes, then every byte's
sha256 against the manifest), the write path of a whole checkpoint (:meth:`Replica.upload`,
one :class:`Upload` each) and retention (:meth:`Replica.prune`). Those are one concept:
the writer's order (files, then manifest, then ``LATEST``) is what makes the readers'
checks sound, and the upload works on the folder's own files and errors. The file
layout itself is :mod:`adaptd.tiers.layout`, the pacing :mod:`adaptd.tiers.throttle`.
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from adaptd.tiers import urls
from adaptd.tiers.layout import (
    ABANDONED_AFTER_S,
    LATEST,
    MANIFEST_FILE,
    MANIFEST_VERSION,
    SHA256_HEX,
    FileEntry,
    Manifest,
    TierError,
    fsync_dir,
    journal_name,
    local_files,
    manifest_name,
    part_name,
    step_of,
)
from adaptd.tiers.throttle import CHUNK, Pacer, Throttle

__all__ = [
    "ABANDONED_AFTER_S",
    "CHUNK",
    "OBJECT_BLOCK",
    "STORAGE_PACKAGES",
    "Manifest",
    "Replica",
    "Throttle",
    "TierError",
    "Upload",
    "UploadResult",
    "is_storage_error",
    "local_files",
    "manifest_name",
]

log = logging.getLogger("adaptd.tiers")

#: Part size for object-store reads and writes (s3fs starts a multipart upload beyond
#: it; >= 5 MiB).
OBJECT_BLOCK = 8 << 20

#: Packages whose exceptions mean the destination (or its storage_options) is at fault:
#: fsspec, the object stores' filesystems (:data:`adaptd.tiers.urls.OBJECT_STORES`) and
#: the clients they use.
STORAGE_PACKAGES = frozenset(
    {"fsspec", "s3fs", "gcsfs", "adlfs", "ossfs", "botocore", "aiobotocore", "aiohttp"}
)


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


@dataclass(frozen=True)
class UploadResult:
    """What one :meth:`Replica.upload` did.

    ``bytes_sent`` counts only what was written this time: files skipped on resume
    (``resumed_files``) and the kept prefix of a resumed partial file are not in it.
    ``yielded_s`` is the time spent paused for ``should_yield``.
    """

    step: int
    bytes_sent: int
    bytes_total: int
    files: int
    seconds: float
    resumed_files: int
    yielded_s: float = 0.0


class Replica:
    """One job's folder at a durable destination (see the module docstring for the layout):
    its files, reading and verifying a step, ``LATEST``, the write path (:meth:`upload`)
    and retention (:meth:`prune`).

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
        try:
            urls.check(self.url, relative=True)
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **dict(storage_options or {}))
        except urls.UrlError as exc:
            raise TierError(f"{self.url}: not a usable destination URL: it {exc.reason}") from None
        except (ImportError, ValueError) as exc:  # what fsspec itself refuses
            raise TierError(f"{self.url}: not a usable destination URL ({exc})") from None
        self.root = self.root.rstrip("/") or "/"
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.local = bool(urls.LOCAL.intersection(protocols))
        self.object_store = not self.local and bool(urls.OBJECT_STORES.intersection(protocols))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

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

    # ------------------------------------------------------------------ LATEST

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


class Upload:
    """One upload to the folder ``replica``: paced by ``throttle``, pausing while
    ``should_yield()`` (polled every ``yield_poll_s``, at most ``max_yield_s`` at a
    time), ``progress(n)`` after each chunk sent."""

    def __init__(
        self,
        replica: Replica,
        *,
        throttle: Throttle | None = None,
        should_yield: Callable[[], bool] | None = None,
        progress: Callable[[int], None] | None = None,
        yield_poll_s: float,
        max_yield_s: float,
    ) -> None:
        self.replica = replica
        self.throttle = throttle
        self.should_yield = should_yield
        self.progress = progress
        self.yield_poll_s = yield_poll_s
        self.max_yield_s = max_yield_s

    def pacer(self) -> Pacer:
        return Pacer(
            self.throttle,
            self.should_yield,
            self.progress,
            yield_poll_s=self.yield_poll_s,
            max_yield_s=self.max_yield_s,
        )

    def run(self, local_dir: str | os.PathLike[str], step: int, job: str) -> UploadResult:
        """Copy checkpoint ``ckpt-<step>`` from ``local_dir``, then publish it (see
        :meth:`Replica.upload`). Raises :class:`ValueError` for a
        bad step, :class:`FileNotFoundError` when the local checkpoint is gone, and
        :class:`~adaptd.tiers.layout.TierError` when the destination cannot be written."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        t0 = time.perf_counter()
        files = local_files(local_dir, step)
        stats = [(p, p.stat()) for p in files]
        total = sum(st.st_size for _, st in stats)
        if not self.replica.object_store:
            with self.replica.errors("creating the folder"):
                self.replica.fs.makedirs(self.replica.root, exist_ok=True)

        published = self._published(step, stats)
        if published is True:
            self.replica.advance_latest(step)
            return UploadResult(step, 0, total, len(files), time.perf_counter() - t0, len(files))
        if published is False:  # a manifest of other content: readers stop trusting it now
            self.replica.remove([manifest_name(step)])

        journal = self._read_journal(step)
        remote_sizes = self.replica.listing()
        entries: list[FileEntry] = []
        sent = resumed = 0
        pacer = self.pacer()
        for path, st in stats:
            rec = journal.get(path.name)
            if (
                rec is not None
                and rec.get("size") == st.st_size
                and rec.get("mtime_ns") == st.st_mtime_ns
                and remote_sizes.get(path.name) == st.st_size
                and SHA256_HEX.match(str(rec.get("sha256")))
            ):
                entries.append(FileEntry(path.name, st.st_size, rec["sha256"]))
                resumed += 1
                continue
            sha, n = self._send(path, pacer)
            sent += n
            entries.append(FileEntry(path.name, st.st_size, sha))
            journal[path.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
            self.replica.write_small(journal_name(step), json.dumps(journal).encode())

        manifest = Manifest(MANIFEST_VERSION, str(job), step, time.time(), total, tuple(entries))
        self.replica.write_small(manifest_name(step), manifest.to_json())
        self.replica.advance_latest(step)
        self.replica.remove([journal_name(step)])
        seconds = time.perf_counter() - t0
        log.debug(
            "%s: step %d uploaded, %d of %d bytes sent (%d files resumed) in %.2fs",
            self.replica.url, step, sent, total, resumed, seconds,
        )  # fmt: skip
        return UploadResult(step, sent, total, len(files), seconds, resumed, pacer.yielded_s)

    def _published(self, step: int, stats: list[tuple[Path, os.stat_result]]) -> bool | None:
        """Whether this very checkpoint is already published: None when the step has no
        manifest; True when its manifest lists exactly these local files, sizes and
        sha256 (the local files are read, not the remote ones) and the destination
        has them at those sizes; False otherwise (a damaged manifest, or another save
        of the same step, e.g. by a job that was rolled back and saved it again)."""
        if manifest_name(step) not in self.replica.listing():
            return None
        try:
            manifest = self.replica.manifest(step)
            self.replica.check_sizes(manifest)
        except TierError:
            return False
        listed = {f.name: f for f in manifest.files}
        if set(listed) != {p.name for p, _ in stats}:
            return False
        for path, st in stats:
            if listed[path.name].size != st.st_size or listed[path.name].sha256 != _sha256(path):
                return False
        return True

    def _read_journal(self, step: int) -> dict[str, dict[str, Any]]:
        raw = self.replica.read_small(journal_name(step))
        if raw is None:
            return {}
        try:
            doc = json.loads(raw)
            return {str(k): dict(v) for k, v in doc.items()}
        except (ValueError, TypeError, AttributeError):
            log.warning("%s: unreadable upload journal, sending every file", self.replica.url)
            return {}

    def _send(self, path: Path, pacer: Pacer) -> tuple[str, int]:
        """Copy one file; returns (sha256 of its content, bytes sent this time)."""
        # FileNotFoundError passes through: the checkpoint vanished
        rep = self.replica
        with open(path, "rb") as src:
            if rep.local:
                return self._send_local(path.name, src, pacer)
            h = hashlib.sha256()
            sent = 0
            final = rep.path_of(path.name)
            target = final if rep.object_store else rep.path_of(part_name(path.name))
            with rep.errors(f"writing {path.name}"):
                dst = rep.fs.open(target, "wb", block_size=OBJECT_BLOCK)
                try:
                    while chunk := pacer.read(src):
                        h.update(chunk)
                        dst.write(chunk)
                        sent += len(chunk)
                        pacer.sent(len(chunk))
                except BaseException:
                    # never complete a partial object under its final key
                    with contextlib.suppress(Exception):
                        dst.discard()
                    dst.closed = True
                    raise
                dst.close()
                if not rep.object_store:
                    rep.fs.mv(target, final)
            return h.hexdigest(), sent

    def _send_local(self, name: str, src: IO[bytes], pacer: Pacer) -> tuple[str, int]:
        """Mounted path: write a hidden partial file, keep its valid prefix on resume."""
        tmp = Path(self.replica.path_of(part_name(name)))
        h = hashlib.sha256()
        with self.replica.errors(f"writing {name}"):
            kept = _matching_prefix(tmp, src, h) if tmp.exists() else 0
            if kept:
                url = self.replica.url
                log.info("%s: resuming %s after %d bytes already there", url, name, kept)
            src.seek(kept)
            sent = 0
            with open(tmp, "r+b" if kept else "wb") as dst:
                dst.seek(kept)
                dst.truncate()
                while chunk := pacer.read(src):
                    h.update(chunk)
                    dst.write(chunk)
                    sent += len(chunk)
                    pacer.sent(len(chunk))
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, self.replica.path_of(name))
            fsync_dir(self.replica.root)
        return h.hexdigest(), sent


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _matching_prefix(tmp: Path, src: IO[bytes], h: Any) -> int:
    """Length of the prefix of ``tmp`` that equals ``src`` (whole chunks), hashing it."""
    kept = 0
    with open(tmp, "rb") as part:
        while True:
            theirs = part.read(CHUNK)
            ours = src.read(CHUNK)
            if not theirs or len(theirs) != len(ours) or theirs != ours:
                break
            h.update(ours)
            kept += len(ours)
    return kept
