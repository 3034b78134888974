"""The daemon's side of each operator command: a request and the daemon's context -> the reply.

One function per request of the admin protocol (:mod:`adaptd.protocol.admin`), run in the
daemon's loop by :class:`~adaptd.daemon.admin.handler.AdminHandler` through the table of
:mod:`adaptd.daemon.admin.commands`; and one per operation relayed from another host
(``relayed_*``), run by :class:`~adaptd.daemon.jobs.ops.JobOps` on the deciding daemon.
The command line's side of each (its arguments, the request it sends, how it shows the
reply) is its module in :mod:`adaptd.commands`; the two meet only on the admin socket,
so the daemon imports no command and an operator command reaches the daemon only there.
An :class:`~adaptd.protocol.admin.AdminError` raised here becomes the caller's error
reply; ``None`` means the reply is sent later (``drain``'s, when it ends).
"""

from __future__ import annotations

import logging

from adaptd.core.policy import PolicyError
from adaptd.daemon.admin.context import AdminContext
from adaptd.daemon.jobs.ops import JobOps, RequestRefused
from adaptd.daemon.jobs.table import Job
from adaptd.logfmt import logfmt
from adaptd.protocol import job as p
from adaptd.protocol.admin import (
    AdminError,
    DrainRequest,
    HistoryReply,
    HistoryRequest,
    HistorySave,
    PauseReply,
    PauseRequest,
    SaveNowReply,
    SaveNowRequest,
    SetPolicyReply,
    SetPolicyRequest,
    StatusReply,
    StatusRequest,
)
from adaptd.state.records import copy_fields

__all__ = [
    "drain",
    "history",
    "pause",
    "relayed_pause",
    "relayed_resume",
    "relayed_save_now",
    "relayed_set_policy",
    "save_now",
    "set_policy",
    "status",
]

log = logging.getLogger("adaptd.server")


def status(req: StatusRequest, ctx: AdminContext) -> StatusReply:
    """The daemon's side: every job and its counters, now."""
    return ctx.status.status(ctx.now)


def history(req: HistoryRequest, ctx: AdminContext) -> HistoryReply:
    """The daemon's side: the job's saves from the state database (the newest
    ``req.limit``, and whether there are older ones in the window)."""
    if ctx.history is None:
        raise AdminError(
            "no_history", "this daemon keeps no save history (it runs without a state "
            "database); `adaptd serve` keeps one in daemon.state_dir"
        )  # fmt: skip
    rows = list(ctx.history(req.job, req.since, req.limit + 1))  # one more: are there?
    registry = ctx.registry
    if not rows and req.job not in registry.jobs:
        known = ", ".join(sorted(j.id for j in registry)[:20]) or "none"
        window = " since then" if req.since is not None else ""
        raise AdminError(
            "unknown_job",
            f"job {req.job!r}: no saves in this daemon's history{window}, and no such job "
            f"here now (jobs here: {known})",
        )
    saves = [copy_fields(HistorySave, r) for r in rows[-req.limit :]]
    return HistoryReply(job=req.job, saves=saves, more=len(rows) > req.limit)


def save_now(req: SaveNowRequest, ctx: AdminContext) -> SaveNowReply:
    """The daemon's side: every live rank of the job (or of every active job) saves at
    one step soon; a job decided on another host is asked there, through its rank."""
    jobs = ctx.active_jobs() if req.job is None else [ctx.active_job(req.job)]
    ranks, relayed = 0, []
    for job in jobs:
        if job.decides:
            ranks += ctx.ops.save_now(job, req.reason, ctx.now)
        else:
            ctx.relay(job, "save_now", reason=req.reason)
            relayed.append(job.id)
    log.info(logfmt("operator_action", action="save_now", job=req.job or "--all",
                    jobs=len(jobs), ranks=ranks, relayed=",".join(relayed) or None,
                    reason=req.reason))  # fmt: skip
    return SaveNowReply(jobs=[j.id for j in jobs], ranks=ranks, relayed=relayed)


def drain(req: DrainRequest, ctx: AdminContext) -> None:
    """The daemon's side: every active job saves now; the reply goes to the caller when
    the drain ends (its ``timeout_s`` was checked by the decoder)."""
    drains = ctx.drains
    drains.start(ctx.envelope, req.timeout_s, req.reason, ctx.now)
    drains.check(ctx.now)


def set_policy(req: SetPolicyRequest, ctx: AdminContext) -> SetPolicyReply:
    """The job's new policy, its plan pushed at once (or the request relayed to the host
    deciding the job); ``clear`` takes the operator's policy back."""
    if req.clear or not req.spec:
        if not req.clear or req.spec:
            raise AdminError("invalid", "set-policy: give a policy spec or clear")
        return _clear(req.job, ctx)
    job = ctx.known_job(req.job)
    try:
        if not job.decides:
            ctx.choice.check(req.spec)  # a bad spec is refused here, at once
            decider = ctx.relay(job, "set_policy", spec=req.spec)
            log.info(logfmt("operator_action", action="set_policy", job=job.id, policy=req.spec,
                            relayed_to=decider))  # fmt: skip
            return SetPolicyReply(
                job=job.id, policy=req.spec, previous="", plan_seq=0, relayed_to=decider
            )
        previous, seq = ctx.ops.set_policy(job, req.spec, ctx.now)
    except PolicyError as exc:
        raise AdminError("bad_policy", f"policy spec {req.spec!r}: {exc}") from None
    log.info(logfmt("operator_action", action="set_policy", job=job.id, policy=req.spec,
                    previous=previous, plan_seq=seq))  # fmt: skip
    return SetPolicyReply(job=job.id, policy=req.spec, previous=previous, plan_seq=seq)


def _clear(job_id: str, ctx: AdminContext) -> SetPolicyReply:
    """``set-policy --clear``: the operator's policy taken back (here, where the job is
    decided; a job decided on another host is cleared there)."""
    settings = ctx.settings
    job = ctx.registry.jobs.get(job_id)
    if job is None:
        if job_id not in settings:
            ctx.known_job(job_id)  # raises unknown_job
        before, after = settings.clear_policy(job_id, ctx.now)
        cleared, spec, source, seq = before if before != after else None, after or "", "", 0
    elif not job.decides:
        decider = job.agreed.decided_by if job.agreed is not None else ""
        raise AdminError(
            "not_deciding",
            f"job {job_id!r} is decided by {decider or 'its chief (rank 0)'}'s daemon: "
            f"run `adaptd set-policy --job {job_id} --clear` on that host",
        )
    else:
        cleared, spec, source, seq = ctx.ops.clear_policy(job, ctx.now)
    log.info(logfmt("operator_action", action="clear_policy", job=job_id, cleared=cleared,
                    policy=spec or None, source=source or None, plan_seq=seq))  # fmt: skip
    return SetPolicyReply(job=job_id, policy=spec, previous=cleared or "", plan_seq=seq,
                          cleared=cleared is not None, source=source)  # fmt: skip


def pause(req: PauseRequest, ctx: AdminContext) -> PauseReply:
    """The daemon's side: hold (or release) the job's non-urgent saves, or every active
    job's (every paused job's, to resume); a job decided on another host is asked there."""
    settings, ops = ctx.settings, ctx.ops
    if req.job is not None:
        if req.job not in ctx.registry.jobs and req.job not in settings:
            ctx.known_job(req.job)  # raises unknown_job
        targets = [req.job]
    elif req.paused:
        targets = [j.id for j in ctx.active_jobs()]
    else:
        targets = settings.paused_jobs()
    changed, relayed = [], []
    op = "pause" if req.paused else "resume"
    for job_id in targets:
        job = ctx.registry.jobs.get(job_id)
        if job is not None and not job.decides:
            if job.state == "active":
                ctx.relay(job, op)
                relayed.append(job_id)
        elif ops.pause(job_id, req.paused, ctx.now):
            changed.append(job_id)
    log.info(logfmt("operator_action", action=op, job=req.job or "--all",
                    changed=",".join(changed) or "none",
                    relayed=",".join(relayed) or None))  # fmt: skip
    return PauseReply(jobs=changed, paused=req.paused, targets=len(targets), relayed=relayed)


# ------------------------------------------------------------------ relayed to this host
# What the deciding daemon does with an operation an operator typed on another host
# (a job protocol Request, handed over by the job's chief, its signature checked):
# the figures logged with it (``event=operator_action``), or RequestRefused.


def relayed_set_policy(ops: JobOps, job: Job, msg: p.Request, now: float) -> dict[str, object]:
    try:
        previous, seq = ops.set_policy(job, msg.spec, now)
    except PolicyError as exc:
        raise RequestRefused(f"policy spec {msg.spec!r}: {exc}") from None
    return {"policy": msg.spec, "previous": previous, "plan_seq": seq}


def relayed_pause(ops: JobOps, job: Job, msg: p.Request, now: float) -> dict[str, object]:
    return {"changed": ops.pause(job.id, True, now)}


def relayed_resume(ops: JobOps, job: Job, msg: p.Request, now: float) -> dict[str, object]:
    return {"changed": ops.pause(job.id, False, now)}


def relayed_save_now(ops: JobOps, job: Job, msg: p.Request, now: float) -> dict[str, object]:
    return {"ranks": ops.save_now(job, msg.reason or "save-now", now)}
