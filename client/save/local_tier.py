"""The job's local tier: a cheap save often, beside the durable directory (docs/tiers.md).

With two tiers the plan's ``durable_every`` = k says which saves are made durable
(:meth:`~adaptd.core.snapshot.Decision.durable_at`); every other save goes here only:
host memory (a directory on a tmpfs such as ``/dev/shm/adaptd/<job>``) or a local
disk. A restart in place (the process died, the host and this directory did not)
restores the newest step of either tier (:mod:`adaptd.client.restore.tiers`); a host
that is lost takes this tier with it, and the run resumes from durable storage.

:class:`LocalTier` is a :class:`~adaptd.client.save.targets.Target`, with its own
``CheckpointManager`` (so TensorFlow's state file, numbering and save counter are the
same as in the durable directory). It holds a bounded number of copies, and a memory
tier is bounded by :class:`MemoryBudget`: before each save the older copies go while
the new one would not fit beside what is held (the newest copy always stays), and if
it still would not fit, this save and the later ones go to the local-disk ``fallback``
directory instead, with the reason logged. A copy older than a durable save is
superseded and removed (:meth:`LocalTier.superseded`), so a clean end, whose final
save is durable, leaves nothing in memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import tensorflow as tf

from adaptd.checkpoints import rank_parts
from adaptd.checkpoints.files import STATE_FILE, checkpoint_bytes
from adaptd.client.save import files
from adaptd.telemetry.storage import MEMORY_FS, mount_of, parse_mountinfo

__all__ = ["KEEP", "MEMORY_SHARE", "LocalTier", "MemoryBudget", "copies", "tier_kind"]

log = logging.getLogger("adaptd.client")

#: Copies a local tier keeps (the newest one is what a restart in place needs; one
#: more so a copy damaged while being read has an older one beside it).
KEEP = 2
#: Default share of the host's memory (available plus what the tier holds) a memory
#: tier may take.
MEMORY_SHARE = 0.25

_STEP = re.compile(r"^ckpt-(\d+)\.index$")


def tier_kind(directory: str | os.PathLike[str]) -> str:
    """``"memory"`` when ``directory`` (or its nearest existing ancestor) is on a
    tmpfs or ramfs, else ``"disk"``."""
    path = Path(directory).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return "disk"
    m = mount_of(str(path), mounts)
    return "memory" if m is not None and m.fstype in MEMORY_FS else "disk"


def copies(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The checkpoints in ``directory`` by step, oldest first: (step, prefix)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for f in d.iterdir():
        m = _STEP.match(f.name)
        if m:
            found.append((int(m.group(1)), d / f"ckpt-{m.group(1)}"))
    return sorted(found)


def _remove_step(prefix: Path) -> int:
    """Remove the checkpoint ``prefix`` and every rank's part of its step; bytes freed."""
    step = int(prefix.name.rsplit("-", 1)[1])
    freed = checkpoint_bytes(prefix)
    files.remove_checkpoint(str(prefix))
    for f in prefix.parent.glob(f"ckpt-{step}.rank-*"):
        if rank_parts.part_of(f.name):
            with contextlib.suppress(OSError):
                freed += f.stat().st_size
                f.unlink()
    return freed


def _held(directory: Path) -> int:
    return sum(checkpoint_bytes(p) for _, p in copies(directory))


@dataclass(frozen=True)
class MemoryBudget:
    """How much a memory tier may hold: ``share`` of the host's available memory plus
    what the tier already holds (a tmpfs's files are not available memory).
    ``available`` reads the available bytes (psutil's, by default)."""

    share: float = MEMORY_SHARE
    available: Callable[[], int] = field(default=lambda: psutil.virtual_memory().available)

    def __post_init__(self) -> None:
        share = self.share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(
                f"local_tier_memory must be a share of the available memory in (0, 1], "
                f"got {self.share!r}"
            )

    def limit(self, held: int) -> int:
        """Bytes the tier may hold in all, holding ``held`` now."""
        return int(self.share * (self.available() + held))


class LocalTier:
    """The job's local tier directory (a :class:`~adaptd.client.save.targets.Target`).

    Args:
        checkpoint: the state saved (the manager is built on it).
        directory: the tier's directory (created); a tmpfs makes it a memory tier.
        fallback: a local-disk directory the saves go to once a memory tier is full
            (None: a save that does not fit fails, and is reported so).
        budget: the memory bound (used only when ``directory`` is in memory).
        keep: copies kept.
    """

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        directory: Path,
        *,
        fallback: Path | None = None,
        budget: MemoryBudget | None = None,
        keep: int = KEEP,
    ) -> None:
        self.checkpoint = checkpoint
        self.home = directory
        self.fallback = fallback
        self.budget = budget or MemoryBudget()
        self.keep = keep
        directory.mkdir(parents=True, exist_ok=True)
        self.kind = tier_kind(directory)  # "memory" or "disk": what this tier is
        self.directory = directory  # where the saves go now (the fallback once full)
        self.manager = self._open(directory)
        #: Why the saves went to the fallback ("" while they go to ``home``).
        self.fell_back = ""
        self.last_bytes = 0
        #: The bytes the daemon lets this memory tier hold (its share of the host's
        #: memory between its jobs; None: not told), beside the tier's own bound.
        self.daemon_budget: int | None = None
        # close() is called by the save watcher's thread and by stop() on the caller's
        # (whichever comes first with no write in flight): one of them tidies
        self._closing = threading.Lock()

    def budgeted(self, nbytes: int | None) -> None:
        """The daemon's budget for this memory tier (a plan's ``memory_budget``): the
        next saves keep within the smaller of it and :attr:`budget`'s bound."""
        if nbytes is None or nbytes == self.daemon_budget or self.kind != "memory":
            return
        self.daemon_budget = nbytes
        log.info("local tier: the daemon budgets this memory tier %.1f MB", nbytes / 1e6)

    def _open(self, directory: Path) -> tf.train.CheckpointManager:
        return tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=self.keep)

    @property
    def directories(self) -> tuple[Path, ...]:
        """Every directory this tier may hold copies in (a restore reads them all)."""
        return (self.home,) if self.fallback is None else (self.home, self.fallback)

    def prefix(self, step: int) -> str:
        return os.path.join(str(self.directory), f"ckpt-{step}")

    def write(
        self, checkpoint: tf.train.Checkpoint, step: int, options: tf.train.CheckpointOptions
    ) -> str:
        """Save through the tier's manager, after making room in a memory tier."""
        if self.kind == "memory" and self.directory == self.home:
            self._fit(max(self.last_bytes, 1))
        return self.manager.save(checkpoint_number=step, options=options)

    def _fit(self, expected: int) -> None:
        """Make room for a save of about ``expected`` bytes, or move to the fallback."""
        held_copies = copies(self.home)
        held = _held(self.home)
        own = self.budget.limit(held)
        limit = own if self.daemon_budget is None else min(own, self.daemon_budget)
        while len(held_copies) > 1 and held + expected > limit:
            step, prefix = held_copies.pop(0)
            held -= _remove_step(prefix)
            log.info("local tier: removed the copy of step %d to make room in memory", step)
        if held + expected <= limit:
            return
        whose = (
            f"{self.budget.share:g} of the available memory"
            if limit == own
            else "the daemon's share for it of the host's memory"
        )
        why = (
            f"the memory tier {self.home} would hold {(held + expected) / 1e6:.1f} MB, over its "
            f"budget of {limit / 1e6:.1f} MB ({whose})"
        )
        if self.fallback is None:
            raise MemoryError(f"{why}, and no local disk to fall back to")
        self.fallback.mkdir(parents=True, exist_ok=True)
        self.directory = self.fallback
        self.manager = self._open(self.fallback)
        self.fell_back = why
        log.warning("local tier: %s; saving to local disk at %s from now on", why, self.fallback)

    def ended(self, prefix: str) -> None:
        """A write ended: its size is what the next save is expected to take."""
        size = checkpoint_bytes(prefix)
        if size:
            self.last_bytes = size

    def superseded(self, durable_step: int) -> int:
        """A save at ``durable_step`` is durable: the copies of it and of older steps
        are not needed any more and go; returns the bytes freed."""
        freed = 0
        for directory in self.directories:
            old = [p for s, p in copies(directory) if s <= durable_step]
            for prefix in old:
                freed += _remove_step(prefix)
            if old and not copies(directory):
                with contextlib.suppress(OSError):
                    (directory / STATE_FILE).unlink()
                if directory == self.directory:
                    self.manager = self._open(directory)
        if freed:
            log.info("local tier: freed %.1f MB superseded by durable step %d",
                     freed / 1e6, durable_step)  # fmt: skip
        return freed

    def close(self) -> None:
        """No more saves: remove the tier's directories that hold no copy. Safe to call
        from two threads at once (two racing calls removed a directory under each
        other's listing: FileNotFoundError in a fresh-clone run)."""
        with self._closing:
            for directory in self.directories:
                if directory.is_dir() and not copies(directory):
                    shutil.rmtree(directory, ignore_errors=True)
