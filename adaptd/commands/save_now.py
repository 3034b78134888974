"""``adaptd save-now --job J | --all [--reason TEXT]``: an urgent save at the next step.

The daemon sends SaveNow to every live rank of the job(s); it does not wait for the
save (``adaptd drain`` does). Exit 1 when the job is unknown or no daemon answers.
The daemon's side is :func:`adaptd.daemon.admin.answers.save_now`.
"""

from __future__ import annotations

import argparse

from adaptd.commands import _operator
from adaptd.protocol.admin import SaveNowReply, SaveNowRequest

HELP = "ask a job (or all jobs) to save at the next step"


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
