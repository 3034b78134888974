"""The layout of a job's folder at a destination, and the files of one local checkpoint.

::

    ckpt-<step>.index, ckpt-<step>.data-00000-of-0000N   TF's files, same names as locally
    ckpt-<step>.rank-RRRRR-of-WWWWW.index, .data-...     each rank's own part
                                 (adaptd.checkpoints.rank_parts)
    ckpt-<step>.manifest.json   written last for that step: sizes and sha256 of every file
    LATEST                      {"step": N, ...}: replaced in one piece, never moved back
    .ckpt-<step>.upload.json    an upload's journal (files complete at the destination)
    .<name>.part                a file being written under a hidden name (mounted paths)

:class:`Manifest` is what a reader trusts; :func:`local_files` is what an upload
sends. Shared by :mod:`.replica` (the folder and its write path) and
:mod:`.restore`. A step of a multi-worker job is its replicated part and every rank's
part (:mod:`adaptd.checkpoints.rank_parts`): only a step complete for the job is uploaded, and a
manifest that lists less is refused, so a step is never restored half.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from adaptd.checkpoints import rank_parts

__all__ = [
    "ABANDONED_AFTER_S",
    "JOURNAL_FILE",
    "LATEST",
    "MANIFEST_FILE",
    "MANIFEST_VERSION",
    "PART_FILE",
    "SHA256_HEX",
    "FileEntry",
    "IncompleteStep",
    "Manifest",
    "TierError",
    "fsync_dir",
    "journal_name",
    "local_files",
    "manifest_name",
    "part_name",
    "step_of",
]

MANIFEST_VERSION = 1
LATEST = "LATEST"


#: File names of the folder: a step's manifest, an upload's journal, a partial file.
MANIFEST_FILE = re.compile(r"^ckpt-(\d+)\.manifest\.json$")
JOURNAL_FILE = re.compile(r"^\.ckpt-(\d+)\.upload\.json$")
PART_FILE = re.compile(r"^\.(ckpt-(\d+)\..+)\.part$")
#: A sha256 as the manifest writes it.
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class TierError(Exception):
    """A destination cannot be used: bad URL, unreachable, nothing (or not this) verifies.

    The message names the URL and the file or step at fault, and what to do.
    """


class IncompleteStep(FileNotFoundError):
    """A local step lacks a rank's part (it may still be written): not to be uploaded."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint as the manifest records it."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a step's ``ckpt-<step>.manifest.json`` says: the files a reader may trust."""

    version: int
    job: str
    step: int
    created: float
    bytes: int
    files: tuple[FileEntry, ...]

    def to_json(self) -> bytes:
        doc = {
            "version": self.version,
            "job": self.job,
            "step": self.step,
            "created": self.created,
            "bytes": self.bytes,
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.files],
        }
        return (json.dumps(doc, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes, *, step: int, where: str) -> Manifest:
        """Parse and check a manifest; TierError (naming ``where``) when it is not one.

        File names must be this step's checkpoint files (no paths), so a damaged or
        hostile manifest cannot make a restore write outside its directory.
        """
        try:
            doc = json.loads(raw)
            files = tuple(
                FileEntry(str(f["name"]), int(f["size"]), str(f["sha256"])) for f in doc["files"]
            )
            m = cls(
                int(doc["version"]),
                str(doc["job"]),
                int(doc["step"]),
                float(doc["created"]),
                int(doc["bytes"]),
                files,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise TierError(
                f"{where}: not a valid manifest ({exc}); step {step} is not usable"
            ) from None
        if m.version != MANIFEST_VERSION:
            raise TierError(
                f"{where}: manifest version {m.version}, this adaptd reads {MANIFEST_VERSION}"
            )
        problems = []
        if m.step != step:
            problems.append(f"it is for step {m.step}")
        names = {f.name for f in files}
        if f"ckpt-{step}.index" not in names:
            problems.append("it lists no .index file")
        for f in files:
            if rank_parts.step_of(f.name) != step or f.name.endswith(f".{rank_parts.PENDING}"):
                problems.append(f"{f.name!r} is not a file of ckpt-{step}")
        whole = rank_parts.status(names, step)
        if not problems and not whole.complete:
            problems.append(whole.why)
            if f.size < 0 or not SHA256_HEX.match(f.sha256):
                problems.append(f"{f.name!r} has a bad size or sha256")
        if m.bytes != sum(f.size for f in files):
            problems.append("its bytes do not add up")
        if problems:
            raise TierError(f"{where}: bad manifest: {'; '.join(problems)}")
        return m


def manifest_name(step: int) -> str:
    return f"ckpt-{step}.manifest.json"


def journal_name(step: int) -> str:
    return f".ckpt-{step}.upload.json"


def part_name(name: str) -> str:
    return f".{name}.part"


def local_files(local_dir: str | os.PathLike[str], step: int) -> list[Path]:
    """The files of checkpoint ``ckpt-<step>`` in ``local_dir`` (its replicated part and
    every rank's part): data shards, then the indexes.

    TensorFlow writes an index only once its data shards are merged into place, so an
    existing index means that part is final.

    Raises:
        IncompleteStep: a rank's part of the step is not there (being written, or lost).
        FileNotFoundError: the index or one of the shards it needs is not there (not
            written yet, or deleted by the CheckpointManager's ``max_to_keep``).
    """
    root = Path(local_dir)
    index = root / f"ckpt-{step}.index"
    if not index.is_file():
        raise FileNotFoundError(
            f"{index}: no such checkpoint index (not finalised by TensorFlow yet, or deleted)"
        )
    names = rank_parts.listing(root)
    whole = rank_parts.status(names, step)
    if not whole.replicated:
        data = sorted(n for n in names if n.startswith(f"ckpt-{step}.data-"))
        raise FileNotFoundError(
            f"{root}: ckpt-{step} has an index but an incomplete set of data shards "
            f"({data}); it is being deleted or was damaged"
        )
    if not whole.complete:
        raise IncompleteStep(f"{root}: {whole.why}")
    return [root / name for name in rank_parts.files_of(names, step)]


#: A step older than LATEST whose files have no manifest and were not written for this
#: long is an upload that will never finish (its local checkpoint is gone).
ABANDONED_AFTER_S = 3600.0


def step_of(name: str) -> int | None:
    """The step a file of the folder belongs to (checkpoint file, a rank's part, manifest,
    journal or partial file), or ``None``."""
    if (step := rank_parts.step_of(name)) is not None:
        return step
    for pattern in (MANIFEST_FILE, JOURNAL_FILE):
        if m := pattern.match(name):
            return int(m.group(1))
    if m := PART_FILE.match(name):
        return int(m.group(2))
    return None


def fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (POSIX: fsync the directory)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
