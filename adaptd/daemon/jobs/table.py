"""The registry's records and their indexes: which job is which, who is on each connection.

:class:`JobTable` holds the daemon's :class:`~adaptd.daemon.jobs.records.Job` records by
id (in order of activity: the most recently started run last), maps each ZeroMQ peer
identity that said hello to its (job, rank), and keeps the counts that status lines and
metrics read without walking every job: jobs per state, and the active jobs with a save
in flight. It decides nothing: the
:class:`~adaptd.daemon.jobs.registry.Registry` changes it, and the parts that only look
read it (through a :class:`~adaptd.daemon.jobs.view.RegistryView`, or directly in the
daemon's loop).

A table is made before the registry that fills it, so that what reads it (the
service's snapshot, its tick hooks and sinks) can be built first and handed to the
daemon when it is assembled (:mod:`adaptd.daemon.assembly`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from adaptd import events as ev
from adaptd.daemon.jobs.records import Job, JobStateName, Rank

__all__ = ["JobTable"]


class JobTable:
    """Jobs by id, peers by identity, counts by state; changed only by the registry."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        #: jobs per state, kept as states change (status lines and metrics read it)
        self.by_state: Counter[JobStateName] = Counter()
        #: active jobs with a save in flight (each flip is a SaveInFlight event)
        self.writing: set[str] = set()
        #: each connection that said hello: peer identity -> (job id, rank)
        self.peers_map: dict[bytes, tuple[str, int]] = {}

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs.values())

    def __len__(self) -> int:
        return len(self.jobs)

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    # ------------------------------------------------------------------ peers

    @property
    def peers(self) -> int:
        return len(self.peers_map)

    def bind(self, job: Job, rank: Rank) -> None:
        """``rank``'s connection speaks for it from now on."""
        self.peers_map[rank.identity] = (job.id, rank.rank)

    def unbind(self, ranks: list[Rank] | tuple[Rank, ...]) -> None:
        """These ranks' connections no longer speak for anyone."""
        for r in ranks:
            self.peers_map.pop(r.identity, None)

    # ------------------------------------------------------------------ jobs

    def add(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.by_state[job.state] += 1

    def touch(self, job: Job) -> None:
        """``job`` started a new run: it is the most recently active."""
        self.jobs[job.id] = self.jobs.pop(job.id)

    def set_state(self, job: Job, state: JobStateName) -> None:
        self.by_state[job.move(state)] -= 1
        self.by_state[state] += 1

    def note_writing(self, job: Job, now: float, emit: Callable[[ev.Event], None]) -> None:
        """Keep :attr:`writing` (active jobs whose tracker has a save in flight); each flip
        is a :class:`~adaptd.events.SaveInFlight` given to ``emit``."""
        writing = job.state == "active" and job.tracker.save_in_flight
        if writing != (job.id in self.writing):
            (self.writing.add if writing else self.writing.discard)(job.id)
            emit(ev.SaveInFlight(now, job.id, writing))

    def evict(self, keep_inactive: int) -> list[Job]:
        """Forget the oldest inactive jobs beyond ``keep_inactive`` (dict order is activity
        order); returns them, oldest first."""
        inactive = [j for j in self.jobs.values() if j.state != "active"]
        gone = inactive[: max(0, len(inactive) - keep_inactive)]
        for job in gone:
            self.unbind(list(job.ranks.values()))
            del self.jobs[job.id]
            self.by_state[job.state] -= 1
        return gone
