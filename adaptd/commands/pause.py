"""``adaptd pause --job J | --all``: hold a job's non-urgent saves (storage maintenance).

A paused job's ranks get a plan with no save step; urgent saves (``adaptd
save-now``, ``drain``, an urgent policy) still happen. ``adaptd resume`` lifts it.
The setting outlives the job's restarts and, with a state database, the daemon's.
"""

from __future__ import annotations

import argparse

from adaptd.commands import _operator

HELP = "hold a job's (or every job's) non-urgent saves"
PAUSED = True


def configure(parser: argparse.ArgumentParser) -> None:
    _operator.add_target_args(parser, "every active job")
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace, paused: bool = PAUSED) -> int:
    from adaptd.protocol import admin

    name = "pause" if paused else "resume"
    req = admin.PauseRequest(job=None if args.all else args.job, paused=paused)
    reply = _operator.ask(name, args, req, args.answer_timeout)
    if reply is None:
        return 1
    assert isinstance(reply, admin.PauseReply)
    if args.json:
        _operator.print_json(reply)
    elif reply.jobs or reply.relayed:
        done = (
            [f"{'paused' if paused else 'resumed'}: " + ", ".join(reply.jobs)] if reply.jobs else []
        )
        if reply.relayed:
            done.append("relayed to the host deciding: " + ", ".join(reply.relayed))
        print("; ".join(done))
    elif args.job:
        print(f"nothing to {name}: {args.job} is already {'' if paused else 'not '}paused")
    elif not paused:
        print("nothing to resume: no paused job to resume")
    elif reply.targets:
        print("nothing to pause: every active job is already paused")
    else:
        print("nothing to pause: no active jobs")
    return 0
