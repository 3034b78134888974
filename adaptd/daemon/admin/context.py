"""What an operator command's daemon side works with: :class:`AdminContext`.

Each request on the admin socket is answered by its function in
:mod:`adaptd.daemon.admin.answers`, given one context: the parts of the daemon an answer works
through, by name, the saves of ``adaptd history``, who asked (the
reply of a deferred answer, ``drain``'s, goes there) and the time. The few things every
command about a job needs are here once: find a job or say which ones exist, list the
active ones, and hand an action to the host that decides a job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adaptd.daemon.admin.drains import Drains
from adaptd.daemon.admin.status import StatusView
from adaptd.daemon.jobs.ops import JobOps, NoRankToRelay
from adaptd.daemon.jobs.policy_choice import PolicyChoice
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.jobs.table import Job
from adaptd.protocol import admin
from adaptd.protocol.job import Operation
from adaptd.state.records import SaveRecord

__all__ = ["AdminContext", "HistorySource"]

#: A job's saves for ``adaptd history``: ``(job, since, limit)`` -> the newest ``limit``
#: that ended at or after ``since`` (Unix seconds, ``None``: all), oldest first (the
#: state database's, :meth:`adaptd.state.store.Store.saves`).
HistorySource = Callable[[str, "float | None", int], Sequence[SaveRecord]]


@dataclass(frozen=True)
class AdminContext:
    """One operator request's view of the daemon (see the module docstring).

    ``registry``: jobs and ranks; ``ops``: operator actions on a job, here or relayed;
    ``drains``: saves someone waits for; ``choice``: each job's policy; ``settings``:
    the operators' per-job settings; ``status``: what ``adaptd status`` shows."""

    registry: Registry
    ops: JobOps
    drains: Drains
    choice: PolicyChoice
    settings: OperatorSettings
    status: StatusView
    history: HistorySource | None
    envelope: Sequence[bytes]
    now: float

    def known_job(self, job_id: str) -> Job:
        """The job, in any state; raises ``AdminError("unknown_job")`` naming the known."""
        job = self.registry.jobs.get(job_id)
        if job is None:
            shown = ", ".join(sorted(j.id for j in self.registry)[:20]) or "none"
            raise admin.AdminError("unknown_job", f"job {job_id!r} is unknown; known jobs: {shown}")
        return job

    def active_job(self, job_id: str) -> Job:
        """The job if it is active; raises ``AdminError("unknown_job")`` naming the active."""
        job = self.registry.jobs.get(job_id)
        if job is None or job.state != "active":
            shown = ", ".join(sorted(j.id for j in self.active_jobs())[:20]) or "none"
            state = "unknown" if job is None else job.state
            raise admin.AdminError(
                "unknown_job", f"job {job_id!r} is {state}; active jobs: {shown}"
            )
        return job

    def active_jobs(self) -> list[Job]:
        """The active jobs, most recently started last."""
        return [j for j in self.registry if j.state == "active"]

    def relay(self, job: Job, op: Operation, *, spec: str = "", reason: str = "") -> str:
        """Hand ``op`` to the host deciding ``job`` (:meth:`JobOps.relay`); returns who
        decides. Raises ``AdminError("not_deciding")`` when it cannot be carried there."""
        try:
            return self.ops.relay(job, op, self.now, spec=spec, reason=reason)
        except NoRankToRelay as exc:
            raise admin.AdminError("not_deciding", str(exc)) from None
