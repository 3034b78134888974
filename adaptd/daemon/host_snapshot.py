"""The snapshot every decision of ``adaptd serve`` is made on: the host as sampled, plus
what only the daemon knows.

:class:`HostSnapshot` is the daemon's snapshot source under ``adaptd serve``. It takes
the telemetry sampler's newest snapshot and fills in, per storage target, the jobs
writing a save now (only the daemon knows those: the ranks report them) and the
configured ``[storage."NAME"] max_concurrent_saves`` (:func:`storage_limits`), then
lets the fleet add its view; the result is rebuilt only when one of those changed.
Its :meth:`HostSnapshot.sample` is the daemon's first tick hook: the sampler is told
which directories and processes are the jobs' (from the job table, read-only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptd.config.loader import StorageTarget
from adaptd.core.snapshot import Snapshot, StorageSample
from adaptd.daemon.jobs.table import RegistryView

if TYPE_CHECKING:
    from adaptd.fleet.part import FleetPart
    from adaptd.telemetry.sampler import Sampler

__all__ = ["HostSnapshot", "storage_limits"]


def storage_limits(
    samples: Iterable[StorageSample], targets: Iterable[StorageTarget]
) -> dict[str, int]:
    """``[storage."NAME"] max_concurrent_saves`` by sampled storage target id.

    A configured path belongs to the sampled target whose mount point is the longest
    one containing it (the mount the path lives on); several configured paths on one
    mount give it the smallest of their limits. Paths on no sampled target (no job
    saves there yet) give nothing.
    """
    samples = tuple(samples)
    out: dict[str, int] = {}
    for t in targets:
        if t.max_concurrent_saves is None:
            continue
        on = [s for s in samples if t.path.is_relative_to(s.mountpoint)]
        if not on:
            continue
        st = max(on, key=lambda s: len(Path(s.mountpoint).parts))
        out[st.target] = min(out.get(st.target, t.max_concurrent_saves), t.max_concurrent_saves)
    return out


class HostSnapshot:
    """The daemon's snapshot source and sampling tick (see the module docstring)."""

    def __init__(
        self,
        *,
        sampler: Sampler,
        jobs: RegistryView,
        storage: Iterable[StorageTarget],
        fleet: FleetPart | None = None,
    ) -> None:
        self.sampler = sampler
        self.jobs = jobs
        self.storage = tuple(storage)
        self.fleet = fleet
        self._view: tuple[tuple[Any, ...], Snapshot] | None = None

    def sample(self, now: float) -> None:
        """The daemon's first tick hook: sample the telemetry (when due) for the jobs the
        registry knows, their checkpoint directories and processes."""
        self.sampler.tick(now, jobs=self.jobs.processes)

    def __call__(self) -> Snapshot:
        """The sampler's newest snapshot with each storage target's ``writing_jobs``
        and ``max_writers``, decorated by the fleet (see the module docstring)."""
        snap = self.sampler.latest()
        writing = self.jobs.writing()
        key = (id(snap), writing, self.fleet.view_key() if self.fleet is not None else None)
        view = self._view
        if view is not None and view[0] == key:
            return view[1]
        limits = storage_limits(snap.storage, self.storage)
        if (writing or limits) and snap.storage:
            storage = tuple(
                dataclasses.replace(
                    st,
                    writing_jobs=tuple(j for j in st.jobs if j in writing),
                    max_writers=limits.get(st.target, st.max_writers),
                )
                for st in snap.storage
            )
            out = dataclasses.replace(snap, storage=storage)
        else:
            out = snap
        if self.fleet is not None:
            out = self.fleet.decorate(out, limits)
        self._view = (key, out)
        return out
