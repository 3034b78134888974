"""The daemon's jobs and ranks: each hello and report recorded where it belongs.

Jobs are keyed by job id, ranks by rank number within a job; each ZeroMQ peer
identity that said hello maps to exactly one (job, rank) (the
:class:`~adaptd.daemon.jobs.table.JobTable`). Every job has one
:class:`~adaptd.core.estimators.JobTracker` fed from its ranks' reports: the step is
the newest step of any rank, step times come from the lead rank (the lowest
live rank, normally 0) so a job of N ranks is not counted N times, and each
saved step counts once whichever rank reports it first.

:class:`Registry` understands each hello (a new job, a rank joining, a reconnect, the
resume of a lost job or the restart of a finished one), refuses one that would take
another user's job or a live process's rank (:func:`check_claim`), and records step
reports, save reports and goodbyes. Whether ranks are still there is its
:class:`~adaptd.daemon.jobs.liveness.Liveness`'s to decide. When a lost job says hello
again resuming from an older step, the first step report ends the restart:
:class:`~adaptd.events.JobResumed` with the restart time, which also goes to
``tracker.on_restart``.

The registry is pure bookkeeping: callers pass the time in and it does no I/O other
than asking its probe about pids, so tests drive it with a fake clock and real
processes.
"""

from __future__ import annotations

import os
import time as _time
from collections import Counter
from collections.abc import Callable, Iterator

from adaptd import events as ev
from adaptd.core.estimators import JobTracker
from adaptd.daemon.jobs.liveness import (
    MAX_INACTIVE_JOBS,
    Liveness,
    ProcessProbe,
    ProcProbe,
)
from adaptd.daemon.jobs.table import (
    HelloKind,
    Job,
    JobStateName,
    JobTable,
    PeerCred,
    PendingResume,
    Rank,
)
from adaptd.protocol.job import LIVENESS_TIMEOUT_S, Goodbye, Hello, SaveCost, SaveReport, Steps

__all__ = [
    "MAX_INACTIVE_JOBS",
    "MAX_RANKS",
    "HelloKind",
    "HelloRefused",
    "Job",
    "JobStateName",
    "PeerCred",
    "PendingResume",
    "ProcProbe",
    "ProcessProbe",
    "Rank",
    "Registry",
    "RegistryFull",
    "check_claim",
    "default_tracker",
]

#: Ranks over all jobs: bounds the state a flood of hellos can create.
MAX_RANKS = 65_536


class RegistryFull(Exception):
    """No room for another rank; the message says how many are registered."""


class HelloRefused(Exception):
    """A hello that would take over another process's rank or another user's job.

    ``code`` is what the daemon's Error reply carries (``wrong_job``, ``rank_taken``).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def default_tracker(msg: Hello) -> JobTracker:
    """A job's tracker from its first hello: GPUs of all ranks, its resume step."""
    return JobTracker(
        msg.job,
        world_size=msg.world_size,
        gpus=max(1, msg.gpus * msg.world_size),
        start_step=msg.resumed_from,
        state_bytes=msg.state_bytes or None,
        local_tier=bool(msg.local_tier),
    )


class Registry:
    """Jobs and ranks, with liveness; emits :mod:`adaptd.events` through ``emit``.

    ``table``: where the records are kept (a new one by default; pass one to read it
    through a :class:`~adaptd.daemon.jobs.table.RegistryView` built before the registry).
    ``tracker_factory`` builds a new job's tracker from its first hello (e.g. to share
    one failure rate across the host's jobs, or to load what the store learned).
    """

    def __init__(
        self,
        table: JobTable | None = None,
        *,
        emit: Callable[[ev.Event], None] = lambda event: None,
        probe: ProcessProbe | None = None,
        liveness_timeout_s: float = LIVENESS_TIMEOUT_S,
        hostname: str | None = None,
        wall: Callable[[], float] = _time.time,
        max_inactive_jobs: int = MAX_INACTIVE_JOBS,
        max_ranks: int = MAX_RANKS,
        tracker_factory: Callable[[Hello], JobTracker] | None = None,
    ) -> None:
        self.table = table if table is not None else JobTable()
        self.emit = emit
        self.liveness = Liveness(
            self.table,
            emit=emit,
            probe=probe,
            liveness_timeout_s=liveness_timeout_s,
            max_inactive_jobs=max_inactive_jobs,
            wall=wall,
        )
        self.hostname = hostname if hostname is not None else os.uname().nodename
        self.wall = wall
        self.max_ranks = max_ranks
        self.tracker_factory = tracker_factory or default_tracker

    # ------------------------------------------------------------------ lookup

    def __iter__(self) -> Iterator[Job]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)

    @property
    def jobs(self) -> dict[str, Job]:
        """The jobs by id (read it; the registry changes it)."""
        return self.table.jobs

    @property
    def by_state(self) -> Counter[JobStateName]:
        return self.table.by_state

    @property
    def writing(self) -> set[str]:
        return self.table.writing

    @property
    def peers(self) -> int:
        return self.table.peers

    def peer(self, identity: bytes) -> tuple[Job, Rank] | None:
        """The (job, rank) a peer said hello as, or ``None`` (a connection whose rank said
        hello again from another connection no longer speaks for it)."""
        table = self.table
        where = table.peers_map.get(identity)
        if where is None:
            return None
        job = table.jobs.get(where[0])
        rank = job.ranks.get(where[1]) if job is not None else None
        if rank is None or rank.identity != identity:
            table.peers_map.pop(identity, None)
            return None
        return job, rank

    @property
    def probe(self) -> ProcessProbe:
        return self.liveness.probe

    # ------------------------------------------------------------------ inputs

    def hello(
        self, identity: bytes, msg: Hello, now: float, peer: PeerCred | None = None
    ) -> tuple[Job, Rank, HelloKind]:
        """Register a rank. Raises :class:`RegistryFull` when no rank may be added, and
        :class:`HelloRefused` when ``peer`` may not take it (see :func:`check_claim`).

        The kind says what the hello meant: ``new`` job, a new rank ``join``-ing an
        active job, a ``reconnect`` of a known process, a ``resume`` of a lost job,
        or a ``restart`` of a finished one.
        """
        job = self.jobs.get(msg.job)
        if job is not None and job.state == "active":
            check_claim(job, identity, msg, peer, self.probe)
        hostname = msg.hostname or self.hostname
        kind: HelloKind
        if job is None:
            self._room()
            job = Job.first(msg, self.tracker_factory(msg), now)
            self.table.add(job)
            self.liveness.evict()
            kind = "new"
        elif job.state == "lost":
            kind = "resume"
            lost_at = job.lost_at if job.lost_at is not None else now
            last_seen = job.lost_last_seen if job.lost_last_seen is not None else lost_at
            pending = PendingResume(lost_at, last_seen, job.step, msg.resumed_from)
            self._new_run(job, msg, now, pending)
        elif job.state == "finished":
            kind = "restart"
            self._new_run(job, msg, now)
        elif (old := job.ranks.get(msg.rank)) is None:
            self._room()
            kind = "join"
        elif old.pid == msg.pid and old.hostname == hostname:
            kind = "reconnect"
        else:
            # a new process for a rank that never said goodbye: the previous run
            # died and was restarted before liveness noticed
            last_seen = job.last_seen
            reason = f"rank {msg.rank} restarted as pid {msg.pid}"
            self.liveness.lose(job, now, reason, last_seen)
            kind = "resume"
            pending = PendingResume(now, last_seen, job.step, msg.resumed_from)
            self._new_run(job, msg, now, pending)
        rank = _new_rank(identity, msg, hostname, now, peer, self.probe, hostname == self.hostname)
        replaced = job.join(rank, msg, kind, now)
        if replaced is not None:
            self.table.unbind([replaced])
        self.table.bind(job, rank)
        self.emit(ev.JobRegistered(time=now, wall=self.wall(), job=job.id,
                                   rank=msg.rank, world_size=msg.world_size,
                                   pid=msg.pid, hostname=hostname,
                                   checkpoint_dir=msg.checkpoint_dir,
                                   resumed_from=msg.resumed_from,
                                   incarnation=job.incarnation,
                                   restore_fallback=msg.restore_fallback,
                                   jobs_active=self.by_state["active"], hello_kind=kind,
                                   local_tier=msg.local_tier, resumed_tier=msg.resumed_tier,
                                   local_intact=msg.local_intact))  # fmt: skip
        return job, rank, kind

    def _room(self) -> None:
        if self.peers >= self.max_ranks:
            raise RegistryFull(f"{self.peers} ranks are registered (the limit)")

    def _new_run(
        self, job: Job, msg: Hello, now: float, pending: PendingResume | None = None
    ) -> None:
        """A new run of a known job; ``pending``: it resumes a lost run (a confirmed
        failure at the old run's last message; the tracker's step was read first)."""
        failed_at = pending.last_seen if pending is not None else None
        self.table.unbind(job.new_run(msg, now, failed_at=failed_at))
        self.table.set_state(job, "active")
        self.table.touch(job)
        if pending is not None:
            job.resuming(pending)

    def steps(self, job: Job, rank: Rank, msg: Steps, now: float) -> None:
        """A batch of step timings from ``rank`` (:meth:`Job.on_steps`)."""
        if job.state == "lost":
            self.liveness.revive(job, now)
        pending = job.on_steps(rank, msg, now)
        if pending is not None:
            self.emit(ev.JobResumed(time=now, wall=self.wall(), job=job.id,
                                    lost_at=pending.lost_at,
                                    last_step=pending.last_step,
                                    resumed_from=pending.resumed_from,
                                    restart_s=max(0.0, now - pending.last_seen),
                                    last_seen=pending.last_seen))  # fmt: skip
        self.table.note_writing(job, now, self.emit)

    def save_report(self, job: Job, rank: Rank, msg: SaveReport, now: float) -> bool:
        """A save report; returns whether it taught the tracker (first report of a step,
        or a failure). The saved step moves the job's step, as a step report does: a
        plan made from this report counts from the save, not from the last batch."""
        if job.state == "lost":
            self.liveness.revive(job, now)
        counted = job.count_save(rank, msg, now)  # δ of a job is its slowest rank's
        self.emit(ev.SaveReported(now, self.wall(), job.id, msg, counted))
        self.table.note_writing(job, now, self.emit)
        return counted

    def save_cost(self, job: Job, rank: Rank, msg: SaveCost, now: float) -> None:
        """Another rank's cost of a save, forwarded by ``rank`` (the job's chief):
        see :class:`~adaptd.daemon.jobs.table.SaveCosts`."""
        self.heard(job, rank, now)
        job.save_cost(msg)

    def goodbye(self, job: Job, rank: Rank, msg: Goodbye, now: float) -> bool:
        """A clean exit of one rank; returns True when it finished the job."""
        self.heard(job, rank, now)
        job.leave(rank, msg.step, now)
        self.table.unbind([rank])
        if job.ranks:
            if not job.live_ranks():  # the others were lost before this goodbye
                self.liveness.lose(job, now, "ranks lost before the last goodbye", job.last_seen)
            self.table.note_writing(job, now, self.emit)
            return False
        self.table.set_state(job, "finished")
        job.finish(msg.reason)
        self.emit(ev.JobFinished(now, self.wall(), job.id, job.step, msg.reason,
                                 jobs_active=self.by_state["active"]))  # fmt: skip
        self.table.note_writing(job, now, self.emit)
        self.liveness.evict()
        return True

    def heard(self, job: Job, rank: Rank, now: float) -> None:
        """Any message from ``rank``: it is alive (and so is its job: a lost job that
        speaks again from the same processes was not lost after all)."""
        job.heard(rank, now)
        if job.state == "lost":
            self.liveness.revive(job, now)

    def check(self, now: float) -> list[Job]:
        """Mark ranks lost whose process is gone or that fell silent; returns the jobs
        that became lost now (:meth:`Liveness.check`)."""
        return self.liveness.check(now)


def check_claim(
    job: Job, identity: bytes, msg: Hello, peer: PeerCred | None, probe: ProcessProbe
) -> None:
    """Refuse a hello that would take an active job from its owner, or a rank from
    the live process holding it.

    A job belongs to the principal (uid, or CURVE key) whose hello started its run;
    another (non-root) principal may not join it. A rank held by a live process
    that connected from a different pid may not be taken: a restarted rank's old
    process is gone (then the hello is a resume, as before), and a reconnect comes
    from the same process. The hello's own ``pid`` is not trusted for this: only
    the connection's credentials are.
    """
    if peer is None:
        return
    if job.owner is not None and peer.owner != job.owner and not peer.root:
        raise HelloRefused(
            "wrong_job",
            f"job {job.id!r} is run by another user ({job.owner}); choose a job id of your own",
        )
    old = job.ranks.get(msg.rank)
    if old is None or not old.alive or old.identity == identity:
        return
    held = old.peer
    if held is None or held.pid is None or peer.pid is None or held.pid == peer.pid:
        return
    if probe.alive(held.pid, old.peer_start):
        raise HelloRefused(
            "rank_taken",
            f"job {job.id!r} rank {msg.rank} is held by live process {held.pid}; "
            "a second process may not report for it (a restarted rank is accepted "
            "once its old process has exited)",
        )


def _new_rank(
    identity: bytes,
    msg: Hello,
    hostname: str,
    now: float,
    peer: PeerCred | None,
    probe: ProcessProbe,
    local: bool,
) -> Rank:
    """A rank from its hello; the probe records its process's start time (on this host)
    and that of the process the connection really comes from, to tell a reused pid."""
    return Rank(
        rank=msg.rank,
        identity=identity,
        pid=msg.pid,
        hostname=hostname,
        registered=now,
        last_seen=now,
        start_time=probe.start_time(msg.pid) if msg.pid > 0 and local else None,
        step=msg.resumed_from,
        peer=peer,
        peer_start=probe.start_time(peer.pid) if peer is not None and peer.pid else None,
    )
