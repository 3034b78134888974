"""A read-only view of the daemon's registry, for the parts that only look.

The telemetry sampler (which directories and processes belong to which job), the
service's snapshot (which jobs are writing a save), its status line and the
learned parameters it persists all read the registry's own records through this
view instead of rebuilding a copy of them from events. Nothing here changes the
registry, and nothing here does I/O.

The registry is changed only in the daemon's loop, so the view must be read there
too: the sinks, tick hooks and the snapshot source all run in that loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from adaptd.daemon.jobs.registry import Registry

__all__ = ["RegistryView"]


class RegistryView:
    """What the registry knows, read-only."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __len__(self) -> int:
        return len(self._registry)

    def __contains__(self, job: object) -> bool:
        return job in self._registry.jobs

    @property
    def active(self) -> int:
        """Jobs whose ranks are serving."""
        return self._registry.by_state["active"]

    @property
    def lost(self) -> int:
        """Jobs whose ranks all vanished without a goodbye (they may resume)."""
        return self._registry.by_state["lost"]

    def writing(self) -> frozenset[str]:
        """Active jobs with a save in flight."""
        return frozenset(self._registry.writing)

    def step_time_s(self, job: str) -> float | None:
        """The job's recent mean step time (``None``: unknown job, or not measured)."""
        j = self._registry.jobs.get(job)
        return j.tracker.step_time_s if j is not None else None

    def processes(self) -> Mapping[str, tuple[str, tuple[int, ...]]]:
        """Each active job's checkpoint directory and its ranks' pids (those known),
        for the telemetry: whose GPUs and whose disks are whose."""
        return {
            job.id: (job.checkpoint_dir, tuple(r.pid for r in job.ranks.values() if r.pid > 0))
            for job in self._registry
            if job.state == "active"
        }

    def learned(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(job, what its tracker learned)`` for every known job: what a restart of
        the daemon must not lose."""
        for j in self._registry:
            yield j.id, j.tracker.learned()

    def learned_of(self, job: str) -> dict[str, Any] | None:
        """What one job's tracker learned (``None``: unknown job)."""
        j = self._registry.jobs.get(job)
        return j.tracker.learned() if j is not None else None
