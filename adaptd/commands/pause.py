"""``adaptd pause --job J | --all``: hold a job's non-urgent saves (storage maintenance).

A paused job's ranks get a plan with no save step; urgent saves (``adaptd
save-now``, ``drain``, an urgent policy) still happen. ``adaptd resume`` lifts it.
The setting outlives the job's restarts and, with a state database, the daemon's.
The daemon's side (of both) is :func:`adaptd.daemon.admin.answers.pause`.
"""

from __future__ import annotations

import argparse

from adaptd.commands import _operator
from adaptd.protocol.admin import PauseReply, PauseRequest

HELP = "hold a job's (or every job's) non-urgent saves"
PAUSED = True


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
