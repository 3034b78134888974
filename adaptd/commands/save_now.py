"""``adaptd save-now --job J | --all [--reason TEXT]``: an urgent save at the next step.

The daemon sends SaveNow to every live rank of the job(s); it does not wait for the
save (``adaptd drain`` does). Exit 1 when the job is unknown or no daemon answers.
"""

from __future__ import annotations

import argparse

from adaptd.commands import _operator

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
    from adaptd.protocol import admin

    req = admin.SaveNowRequest(job=None if args.all else args.job, reason=args.reason)
    reply = _operator.ask("save-now", args, req, args.answer_timeout)
    if reply is None:
        return 1
    assert isinstance(reply, admin.SaveNowReply)
    if args.json:
        _operator.print_json(reply)
    elif not reply.jobs:
        print("no active jobs: nothing to save")
    else:
        print(
            f"asked {len(reply.jobs)} job(s), {reply.ranks} rank(s) to save: "
            + ", ".join(reply.jobs)
            + (
                f" (relayed to the host deciding: {', '.join(reply.relayed)})"
                if reply.relayed
                else ""
            )
        )
    return 0
