"""What ``adaptd verify`` says of an Orbax checkpoint directory.

adaptd does not read Orbax's formats (OCDBT/Zarr through TensorStore): a restore with
Orbax is the check of the arrays. What it checks is what Orbax *commits*: a step
directory under its final name (Orbax renames ``<step>.orbax-checkpoint-tmp-<time>``
to ``<step>`` once every process is done) holding Orbax's checkpoint metadata and
an item; a write that was never committed is named.
Imports no framework.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adaptd.checkpoints.orbax import (
    METADATA_FILE,
    TMP_MARK,
    finalized_steps,
    holds_orbax,
    step_bytes,
)

__all__ = ["OrbaxReport", "is_orbax", "verify"]


@dataclass(frozen=True)
class OrbaxReport:
    """The outcome of :func:`verify`; ``ok`` when ``problems`` is empty."""

    path: str
    step: int | None  # the step checked (the newest finalized one of a directory)
    steps: tuple[int, ...] = ()  # every finalized step of the directory
    uncommitted: tuple[str, ...] = ()  # step writes never committed (their names)
    data_bytes: int = 0
    files: int = 0
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(
        default=("adaptd does not read Orbax's array format: restore the step with Orbax "
                 "(CheckpointManager.restore) to check its arrays",)
    )  # fmt: skip

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        out["format"] = "orbax"
        return out


def _is_step_dir(path: Path) -> bool:
    return (path / METADATA_FILE).exists()


def is_orbax(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an Orbax step directory or a directory of them (finalized or
    being written)."""
    p = Path(path)
    if not p.is_dir():
        return False
    return _is_step_dir(p) or holds_orbax(p)


def verify(path: str | os.PathLike[str]) -> OrbaxReport:
    """Check the step ``path`` is (a step directory), or the newest finalized step of
    the manager directory ``path``; never raises for a bad or missing checkpoint."""
    p = Path(path)
    if _is_step_dir(p) and TMP_MARK not in p.name:
        return _step(str(path), p, None, (), ())
    if TMP_MARK in p.name:
        return OrbaxReport(str(path), None, problems=(
            f"{p.name} is a step Orbax was still writing: it was never committed",))  # fmt: skip
    steps = finalized_steps(p)
    uncommitted = tuple(sorted(e.name for e in os.scandir(p) if TMP_MARK in e.name))
    if not steps:
        what = f"; {len(uncommitted)} write(s) never committed" if uncommitted else ""
        return OrbaxReport(str(path), None, uncommitted=uncommitted,
                           problems=(f"no finalized Orbax step in {p}{what}",))  # fmt: skip
    newest = max(steps)
    return _step(str(path), steps[newest], newest, tuple(sorted(steps)), uncommitted)


def _step(
    path: str, step_dir: Path, step: int | None, steps: tuple[int, ...], uncommitted: tuple
) -> OrbaxReport:
    problems = []
    if step is None:
        digits = "".join(c for c in step_dir.name.rsplit("_", 1)[-1] if c.isdigit())
        step = int(digits) if digits else None
    files = sum(len(f) for _r, _d, f in os.walk(step_dir))
    if files <= 1:
        problems.append(f"{step_dir} holds no item: only Orbax's metadata file is there")
    return OrbaxReport(
        path, step, steps, uncommitted, data_bytes=step_bytes(step_dir), files=files,
        problems=tuple(problems),
    )  # fmt: skip
