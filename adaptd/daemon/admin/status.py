"""What ``adaptd status`` shows: the daemon, every job, telemetry and replication.

:class:`StatusView` turns the registry's records, the operator settings and the
daemon's counters into the admin protocol's :class:`~adaptd.protocol.admin.StatusReply`.
The telemetry and replication parts come from callables the service passes in
(the sampler's snapshot as a dict, the Replicator's rows); one that raises is
counted and logged, and its part is left out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from adaptd import __version__
from adaptd.core.snapshot import Decision
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.jobs.stall_watch import StallVerdicts
from adaptd.daemon.jobs.table import Job, JobTable
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import Transport
from adaptd.events import EventBus
from adaptd.logfmt import Throttle, logfmt
from adaptd.protocol import admin
from adaptd.state.records import copy_fields

__all__ = ["ReplicationSource", "StatusExtra", "StatusView"]

log = logging.getLogger("adaptd.server")

#: The telemetry part of the status (``None``: none).
StatusExtra = Callable[[], "dict[str, Any] | None"]
#: The Replicator's rows for the status.
ReplicationSource = Callable[[], "list[admin.ReplicationInfo]"]

#: What :class:`~adaptd.protocol.admin.JobInfo` shows of a job's tracker, as it is named.
TRACKER_FIGURES = ("step", "start_step", "step_time_s", "saves", "failed_saves",
                   "save_cost_s", "save_latency_s", "last_durable_step", "restore_s")  # fmt: skip
#: What it shows of the job's record, as it is named.
JOB_FACTS = ("state", "world_size", "failures", "failures_covered", "incarnation",
             "checkpoint_dir", "urgent", "restore_fallback", "agreement")  # fmt: skip


class StatusView:
    """Builds the status reply from the daemon's parts; reads, never changes them.
    ``hostname``: this host, shown as the one deciding the jobs decided here."""

    def __init__(
        self,
        *,
        jobs: JobTable,
        hostname: str,
        settings: OperatorSettings,
        stats: DaemonStats,
        events: EventBus,
        transport: Transport,
        default_policy: str,
        status_extra: StatusExtra | None = None,
        replication_source: ReplicationSource | None = None,
        stall: StallVerdicts | None = None,
    ) -> None:
        self.jobs = jobs
        #: The hang detection's newest verdict on a job (None: no watch).
        self.stall = stall
        self.hostname = hostname
        self.settings = settings
        self.stats = stats
        self.events = events
        self.transport = transport
        self.default_policy = default_policy
        self.status_extra = status_extra
        self.replication_source = replication_source
        self._throttle = Throttle()

    def status(self, now: float) -> admin.StatusReply:
        """Every job and the daemon's counters, as of ``now``."""
        c = self.stats.counters
        by_state = self.jobs.by_state
        daemon = admin.DaemonInfo(
            version=__version__,
            pid=os.getpid(),
            socket=self.transport.endpoint.removeprefix("ipc://"),
            admin_socket=str(self.transport.admin_path),
            default_policy=self.default_policy,
            uptime_s=now - self.transport.opened_at,
            messages=c["messages"],
            by_kind=dict(self.stats.by_kind),
            rejected=dict(self.stats.rejected),
            sent=c["sent"],
            send_dropped=c["send_dropped"],
            plans_sent=c["plans_sent"],
            policy_errors=c["policy_errors"],
            sink_errors=self.events.errors,
            jobs_active=by_state["active"],
            jobs_lost=by_state["lost"],
            peers=self.jobs.peers,
        )
        return admin.StatusReply(
            daemon=daemon,
            jobs=[self._job_info(j, now) for j in self.jobs],
            telemetry=self._guarded("status_extra_failed", self.status_extra),
            replication=self._guarded("replication_status_failed", self.replication_source),
        )

    def _guarded(self, event: str, source: Callable[[], Any] | None) -> Any:
        if source is None:
            return None
        try:
            return source()
        except Exception:
            self.stats.counters["status_extra_errors"] += 1
            if self._throttle(event):
                log.exception(logfmt(event))
            return None

    def _job_info(self, job: Job, now: float) -> admin.JobInfo:
        t = job.tracker
        shown, plan_from = _shown_plan(job)
        plan = None
        if shown is not None:
            policy = shown.policy or job.policy_spec
            plan = copy_fields(admin.PlanInfo, shown, seq=job.plan_seq, policy=policy)
        last = None
        if job.last_save is not None and job.last_save_time is not None:
            age_s = now - job.last_save_time
            last = copy_fields(admin.SaveInfo, job.last_save, age_s=age_s)
        ranks = [
            copy_fields(admin.RankInfo, r, last_seen_s=now - r.last_seen)
            for r in sorted(job.ranks.values(), key=lambda r: r.rank)
        ]
        setting = self.settings.get(job.id) or admin.JobSettings()
        lost = job.state == "lost"
        judged = self.stall(job.id) if self.stall is not None else None
        verdict, silent = judged if judged is not None else (None, None)
        return admin.JobInfo(
            job=job.id,
            ranks=ranks,
            policy=job.policy_spec,
            plan=plan,
            next_save_step=shown.due_after(t.step - 1) if shown is not None else None,
            last_save=last,
            waste=job.latest.waste if job.latest is not None else None,
            lost_reason=job.lost_reason if lost else "",
            lost_s=(now - job.lost_at) if lost and job.lost_at is not None else None,
            paused=setting.paused,
            policy_set=setting.policy is not None,
            decided_by=self.hostname if job.decides else _agreed_by(job),
            decided_here=job.decides,
            plan_from_step=plan_from,
            rounds=_rounds_info(job),
            stall_threshold_s=verdict.threshold_s if verdict is not None else None,
            stall_reason=verdict.reason if verdict is not None else "",
            stall_silent_s=silent,
            stalled=verdict.stalled if verdict is not None else False,
            jit_coverage=t.jit.coverage if t.jit.covered + t.jit.uncovered else None,
            **{name: getattr(t, name) for name in TRACKER_FIGURES},
            **{name: getattr(job, name) for name in JOB_FACTS},
        )


def _shown_plan(job: Job) -> tuple[Decision | None, int | None]:
    """The job's one plan as this host shows it, and the step it is in force from:
    the plan its ranks agreed on where they report or agree one (another host
    decides it, or this daemon's rounds committed it), else the plan sent."""
    if job.rounds is not None and job.rounds.agreed is not None:
        return job.rounds.agreed, job.rounds.agreed_from
    a = job.agreed
    if a is not None and not job.decides:
        d = Decision(
            next_step=a.next_step, every_steps=a.every_steps, reason=a.reason, policy=a.policy
        )
        return d, a.at_step
    return job.plan, (a.at_step if a is not None else None)


def _agreed_by(job: Job) -> str:
    return job.agreed.decided_by if job.agreed is not None else ""


def _rounds_info(job: Job) -> admin.RoundsInfo | None:
    r = job.rounds
    if r is None:
        return None
    if r.open is None:
        return admin.RoundsInfo(committed=r.committed, aborted=r.aborted)
    live = [x.rank for x in job.live_ranks()]
    return admin.RoundsInfo(
        committed=r.committed,
        aborted=r.aborted,
        open_round=r.open.proposal.round,
        open_action=r.open.proposal.action,
        open_at_step=r.open.proposal.at_step,
        waiting_for=[x for x in live if x not in r.open.acks],
    )
