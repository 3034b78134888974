"""``adaptd pause --job J | --all``: hold a job's non-urgent saves (storage maintenance).

A paused job's ranks get a plan with no save step; urgent saves (``adaptd
save-now``, ``drain``, an urgent policy) still happen. ``adaptd resume`` lifts it.
The setting outlives the job's restarts and, with a state database, the daemon's.
The daemon's side (of both) is :func:`answer`.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from adaptd.commands import _operator
from adaptd.daemon.logfmt import logfmt
from adaptd.protocol.admin import PauseReply, PauseRequest

if TYPE_CHECKING:
    from adaptd.daemon.admin.context import AdminContext

HELP = "hold a job's (or every job's) non-urgent saves"
REQUEST = PauseRequest
REPLY = PauseReply
PAUSED = True

log = logging.getLogger("adaptd.server")


def configure(parser: argparse.ArgumentParser) -> None:
    _operator.add_target_args(parser, "every active job")
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace, paused: bool = PAUSED) -> int:
    name = "pause" if paused else "resume"
    req = PauseRequest(job=None if args.all else args.job, paused=paused)
    return _operator.call(name, args, req, lambda r: print(text(r, args.job, paused)))


def text(reply: PauseReply, job: str | None, paused: bool) -> str:
    name = "pause" if paused else "resume"
    if reply.jobs or reply.relayed:
        done = (
            [f"{'paused' if paused else 'resumed'}: " + ", ".join(reply.jobs)] if reply.jobs else []
        )
        if reply.relayed:
            done.append("relayed to the host deciding: " + ", ".join(reply.relayed))
        return "; ".join(done)
    if job:
        return f"nothing to {name}: {job} is already {'' if paused else 'not '}paused"
    if not paused:
        return "nothing to resume: no paused job to resume"
    if reply.targets:
        return "nothing to pause: every active job is already paused"
    return "nothing to pause: no active jobs"


def answer(req: PauseRequest, ctx: AdminContext) -> PauseReply:
    """The daemon's side: hold (or release) the job's non-urgent saves, or every active
    job's (every paused job's, to resume); a job decided on another host is asked there."""
    settings, ops = ctx.core.settings, ctx.core.ops
    if req.job is not None:
        if req.job not in ctx.core.registry.jobs and req.job not in settings:
            ctx.known_job(req.job)  # raises unknown_job
        targets = [req.job]
    elif req.paused:
        targets = [j.id for j in ctx.active_jobs()]
    else:
        targets = settings.paused_jobs()
    changed, relayed = [], []
    op = "pause" if req.paused else "resume"
    for job_id in targets:
        job = ctx.core.registry.jobs.get(job_id)
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
