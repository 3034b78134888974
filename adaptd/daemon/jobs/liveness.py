"""Whether a job's ranks are still there: their processes, and their silence.

A rank whose process is gone (same host, same pid namespace: the pid no longer exists,
is a zombie, or was reused by a younger process) or that has been silent for
``liveness_timeout_s`` is *lost*. A job whose ranks are all gone and that did not say
goodbye is lost, a failure candidate (:class:`~adaptd.events.JobLost`); when the
same processes speak again the loss was a false alarm
(:class:`~adaptd.events.JobRevived`).

:class:`Liveness` is the registry's part that decides this, once a second in the
daemon's loop (:meth:`Liveness.check`) and when a hello shows that a rank restarted
(:meth:`Liveness.lose`). It asks its :class:`ProcessProbe` about pids and does no
other I/O, so tests drive it with explicit times and real processes.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from typing import Protocol

from adaptd import events as ev
from adaptd.daemon.jobs.table import Job, JobTable
from adaptd.protocol.job import LIVENESS_TIMEOUT_S
from adaptd.telemetry.host import ProcessInfo, pid_exists, process_info

__all__ = ["MAX_INACTIVE_JOBS", "Liveness", "ProcProbe", "ProcessProbe"]

#: Inactive (lost or finished) jobs kept for resume detection and status.
MAX_INACTIVE_JOBS = 1024


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


class Liveness:
    """Finds lost ranks and jobs in ``table``; emits through ``emit``. ``liveness_timeout_s``
    is > 0, as :class:`~adaptd.daemon.options.DaemonOptions` checked it."""

    def __init__(
        self,
        table: JobTable,
        *,
        emit: Callable[[ev.Event], None],
        probe: ProcessProbe | None = None,
        liveness_timeout_s: float = LIVENESS_TIMEOUT_S,
        max_inactive_jobs: int = MAX_INACTIVE_JOBS,
        wall: Callable[[], float] = _time.time,
    ) -> None:
        self.table = table
        self.emit = emit
        self.probe: ProcessProbe = probe if probe is not None else ProcProbe()
        self.liveness_timeout_s = liveness_timeout_s
        self.max_inactive_jobs = max_inactive_jobs
        self.wall = wall

    def check(self, now: float) -> list[Job]:
        """Mark ranks lost whose process is gone or that fell silent; returns the jobs
        that became lost now."""
        lost: list[Job] = []
        for job in self.table:
            if job.state != "active":
                continue
            for rank in job.ranks.values():
                if not rank.alive:
                    continue
                if rank.checkable and not self.probe.alive(rank.pid, rank.start_time):
                    rank.lose(f"pid {rank.pid} gone")
                elif now - rank.last_seen > self.liveness_timeout_s:
                    rank.lose(f"silent for {now - rank.last_seen:.0f}s")
            if job.ranks and not job.live_ranks():
                reasons = sorted({r.lost_reason for r in job.ranks.values()})
                self.lose(job, now, "; ".join(reasons), job.last_seen)
                lost.append(job)
        if lost:
            self.evict()
        return lost

    def revive(self, job: Job, now: float) -> None:
        """The lost ``job`` spoke again from the same processes: it was not lost after all."""
        lost_at = job.revive(now)
        self.table.set_state(job, "active")
        active = self.table.by_state["active"]
        self.emit(ev.JobRevived(now, self.wall(), job.id, lost_at, jobs_active=active))

    def lose(self, job: Job, now: float, reason: str, last_seen: float) -> None:
        """Every rank of ``job`` is gone without a goodbye (``last_seen``: its last message)."""
        self.table.set_state(job, "lost")
        job.lose(now, reason, last_seen)
        t = job.tracker
        self.emit(ev.JobLost(time=now, wall=self.wall(), job=job.id, step=t.step,
                             last_durable_step=t.last_durable_step,
                             last_seen=last_seen, reason=reason, gpus=t.gpus,
                             world_size=job.world_size,
                             jobs_active=self.table.by_state["active"]))  # fmt: skip
        self.table.note_writing(job, now, self.emit)

    def evict(self) -> None:
        """Forget the oldest inactive jobs beyond the cap; sinks keep per-job state
        (metric series, telemetry) that must go too, so each is a JobForgotten."""
        for job in self.table.evict(self.max_inactive_jobs):
            active = self.table.by_state["active"]
            self.emit(ev.JobForgotten(job.last_seen, job.id, jobs_active=active))
