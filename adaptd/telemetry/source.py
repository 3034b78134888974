"""A telemetry source, and the registry the sampler iterates.

One extension point, one method, in the manner of prometheus_client's
``CollectorRegistry.register``: anything with :meth:`Source.collect` plugs in, the
built-in sources (NVML's GPUs, the storage targets, the host) included. A source gets
the snapshot the sources before it filled and what it may need to know of this
sample (:class:`Sampling`: the time, the daemon's jobs, whether the host drains), and
returns the snapshot with its own figures added: a built-in one in its field of the
snapshot, any other as a :class:`~adaptd.core.snapshot.Reading` under its name
(:meth:`Snapshot.with_reading <adaptd.core.snapshot.Snapshot.with_reading>`). What a
source returns is what policies read, what ``adaptd status`` shows
(:mod:`adaptd.telemetry.report`) and what the metrics render.

A new source is one module and a registration line: ``Sampler(sources={"name":
Source()})``, or a ``register`` line in :meth:`adaptd.telemetry.sampler.Sampler.default`
for the daemon's own. A source that raises is counted and logged once by the sampler
(it leaves its part of the snapshot as it was); the others go on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from adaptd.core.snapshot import Snapshot

__all__ = ["JobInfo", "Sampling", "Source", "Sources"]


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the sources need to know about a job: where it saves, its processes."""

    checkpoint_dir: str = ""
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Sampling:
    """What a source may need besides the snapshot: ``now`` (monotonic seconds, the
    snapshot's time), the jobs the daemon knows, and whether the host is draining."""

    now: float
    jobs: Mapping[str, JobInfo]
    draining: bool = False


@runtime_checkable
class Source(Protocol):
    """A source of telemetry figures."""

    def collect(self, snapshot: Snapshot, sampling: Sampling) -> Snapshot:
        """``snapshot`` with this source's figures added; raise when they cannot be read
        (the sampler counts it and goes on without them)."""
        ...


class Sources:
    """The registered sources, by name, in the order they fill a snapshot.

    The name counts a source's failures (``Sampler.failures``) and names its
    :class:`~adaptd.core.snapshot.Reading`.
    """

    def __init__(self) -> None:
        self._sources: dict[str, Source] = {}

    def register(self, name: str, source: Source) -> Source:
        """Add ``source`` under ``name`` (after those registered before it); returns it.
        Raises :class:`ValueError` for a name already taken or empty, and
        :class:`TypeError` for an object without ``collect``."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a telemetry source's name must be an identifier, got {name!r}")
        if name in self._sources:
            raise ValueError(f"a telemetry source is registered as {name!r} already")
        if not isinstance(source, Source):
            raise TypeError(
                f"telemetry source {name!r}: {type(source).__name__} has no "
                "collect(snapshot, sampling) method"
            )
        self._sources[name] = source
        return source

    def unregister(self, name: str) -> Source:
        """Remove the source registered as ``name`` and return it; :class:`KeyError` if none."""
        return self._sources.pop(name)

    def get(self, name: str) -> Source | None:
        return self._sources.get(name)

    def __iter__(self) -> Iterator[tuple[str, Source]]:
        return iter(list(self._sources.items()))

    def __len__(self) -> int:
        return len(self._sources)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._sources)
