"""Copying one local checkpoint to a job's folder at a destination, resumably.

:class:`Upload` is :meth:`adaptd.tiers.replica.Replica.upload`'s write path: it
streams each file in chunks (sha256 on the way), data shards first and the index
last, paced by a :class:`~adaptd.tiers.throttle.Pacer`, records each finished file
in the upload's journal, then writes the manifest and advances ``LATEST``. An
interrupted upload of the same step resumes from the journal (and, on a mounted
path, from the matching prefix of the partial file); a step already published
with these very files is not sent again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from adaptd.tiers.folder import OBJECT_BLOCK, Folder
from adaptd.tiers.layout import (
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
)
from adaptd.tiers.throttle import CHUNK, Pacer, Throttle

__all__ = ["Upload", "UploadResult"]

log = logging.getLogger("adaptd.tiers")


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


class Upload:
    """One upload to the folder ``replica``: paced by ``throttle``, pausing while
    ``should_yield()`` (polled every ``yield_poll_s``, at most ``max_yield_s`` at a
    time), ``progress(n)`` after each chunk sent."""

    def __init__(
        self,
        replica: Folder,
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
        :meth:`adaptd.tiers.replica.Replica.upload`). Raises :class:`ValueError` for a
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
