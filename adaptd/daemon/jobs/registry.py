"""The daemon's jobs, their ranks, and whether they are still alive.

Jobs are keyed by job id, ranks by rank number within a job; each ZeroMQ peer
identity that said hello maps to exactly one (job, rank). Every job has one
:class:`~adaptd.core.estimators.JobTracker` fed from its ranks' reports: the step is
the newest step of any rank, step times come from the lead rank (the lowest
live rank, normally 0) so a job of N ranks is not counted N times, and each
saved step counts once whichever rank reports it first.

Liveness: a rank whose process is gone (same host, same pid namespace: the pid
no longer exists, is a zombie, or was reused by a younger process) or that has
been silent for ``silence_timeout_s`` is *lost*. A job whose ranks are all gone
and that did not say goodbye is lost, a failure candidate
(:class:`~adaptd.daemon.events.JobLost`). When it says hello again resuming from an
older step, the first step report ends the restart: :class:`~adaptd.daemon.events.JobResumed`
with the restart time, which also goes to ``tracker.on_restart``.

The registry is pure bookkeeping: callers pass the time in and it does no I/O
other than asking its :class:`ProcessProbe` about pids, so tests drive it with a
fake clock and real processes.
"""

from __future__ import annotations

import os
import time as _time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

from adaptd.config.schema import LIVENESS_TIMEOUT_S
from adaptd.core.estimators import JobTracker
from adaptd.daemon import events as ev
from adaptd.daemon.jobs import costs as job_costs
from adaptd.daemon.jobs.records import HelloKind, Job, JobStateName, PeerCred, PendingResume, Rank
from adaptd.protocol.job import Goodbye, Hello, SaveCost, SaveReport, Steps
from adaptd.telemetry.host import ProcessInfo, pid_exists, process_info

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

#: Inactive (lost or finished) jobs kept for resume detection and status.
MAX_INACTIVE_JOBS = 1024
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


class ProcessProbe(Protocol):
    """Tells whether a pid still names the process that said hello."""

    def start_time(self, pid: int) -> float | None:
        """An opaque start time of ``pid``, or ``None`` when it cannot be seen."""
        ...

    def alive(self, pid: int, start_time: float | None) -> bool:
        """False when ``pid`` is gone, a zombie, or a different (younger) process."""
        ...


class ProcProbe:
    """The real probe: psutil's view of the pid (start time and status), else whether
    the pid exists at all (``kill(pid, 0)``: a process whose procfs entry is hidden).

    Tells a zombie (killed, not yet reaped by its parent) from a live process, and a
    reused pid (a younger process) from the one that said hello. ``process`` is the
    source (:func:`adaptd.telemetry.host.process_info`; tests may pass their own).
    """

    def __init__(
        self,
        process: Callable[[int], ProcessInfo | None] = process_info,
        exists: Callable[[int], bool] = pid_exists,
    ) -> None:
        self.process = process
        self.exists = exists

    def start_time(self, pid: int) -> float | None:
        info = self.process(pid)
        return None if info is None else info.start_time

    def alive(self, pid: int, start_time: float | None) -> bool:
        info = self.process(pid)
        if info is not None:
            return info.running and (start_time is None or info.start_time == start_time)
        return self.exists(pid)


def default_tracker(msg: Hello) -> JobTracker:
    """A job's tracker from its first hello: GPUs of all ranks, its resume step."""
    return JobTracker(
        msg.job,
        world_size=msg.world_size,
        gpus=max(1, msg.gpus * msg.world_size),
        start_step=msg.resumed_from,
        state_bytes=msg.state_bytes or None,
    )


class Registry:
    """Jobs and ranks, with liveness; emits :mod:`adaptd.daemon.events` through ``emit``."""

    def __init__(
        self,
        *,
        emit: Callable[[ev.Event], None] = lambda event: None,
        probe: ProcessProbe | None = None,
        silence_timeout_s: float = LIVENESS_TIMEOUT_S,
        hostname: str | None = None,
        wall: Callable[[], float] = _time.time,
        max_inactive_jobs: int = MAX_INACTIVE_JOBS,
        max_ranks: int = MAX_RANKS,
        tracker_factory: Callable[[Hello], JobTracker] | None = None,
    ) -> None:
        if not silence_timeout_s > 0:
            raise ValueError(f"silence_timeout_s must be > 0 seconds, got {silence_timeout_s}")
        self.emit = emit
        self.probe: ProcessProbe = probe if probe is not None else ProcProbe()
        self.silence_timeout_s = silence_timeout_s
        self.hostname = hostname if hostname is not None else os.uname().nodename
        self.wall = wall
        self.max_inactive_jobs = max_inactive_jobs
        self.max_ranks = max_ranks
        #: Builds a new job's tracker from its first hello (e.g. to share one failure
        #: rate across the host's jobs, or to load what the store learned).
        self.tracker_factory = tracker_factory or default_tracker
        self.jobs: dict[str, Job] = {}
        #: jobs per state, kept as states change (status lines and metrics read it)
        self.by_state: Counter[JobStateName] = Counter()
        #: active jobs with a save in flight (each flip is a SaveInFlight event)
        self.writing: set[str] = set()
        self._peers: dict[bytes, tuple[str, int]] = {}

    # ------------------------------------------------------------------ lookup

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs.values())

    def __len__(self) -> int:
        return len(self.jobs)

    def peer(self, identity: bytes) -> tuple[Job, Rank] | None:
        """The (job, rank) a peer said hello as, or ``None``."""
        where = self._peers.get(identity)
        if where is None:
            return None
        job = self.jobs.get(where[0])
        rank = job.ranks.get(where[1]) if job is not None else None
        if rank is None or rank.identity != identity:
            self._peers.pop(identity, None)
            return None
        return job, rank

    @property
    def peers(self) -> int:
        return len(self._peers)

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
        kind: HelloKind
        if job is None:
            if self.peers >= self.max_ranks:
                raise RegistryFull(f"{self.peers} ranks are registered (the limit)")
            job = self._new_job(msg, now)
            kind = "new"
        elif job.state == "lost":
            kind = "resume"
            lost_at = job.lost_at if job.lost_at is not None else now
            last_seen = job.lost_last_seen if job.lost_last_seen is not None else lost_at
            pending = PendingResume(lost_at, last_seen, job.tracker.step, msg.resumed_from)
            # a confirmed failure; resets the tracker's step, so that was read first
            self._new_incarnation(job, msg, now, failed_at=last_seen)
            job.pending_resume = pending
        elif job.state == "finished":
            kind = "restart"
            self._new_incarnation(job, msg, now)
        else:
            old = job.ranks.get(msg.rank)
            if old is None:
                if self.peers >= self.max_ranks:
                    raise RegistryFull(f"{self.peers} ranks are registered (the limit)")
                kind = "join"
            elif old.pid == msg.pid and old.hostname == (msg.hostname or self.hostname):
                kind = "reconnect"
            else:
                # a new process for a rank that never said goodbye: the previous run
                # died and was restarted before liveness noticed
                last_seen = job.last_seen
                self._lose(job, now, f"rank {msg.rank} restarted as pid {msg.pid}", last_seen)
                kind = "resume"
                pending = PendingResume(now, last_seen, job.tracker.step, msg.resumed_from)
                self._new_incarnation(job, msg, now, failed_at=last_seen)
                job.pending_resume = pending
        old = job.ranks.get(msg.rank)
        if old is not None:
            self._peers.pop(old.identity, None)
        hostname = msg.hostname or self.hostname
        local = hostname == self.hostname
        rank = _new_rank(identity, msg, hostname, now, peer, self.probe, local)
        if old is not None and kind == "reconnect":
            rank.step = max(old.step, msg.resumed_from)
        if kind in ("new", "resume", "restart"):
            job.owner = peer.owner if peer is not None else None
        elif job.owner is None and peer is not None:
            job.owner = peer.owner
        job.ranks[msg.rank] = rank
        self._peers[identity] = (job.id, msg.rank)
        job.last_seen = now
        job.agreement = msg.agreement
        job.joined.add(msg.rank)
        # one failure per job failure: only the daemon deciding the job's plan counts it
        job.tracker.counts_failures = job.decides
        if msg.checkpoint_dir:
            job.checkpoint_dir = msg.checkpoint_dir
        if msg.restore_fallback:
            job.restore_fallback = msg.restore_fallback
        self.emit(
            ev.JobRegistered(
                time=now,
                wall=self.wall(),
                job=job.id,
                rank=msg.rank,
                world_size=msg.world_size,
                pid=msg.pid,
                hostname=hostname,
                checkpoint_dir=msg.checkpoint_dir,
                resumed_from=msg.resumed_from,
                incarnation=job.incarnation,
                restore_fallback=msg.restore_fallback,
                jobs_active=self.by_state["active"],
            )
        )
        return job, rank, kind

    def steps(self, job: Job, rank: Rank, msg: Steps, now: float) -> None:
        """A batch of step timings from ``rank``."""
        self.heard(job, rank, now)
        rank.step = max(rank.step, msg.step)
        t = job.tracker
        if msg.save_in_flight and not t.save_in_flight:
            self._save_started(job, msg.step, now)
        if rank.rank == job.lead_rank():
            t.on_steps(
                now,
                msg.step,
                msg.count,
                msg.mean_s,
                msg.save_in_flight,
                max_s=msg.max_s,
                max_steps=msg.max_steps,
                warmup=msg.warmup,
            )
        else:  # other ranks move the step only; their timings would count the job twice
            t.on_steps(now, msg.step, 0, 0.0, t.save_in_flight)
        pending = job.pending_resume
        if pending is not None:
            job.pending_resume = None
            restart_s = max(0.0, now - pending.last_seen)
            t.on_restart(restart_s)
            self.emit(
                ev.JobResumed(
                    time=now,
                    wall=self.wall(),
                    job=job.id,
                    lost_at=pending.lost_at,
                    last_step=pending.last_step,
                    resumed_from=pending.resumed_from,
                    restart_s=restart_s,
                    last_seen=pending.last_seen,
                )
            )
        self._note_writing(job, now)

    def _save_started(self, job: Job, step: int, now: float) -> None:
        """A rank reports a save in flight that the tracker does not know of yet: tell the
        tracker now (:meth:`Job.in_flight_step` says at which step), not when the save
        report arrives after the write is durable."""
        saved = job.in_flight_step(step)
        if saved is None:
            return
        t = job.tracker
        # when the save began: that many steps before this report (never before the last)
        when = now - (step - saved) * (t.step_time_s or 0.0)
        t.on_save_requested(max(when, min(t.time, now)), saved)

    def save_report(self, job: Job, rank: Rank, msg: SaveReport, now: float) -> bool:
        """A save report; returns whether it taught the tracker (first report of a step,
        or a failure). The saved step moves the job's step, as a step report does: a
        plan made from this report counts from the save, not from the last batch."""
        self.heard(job, rank, now)
        rank.step = max(rank.step, msg.step)
        counted = not msg.ok or msg.step not in job.counted_save_steps
        t = job.tracker
        if counted:
            t.on_save_report(
                now,
                msg.step,
                blocking_s=msg.blocking_s,
                durable_s=msg.durable_s,
                extra_step_s=msg.extra_step_s,
                ok=msg.ok,
            )
            if msg.ok:
                job.counted_save_steps.add(msg.step)
                if len(job.counted_save_steps) > 64:  # only recent steps can repeat
                    job.counted_save_steps.discard(min(job.counted_save_steps))
        job_costs.on_report(job, msg, counted)  # δ of a job is its slowest rank's
        t.on_steps(now, msg.step, 0, 0.0, t.save_in_flight)
        if msg.ok:
            job.urgent = None
        job.last_save = msg
        job.last_save_time = now
        self.emit(ev.SaveReported(now, self.wall(), job.id, msg, counted))
        self._note_writing(job, now)
        return counted

    def save_cost(self, job: Job, rank: Rank, msg: SaveCost, now: float) -> None:
        """Another rank's cost of a save, forwarded by ``rank`` (the job's chief):
        see :mod:`adaptd.daemon.jobs.costs`."""
        self.heard(job, rank, now)
        job_costs.on_save_cost(job, msg)

    def goodbye(self, job: Job, rank: Rank, msg: Goodbye, now: float) -> bool:
        """A clean exit of one rank; returns True when it finished the job."""
        self.heard(job, rank, now)
        rank.step = max(rank.step, msg.step)
        job.tracker.on_steps(now, msg.step, 0, 0.0, False)
        del job.ranks[rank.rank]
        self._peers.pop(rank.identity, None)
        if job.ranks:
            if not job.live_ranks():  # the others were lost before this goodbye
                self._lose(job, now, "ranks lost before the last goodbye", job.last_seen)
            self._note_writing(job, now)
            return False
        self._set_state(job, "finished")
        job.finished_reason = msg.reason
        self.emit(
            ev.JobFinished(
                now,
                self.wall(),
                job.id,
                job.tracker.step,
                msg.reason,
                jobs_active=self.by_state["active"],
            )
        )
        self._note_writing(job, now)
        self._evict()
        return True

    def check(self, now: float) -> list[Job]:
        """Mark ranks lost whose process is gone or that fell silent; returns the jobs
        that became lost now."""
        lost: list[Job] = []
        for job in self.jobs.values():
            if job.state != "active":
                continue
            for rank in job.ranks.values():
                if not rank.alive:
                    continue
                if rank.checkable and not self.probe.alive(rank.pid, rank.start_time):
                    self._rank_lost(rank, f"pid {rank.pid} gone")
                elif now - rank.last_seen > self.silence_timeout_s:
                    self._rank_lost(rank, f"silent for {now - rank.last_seen:.0f}s")
            if job.ranks and not job.live_ranks():
                reasons = sorted({r.lost_reason for r in job.ranks.values()})
                self._lose(job, now, "; ".join(reasons), job.last_seen)
                lost.append(job)
        if lost:
            self._evict()
        return lost

    # ------------------------------------------------------------------ internals

    def _new_job(self, msg: Hello, now: float) -> Job:
        tracker = self.tracker_factory(msg)
        job = Job(id=msg.job, tracker=tracker, world_size=msg.world_size, created=now)
        job.failures = tracker.failures  # what a restarted daemon restored (else 0)
        job.last_seen = now
        self.jobs[msg.job] = job
        self.by_state[job.state] += 1
        self._evict()
        return job

    def _new_incarnation(
        self, job: Job, msg: Hello, now: float, failed_at: float | None = None
    ) -> None:
        """A new run of a known job: forget its ranks, keep what was learned.

        ``failed_at``: the previous run died then (a lost job coming back), which the
        tracker counts as one failure of the job before it starts the new run.
        """
        for r in job.ranks.values():
            self._peers.pop(r.identity, None)
        job.ranks.clear()
        job.incarnation += 1
        self._set_state(job, "active")
        job.world_size = msg.world_size
        job.urgent = None
        job.urgent_sent = False
        job.restore_fallback = ""  # set again by this run's hello if it fell back
        job.policy = None  # chosen again from this run's hello
        t = job.tracker
        if failed_at is not None:
            t.on_failure(failed_at)
        t.on_resume(now, msg.resumed_from)
        t.world_size = msg.world_size
        t.gpus = max(1, msg.gpus * msg.world_size)
        if msg.state_bytes:
            t.state_bytes = msg.state_bytes
        job.counted_save_steps.clear()
        job.slower_costs.clear()
        job.joined.clear()
        job.rounds = None  # a new run's ranks start new rounds
        job.agreed = None
        self.jobs[job.id] = self.jobs.pop(job.id)  # most recently active last

    def heard(self, job: Job, rank: Rank, now: float) -> None:
        """Any message from ``rank``: it is alive (and so is its job)."""
        rank.last_seen = now
        job.last_seen = now
        if not rank.alive:
            rank.alive = True
            rank.lost_reason = ""
        if job.state == "lost":
            # the same processes spoke again: the loss was a false alarm
            lost_at = job.lost_at if job.lost_at is not None else now
            self._set_state(job, "active")
            job.failures = max(0, job.failures - 1)
            job.lost_at = None
            self.emit(
                ev.JobRevived(
                    now, self.wall(), job.id, lost_at, jobs_active=self.by_state["active"]
                )
            )

    def _rank_lost(self, rank: Rank, reason: str) -> None:
        rank.alive = False
        rank.lost_reason = reason

    def _set_state(self, job: Job, state: JobStateName) -> None:
        self.by_state[job.state] -= 1
        self.by_state[state] += 1
        job.state = state

    def _note_writing(self, job: Job, now: float) -> None:
        """Emit :class:`~adaptd.daemon.events.SaveInFlight` when the job's save-in-flight flag
        (an active job whose tracker has a save in flight) flips."""
        writing = job.state == "active" and job.tracker.save_in_flight
        if writing != (job.id in self.writing):
            (self.writing.add if writing else self.writing.discard)(job.id)
            self.emit(ev.SaveInFlight(now, job.id, writing))

    def _lose(self, job: Job, now: float, reason: str, last_seen: float) -> None:
        self._set_state(job, "lost")
        job.lost_at = now
        job.lost_last_seen = last_seen
        job.lost_reason = reason
        job.failures += 1
        self.emit(
            ev.JobLost(
                time=now,
                wall=self.wall(),
                job=job.id,
                step=job.tracker.step,
                last_durable_step=job.tracker.last_durable_step,
                last_seen=last_seen,
                reason=reason,
                gpus=job.tracker.gpus,
                world_size=job.world_size,
                jobs_active=self.by_state["active"],
            )
        )
        self._note_writing(job, now)

    def _evict(self) -> None:
        """Forget the oldest inactive jobs beyond the cap (dict order = activity order)."""
        inactive = [j for j in self.jobs.values() if j.state != "active"]
        for job in inactive[: max(0, len(inactive) - self.max_inactive_jobs)]:
            for r in job.ranks.values():
                self._peers.pop(r.identity, None)
            del self.jobs[job.id]
            self.by_state[job.state] -= 1
            # sinks keep per-job state (metric series, telemetry) that must go too
            self.emit(ev.JobForgotten(job.last_seen, job.id, jobs_active=self.by_state["active"]))


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
    rank = Rank(
        rank=msg.rank,
        identity=identity,
        pid=msg.pid,
        hostname=hostname,
        registered=now,
        last_seen=now,
        start_time=probe.start_time(msg.pid) if msg.pid > 0 and local else None,
        step=msg.resumed_from,
    )
    if peer is not None:
        rank.peer = peer
        if peer.pid:
            rank.peer_start = probe.start_time(peer.pid)
    return rank
