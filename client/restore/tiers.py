"""A restart in place: restore from the job's local tier when it holds the newest step.

With two tiers (docs/tiers.md) the newest save of a run is usually in its local tier
(host memory or local disk), and only every k-th in the durable directory. A run
restarted on the same host (its process died, the host did not) finds the local
copies of the previous run there; :func:`restore_local` restores the newest of them
whose step is at least the durable directory's newest, after the same quick check and
CRC-checked read as a durable one (:func:`adaptd.client.restore.intact.try_restore`).
A local copy that is damaged or incomplete is logged with the reason and the next is
tried; it is removed once the run restored (:func:`remove`: the local tier is a cache
of the run, not a record; TensorFlow may still read a failed checkpoint's position
while the next one restores, so not before); when none
serves, the run restores from durable storage as with one tier
(:func:`adaptd.client.restore.resume.restore_alone`). A host that lost its local
tier (a reboot cleared ``/dev/shm``, or the run is on another host) has nothing here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from adaptd.checkpoints import rank_parts
from adaptd.client.restore import intact, verify
from adaptd.client.save import files
from adaptd.client.save.local_tier import copies

__all__ = ["LocalRestore", "newest_step", "remove", "restore_local"]

log = logging.getLogger("adaptd.client")


@dataclass(frozen=True)
class LocalRestore:
    """What :func:`restore_local` found: the copy restored (None: none served), the
    copies that did not serve (newest first), and whether the local tier held any copy
    of a previous run at all (``intact``: a restart in place, not a new host)."""

    restored: str | None
    skipped: tuple[intact.Damaged, ...] = ()
    intact: bool = False
    damaged: tuple[Path, ...] = ()  # the skipped copies' prefixes


def remove(found: LocalRestore) -> None:
    """Remove the local copies ``found`` skipped as damaged (after the restore)."""
    for prefix in found.damaged:
        files.remove_checkpoint(str(prefix))


def newest_step(directory: Path) -> int | None:
    """The newest numbered checkpoint of ``directory`` a resume may use (None: none)."""
    for prefix in verify.candidates(directory):
        step = rank_parts.step_of(f"{prefix.name}.index")
        if step is not None:
            return step
    return None


def restore_local(
    directories: Iterable[Path], durable: Path, restore: Callable[[str], None]
) -> LocalRestore:
    """Restore, with ``restore(prefix)``, the newest copy in the local tier's
    ``directories`` whose step is at least the newest of the ``durable`` directory
    (the local one is preferred at the same step: it is the faster read)."""
    floor = newest_step(durable)
    found: list[tuple[int, Path]] = []
    for d in directories:
        files.remove_orphans(d)
        found.extend(copies(d))
    held = bool(found)
    skipped: list[intact.Damaged] = []
    bad: list[Path] = []
    for step, prefix in sorted(found, reverse=True):
        if floor is not None and step < floor:
            break
        damaged = intact.try_restore(prefix, restore)
        if damaged is None:
            return LocalRestore(str(prefix), tuple(skipped), held, tuple(bad))
        skipped.append(damaged)
        bad.append(prefix)
        log.warning("not resuming from the local tier's %s: %s", prefix, damaged.why)
    return LocalRestore(None, tuple(skipped), held, tuple(bad))
