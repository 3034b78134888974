"""A read-only view of the daemon's job table, for the parts that only look.

The telemetry sampler (which directories and processes belong to which job), the
service's snapshot (which jobs are writing a save), its status line and the
learned parameters it persists all read the registry's own records (its
:class:`~adaptd.daemon.jobs.table.JobTable`) through this view instead of rebuilding a
copy of them from events. Nothing here changes them, and nothing here does I/O. The
view reads a table, not a registry, so it can be made before the daemon is assembled
and handed to the parts built with it.

The table is changed only in the daemon's loop, so the view must be read there
too: the sinks, tick hooks and the snapshot source all run in that loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from adaptd.daemon.jobs.table import JobTable

__all__ = ["RegistryView"]


class RegistryView:
    """What the registry knows, read-only."""

    def __init__(self, table: JobTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, job: object) -> bool:
        return job in self._table.jobs

    @property
    def active(self) -> int:
        """Jobs whose ranks are serving."""
        return self._table.by_state["active"]

    @property
    def lost(self) -> int:
        """Jobs whose ranks all vanished without a goodbye (they may resume)."""
        return self._table.by_state["lost"]

    def writing(self) -> frozenset[str]:
        """Active jobs with a save in flight."""
        return frozenset(self._table.writing)

    def step_time_s(self, job: str) -> float | None:
        """The job's recent mean step time (``None``: unknown job, or not measured)."""
        j = self._table.jobs.get(job)
        return j.tracker.step_time_s if j is not None else None

    def processes(self) -> Mapping[str, tuple[str, tuple[int, ...]]]:
        """Each active job's checkpoint directory and its ranks' pids (those known),
        for the telemetry: whose GPUs and whose disks are whose."""
        return {
            job.id: (job.checkpoint_dir, tuple(r.pid for r in job.ranks.values() if r.pid > 0))
            for job in self._table
            if job.state == "active"
        }

    def learned(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(job, what its tracker learned)`` for every known job: what a restart of
        the daemon must not lose."""
        for j in self._table:
            yield j.id, j.tracker.learned()

    def learned_of(self, job: str) -> dict[str, Any] | None:
        """What one job's tracker learned (``None``: unknown job)."""
        j = self._table.jobs.get(job)
        return j.tracker.learned() if j is not None else None
