"""``adaptd save-now --job J | --all [--reason TEXT]``: an urgent save at the next step.

The daemon sends SaveNow to every live rank of the job(s); it does not wait for the
save (``adaptd drain`` does). Exit 1 when the job is unknown or no daemon answers.
The daemon's side is :func:`answer`.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from adaptd.commands import _operator
from adaptd.daemon.logfmt import logfmt
from adaptd.protocol.admin import SaveNowReply, SaveNowRequest

if TYPE_CHECKING:
    from adaptd.daemon.admin.context import AdminContext

HELP = "ask a job (or all jobs) to save at the next step"
REQUEST = SaveNowRequest
REPLY = SaveNowReply

log = logging.getLogger("adaptd.server")


def configure(parser: argparse.ArgumentParser) -> None:
    _operator.add_target_args(parser, "every active job")
    parser.add_argument(
        "--reason",
        default="operator request",
        help="why (logged, stored with the save; default: %(default)s)",
    )
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace) -> int:
    req = SaveNowRequest(job=None if args.all else args.job, reason=args.reason)
    return _operator.call("save-now", args, req, lambda r: print(text(r)))


def text(reply: SaveNowReply) -> str:
    if not reply.jobs:
        return "no active jobs: nothing to save"
    relayed = (
        f" (relayed to the host deciding: {', '.join(reply.relayed)})" if reply.relayed else ""
    )
    asked = f"asked {len(reply.jobs)} job(s), {reply.ranks} rank(s) to save: "
    return asked + ", ".join(reply.jobs) + relayed


def answer(req: SaveNowRequest, ctx: AdminContext) -> SaveNowReply:
    """The daemon's side: every live rank of the job (or of every active job) saves at
    one step soon; a job decided on another host is asked there, through its rank."""
    jobs = ctx.active_jobs() if req.job is None else [ctx.active_job(req.job)]
    ranks, relayed = 0, []
    for job in jobs:
        if job.decides:
            ranks += ctx.core.ops.save_now(job, req.reason, ctx.now)
        else:
            ctx.relay(job, "save_now", reason=req.reason)
            relayed.append(job.id)
    log.info(logfmt("operator_action", action="save_now", job=req.job or "--all",
                    jobs=len(jobs), ranks=ranks, relayed=",".join(relayed) or None,
                    reason=req.reason))  # fmt: skip
    return SaveNowReply(jobs=[j.id for j in jobs], ranks=ranks, relayed=relayed)
