"""Restore anywhere: fill an empty checkpoint directory from a durable destination.

A job restarted on a new host finds its local staging directory empty, while the
daemon of its old host has replicated its checkpoints to a durable destination (a
mounted path standing for NFS, ``s3://`` ...; see docs/tiers.md). With
``restore_from=URL`` (or ``ADAPTD_RESTORE_FROM``) the hook pulls the newest
*verified* checkpoint from there into the local directory before restoring as usual,
so the job continues where it left off, bit-exact.

The rules, and why:

* Only an empty directory pulls: one with no ``checkpoint`` state file and no
  ``ckpt-*`` file. A directory that has checkpoints is this host's own, newer or not;
  it is never overwritten from elsewhere.
* Ranks of one job on one host that share a directory pull once: the pull holds an
  advisory lock (``.adaptd-pull.lock`` in the directory), and whoever takes it second
  finds the directory filled and restores from it.
* A destination that is empty, unreachable, or holds nothing that verifies is not
  fatal: the job starts fresh with a warning naming the URL and the reason (the
  replicator never moves a destination's ``LATEST`` back, so a fresh start does not
  hide the older checkpoints there). A URL that cannot work at all (unknown protocol,
  ``s3://`` without s3fs) is refused when the hook is constructed.

This module never imports TensorFlow; ``fsspec`` and ``adaptd.tiers`` are imported
only when a pull is configured.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from types import MappingProxyType
from typing import Any

__all__ = [
    "ENV",
    "LOCK_NAME",
    "Pull",
    "Source",
    "has_checkpoint",
    "pull_if_empty",
    "source",
]

log = logging.getLogger("adaptd.client")

#: Environment variable naming the destination when ``restore_from`` is not given.
ENV = "ADAPTD_RESTORE_FROM"
#: The lock file that serialises pulls into one directory.
LOCK_NAME = ".adaptd-pull.lock"


@dataclass(frozen=True)
class Pull:
    """What :func:`pull_if_empty` did.

    ``step`` is the checkpoint pulled, or None when nothing was (``reason`` says why:
    the directory already had checkpoints, the destination had none, or could not be
    read).
    """

    url: str
    step: int | None
    reason: str
    bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Source:
    """A durable destination a job restores from: ``url`` (the job's folder there) and
    the fsspec ``storage_options`` to read it with (a read-only copy)."""

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(
        cls,
        restore_from: str | None,
        job: str,
        storage_options: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Source | None:
        """The destination :func:`source` names (None: none), with its options.

        Raises ValueError as :func:`source` does."""
        url = source(restore_from, job, environ)
        if url is None:
            return None
        return cls(url, MappingProxyType(dict(storage_options or {})))


def source(
    restore_from: str | None, job: str, environ: Mapping[str, str] | None = None
) -> str | None:
    """The URL to restore from: ``restore_from``, else ``$ADAPTD_RESTORE_FROM``, else None.

    ``{job}`` in the URL is replaced by the job id, so one setting serves every job
    (``s3://bucket/ckpts/{job}``: the daemon keeps each job in ``<destination>/<job>``).
    An empty environment variable counts as unset.

    Raises:
        ValueError: ``restore_from`` is not a non-empty string, or the URL's protocol is
            unknown or its filesystem is not installed (the message says what to do).
    """
    env = os.environ if environ is None else environ
    where = "restore_from"
    if restore_from is None:
        restore_from = env.get(ENV) or None
        where = ENV
        if restore_from is None:
            return None
    if not isinstance(restore_from, str) or not restore_from.strip():
        raise ValueError(
            f"{where} must be a non-empty URL or path (e.g. 's3://bucket/ckpts/{{job}}' "
            f"or '/mnt/nfs/ckpts/{{job}}'), got {restore_from!r}"
        )
    url = restore_from.strip().replace("{job}", job)
    _check_protocol(url, where)
    return url


def _check_protocol(url: str, where: str) -> None:
    """Refuse a URL no filesystem can open now, instead of at the pull on a new host
    (:func:`adaptd.tiers.urls.check` says which destinations are accepted)."""
    from adaptd.tiers.urls import UrlError, check

    try:
        check(url, relative=True)
    except UrlError as exc:
        raise ValueError(f"{where}={exc}") from None


def has_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` holds a checkpoint state file or any ``ckpt-*`` file.

    Leftovers of interrupted writes are not counted (the hook removes them first);
    files that are not checkpoints (logs, the pull lock) are not either.
    """
    root = Path(directory)
    if not root.is_dir():
        return False
    if (root / "checkpoint").exists():
        return True
    return any(entry.name.startswith("ckpt-") for entry in root.iterdir())


@contextlib.contextmanager
def _pull_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the directory's pull lock (blocks until free)."""
    with open(directory / LOCK_NAME, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def pull_if_empty(
    directory: str | os.PathLike[str],
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> Pull:
    """Fetch the newest verified checkpoint at ``url`` into ``directory`` if it has none.

    The fetch itself is :func:`adaptd.tiers.restore.restore`: files land under temporary
    names and are renamed when complete, and TensorFlow's ``checkpoint`` state file is
    written last, so a pull killed half-way leaves nothing the hook would restore from.
    Failures to read the destination are logged as warnings and returned as a Pull
    with ``step=None``; they are not raised, so a job whose destination is down starts
    fresh instead of not starting.
    """
    from adaptd.tiers.replica import TierError, is_storage_error
    from adaptd.tiers.restore import restore

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    with _pull_lock(root):
        if has_checkpoint(root):
            reason = f"{root} already has checkpoints: restoring from it, not from {url}"
            log.info("%s", reason)
            return Pull(url, None, reason)
        t0 = perf_counter()
        try:
            result = restore(url, root, storage_options=dict(storage_options or {}))
        except TierError as exc:
            return _fresh(url, root, f"{exc}")
        except OSError as exc:  # unreachable, refused, permission: the filesystem's word
            return _fresh(url, root, f"could not read it ({type(exc).__name__}: {exc})")
        except Exception as exc:  # s3/network clients raise their own types
            if not is_storage_error(exc):
                raise
            return _fresh(url, root, f"could not read it ({type(exc).__name__}: {exc})")
        seconds = perf_counter() - t0
    log.info(
        "pulled step %d from %s into %s: %.2f MB in %.2fs",
        result.step,
        url,
        root,
        result.bytes / 1e6,
        seconds,
    )
    return Pull(url, result.step, "pulled", result.bytes, seconds)


def _fresh(url: str, root: Path, why: str) -> Pull:
    reason = f"nothing restored from {url}: {why}; {root} is empty, so the job starts fresh"
    log.warning("%s", reason)
    return Pull(url, None, reason)
