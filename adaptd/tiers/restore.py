"""Restore anywhere: fetch the newest verified checkpoint of a destination into a directory.

Used by ``adaptd restore`` and by the training hook's pull on a new host
(``adaptd.client.restore.remote``). The rules, and why:

* The newest step whose files all match its manifest (size and sha256) wins. A newer
  step that does not verify (a truncated or corrupted object, a missing file, a bad
  manifest) is skipped, with the reason, for the next older one: the job loses a
  little more work instead of not starting. An explicit ``step`` has no fallback.
* Each file is streamed into a hidden temporary name in the directory and hashed on
  the way; only when every file of the step verified are they renamed into place,
  and TensorFlow's ``checkpoint`` state file is written last. A restore killed half
  way leaves nothing TensorFlow (or the hook) would restore from; its hidden
  ``.ckpt-*.restore`` files are removed by the next restore into the directory.

This module never imports TensorFlow: the state file is TensorFlow's small text
format, written here directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptd.checkpoints.files import STATE_FILE, state_file_text
from adaptd.tiers.layout import Manifest, TierError, fsync_dir
from adaptd.tiers.replica import Replica

__all__ = [
    "RestoreResult",
    "restore",
]

log = logging.getLogger("adaptd.tiers")


@dataclass(frozen=True)
class RestoreResult:
    """What :func:`restore` fetched: ``step``, its ``bytes`` in ``files`` files, how long
    it took, and each newer step it ``skipped`` with the reason."""

    step: int
    bytes: int
    files: int
    seconds: float
    skipped: tuple[tuple[int, str], ...] = ()


def restore(
    url: str,
    directory: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    step: int | None = None,
    progress: Callable[[int], None] | None = None,
    on_step: Callable[[Manifest], None] | None = None,
) -> RestoreResult:
    """Fetch the newest verified step at ``url`` (or ``step``) into ``directory``.

    ``progress(n)`` after each chunk fetched; ``on_step(manifest)`` when a step's
    fetch begins (again for an older step after a newer one failed), so a caller can
    show a total. Files already in ``directory`` with the step's names are replaced;
    the state file is rewritten to name only the restored step.

    Raises:
        TierError: the destination holds no checkpoint, ``step`` is not there or does
            not verify, or no step verifies (every reason is in the message), or it
            could not be read.
    """
    t0 = time.perf_counter()
    replica = Replica(url, storage_options=storage_options)
    steps = replica.steps()
    if not steps:
        raise TierError(
            f"{replica.url}: no checkpoint there (no ckpt-<step>.manifest.json); "
            "check the URL (a job's folder: <destination>/<job>) and that replication ran"
        )
    if step is not None and step not in steps:
        raise TierError(f"{replica.url}: no step {step} there; it has steps {_span(steps)}")
    candidates = [step] if step is not None else sorted(steps, reverse=True)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".*.restore"):  # of a restore killed half-way
        if leftover.name.startswith((".ckpt-", f".{STATE_FILE}.")) and leftover.is_file():
            leftover.unlink()
    skipped: list[tuple[int, str]] = []
    for s in candidates:
        try:
            manifest = replica.manifest(s)
            replica.check_sizes(manifest)  # cheap: a truncated object fails before any fetch
            if on_step is not None:
                on_step(manifest)
            _fetch(replica, manifest, root, progress)
        except TierError as exc:
            if step is None:
                log.warning("%s; trying an older step", exc)
            skipped.append((s, str(exc)))
            continue
        _write_state(root, s)
        return RestoreResult(
            s, manifest.bytes, len(manifest.files), time.perf_counter() - t0, tuple(skipped)
        )
    if step is not None:
        raise TierError(skipped[0][1])
    reasons = "; ".join(f"step {s}: {why}" for s, why in skipped)
    raise TierError(f"{replica.url}: no checkpoint verifies ({reasons})")


def _span(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]} .. {steps[-1]}"


def _fetch(
    replica: Replica, manifest: Manifest, root: Path, progress: Callable[[int], None] | None
) -> None:
    """Fetch and verify every file under a temporary name; rename them all at the end."""
    temps: list[tuple[Path, Path]] = []
    try:
        for entry in manifest.files:
            tmp = root / f".{entry.name}.restore"
            temps.append((tmp, root / entry.name))
            with open(tmp, "wb") as out:
                replica.read_verified(entry, out, step=manifest.step, progress=progress)
                out.flush()
                os.fsync(out.fileno())
    except BaseException:
        for tmp, _ in temps:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    # data shards before the index, as the manifest lists them
    for tmp, final in temps:
        os.replace(tmp, final)
    fsync_dir(str(root))


def _write_state(root: Path, step: int) -> None:
    """TensorFlow's ``checkpoint`` state file naming ``ckpt-<step>``, replaced atomically."""
    text = state_file_text(step)
    tmp = root / f".{STATE_FILE}.restore"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / STATE_FILE)
    fsync_dir(str(root))
