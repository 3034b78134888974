"""Drains: every job saves now, and someone waits until those saves are durable.

Two kinds: ``adaptd drain`` (an operator's request, answered on the admin socket
when it ends) and the shutdown drain (SIGTERM with ``daemon.drain_grace_s`` > 0;
the daemon's loop ends when it does). A drain sends SaveNow to every active job
with live ranks and tracks, per rank, the step it was at: a successful save report
of that step or a later one counts. A job is done when all its ranks reported,
one of them failed, or the job (or a rank) is gone; the drain ends when every job
is done or its deadline passes, and its reply says which saves are durable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from adaptd import events as ev
from adaptd.daemon.jobs.table import Job, JobTable
from adaptd.logfmt import logfmt
from adaptd.protocol import admin
from adaptd.state.records import copy_fields

__all__ = ["Drain", "DrainJob", "Drains"]

log = logging.getLogger("adaptd.server")


@dataclass
class DrainJob:
    """One job's part of a drain: which ranks still owe a durable save."""

    job: str
    ranks: int
    waiting: dict[int, int]  # rank -> its step at the request: a report of it or later counts
    step: int | None = None
    error: str = ""
    done_at: float | None = None


@dataclass
class Drain:
    """A drain in progress: ``adaptd drain`` (``envelope`` set) or the shutdown drain."""

    envelope: Sequence[bytes] | None
    reason: str
    started: float
    deadline: float
    jobs: dict[str, DrainJob] = field(default_factory=dict)

    def done(self) -> bool:
        return all(j.done_at is not None for j in self.jobs.values())


class Drains:
    """The drains in progress over the jobs of ``jobs``. ``save_now(job, reason, now)``
    asks a job's ranks to save (:meth:`adaptd.daemon.jobs.ops.JobOps.save_now`);
    ``reply(envelope, reply)`` answers an operator
    (:meth:`adaptd.daemon.transport.Transport.send_admin`)."""

    def __init__(
        self,
        *,
        jobs: JobTable,
        save_now: Callable[[Job, str, float], int],
        reply: Callable[[Sequence[bytes], admin.Reply], None],
    ) -> None:
        self.jobs = jobs
        self.save_now = save_now
        self.reply = reply
        self._drains: list[Drain] = []
        self._shutdown: Drain | None = None
        #: the shutdown drain has ended: the daemon's loop may end
        self.shutdown_over = False

    def __bool__(self) -> bool:
        return bool(self._drains)

    @property
    def shutting_down(self) -> bool:
        return self._shutdown is not None

    def next_deadline(self, default: float) -> float:
        """The earliest drain deadline, or ``default`` when none runs."""
        return min([default, *(d.deadline for d in self._drains)])

    def start(
        self, envelope: Sequence[bytes] | None, timeout_s: float, reason: str, now: float
    ) -> Drain:
        """SaveNow to every active job with live ranks; track their reports.
        ``envelope=None`` is the shutdown drain."""
        drain = Drain(envelope, reason, now, now + timeout_s)
        for job in self.jobs:
            ranks = job.live_ranks()
            if job.state != "active" or not ranks:
                continue
            sent = self.save_now(job, reason, now)
            drain.jobs[job.id] = DrainJob(job.id, sent, {r.rank: r.step for r in ranks})
        self._drains.append(drain)
        if envelope is None:
            self._shutdown = drain
        log.info(logfmt("operator_action" if envelope is not None else "shutdown_drain",
                        action="drain", jobs=len(drain.jobs), timeout_s=timeout_s,
                        reason=reason))  # fmt: skip
        return drain

    def on_event(self, event: ev.Event) -> None:
        """An :data:`adaptd.events.Sink`: a save report may be a save a drain waits for.

        The drains subscribe last (:func:`adaptd.daemon.assembly.assemble`), so a save they
        wait for is already recorded by every other sink when it releases a drain, whose
        reply is sent at the loop's next :meth:`check`."""
        if not isinstance(event, ev.SaveReported):
            return
        msg, now = event.report, event.time
        for drain in self._drains:
            entry = drain.jobs.get(event.job)
            if entry is None or entry.done_at is not None or msg.rank not in entry.waiting:
                continue
            if msg.step < entry.waiting[msg.rank]:
                continue  # an older save finishing: not the one asked for
            if not msg.ok:
                entry.error = f"rank {msg.rank} save of step {msg.step} failed: {msg.error}"
                entry.done_at = now
                continue
            del entry.waiting[msg.rank]
            entry.step = msg.step if entry.step is None else min(entry.step, msg.step)
            if not entry.waiting:
                entry.done_at = now

    def check(self, now: float) -> None:
        """End drains whose saves are all in (or whose jobs are gone), or whose time is up."""
        for drain in list(self._drains):
            for entry in drain.jobs.values():
                if entry.done_at is not None:
                    continue
                job = self.jobs.get(entry.job)
                if job is None or job.state != "active":
                    entry.error = f"job {job.state if job else 'forgotten'} before its save"
                    entry.done_at = now
                    continue
                gone = sorted(
                    r for r in entry.waiting if (rk := job.ranks.get(r)) is None or not rk.alive
                )
                if gone:
                    entry.error = f"rank {gone[0]} gone before its save"
                    entry.done_at = now
            timed_out = now >= drain.deadline and not drain.done()
            if drain.done() or timed_out:
                self._drains.remove(drain)
                self._finish(drain, now, timed_out)

    def _finish(self, drain: Drain, now: float, timed_out: bool) -> None:
        jobs = []
        for entry in drain.jobs.values():
            durable = entry.done_at is not None and not entry.error
            error = entry.error
            if entry.done_at is None:
                waiting = ",".join(map(str, sorted(entry.waiting)))
                error = (
                    f"timeout after {now - drain.started:.0f}s: rank(s) {waiting} did not report"
                )
            seconds = (entry.done_at if entry.done_at is not None else now) - drain.started
            jobs.append(
                copy_fields(admin.DrainJob, entry, durable=durable, seconds=seconds, error=error)
            )
            (log.info if durable else log.warning)(
                logfmt(
                    "drain_job",
                    job=entry.job,
                    step=entry.step,
                    durable=durable,
                    seconds=seconds,
                    error=error or None,
                    reason=drain.reason,
                )
            )
        log.info(logfmt("drain_done", reason=drain.reason, jobs=len(jobs),
                        durable=sum(j.durable for j in jobs),
                        seconds=now - drain.started, timed_out=timed_out))  # fmt: skip
        if drain.envelope is not None:
            reply = admin.DrainReply(jobs=jobs, seconds=now - drain.started, timed_out=timed_out)
            self.reply(drain.envelope, reply)
        if drain is self._shutdown:
            self.shutdown_over = True
