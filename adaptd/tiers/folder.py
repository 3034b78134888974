"""One job's folder at a durable destination, as fsspec sees it: read, verify, write.

A destination is any fsspec URL: a plain path or ``file://`` for a mounted filesystem
(NFS, a second disk), ``s3://bucket/prefix`` through s3fs, others where fsspec has
them. :class:`Folder` is what every user of the folder needs, the writer and the
readers alike: its files by name, each filesystem error turned into a
:class:`~adaptd.tiers.layout.TierError` that names the URL, small files replaced in
one piece (manifest, ``LATEST``, an upload's journal), and the checks a reader makes
before it trusts a step (sizes, then every byte's sha256 against the manifest).
The write path of a whole checkpoint is :mod:`adaptd.tiers.upload`; retention and the
two together are :class:`adaptd.tiers.replica.Replica`.

This module never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from adaptd.tiers import urls
from adaptd.tiers.layout import (
    LATEST,
    MANIFEST_FILE,
    FileEntry,
    Manifest,
    TierError,
    fsync_dir,
    manifest_name,
    part_name,
)
from adaptd.tiers.throttle import CHUNK

__all__ = [
    "OBJECT_BLOCK",
    "STORAGE_PACKAGES",
    "Folder",
    "is_storage_error",
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


class Folder:
    """One job's folder at a durable destination (the layout: :mod:`adaptd.tiers.layout`).

    ``url`` is that folder: a path, ``file://...``, ``s3://bucket/prefix/job``, or
    another fsspec URL; ``storage_options`` go to fsspec (e.g. ``endpoint_url`` for
    an S3-compatible server; credentials normally come from the environment).

    Raises:
        TierError: the URL is empty, its protocol unknown, or its filesystem not
            installed (``s3://`` needs ``pip install 'adaptd[s3]'``).
    """

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
