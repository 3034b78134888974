"""``adaptd echo TEXT [--job J]``: a command that exists only in the tests.

It is the whole of a new operator command, in one module: the CLI side (``HELP``,
``configure``, ``run``), its own request and reply on the admin protocol (a tag of their
own: no built-in struct is touched), and its daemon side (``answer``). Registering it is
one line in :data:`adaptd.commands.COMMANDS` for the CLI and one entry,
``OperatorCommand(EchoRequest, EchoReply, answer)``, in the daemon's
:data:`adaptd.daemon.admin.commands.OPERATOR_COMMANDS` (tests/daemon/test_command_table.py
does both); the two sides share nothing but the request and reply.
"""

from __future__ import annotations

import argparse

from adaptd.commands import _operator
from adaptd.protocol.admin import Reply, Request

HELP = "say TEXT back, loud, with the daemon's job count (a command of the tests)"


class EchoRequest(Request, frozen=True, tag="echo"):
    text: str
    job: str | None = None


class EchoReply(Reply, frozen=True, tag="echo"):
    text: str
    jobs: int
    state: str = ""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", metavar="TEXT")
    parser.add_argument("--job", metavar="JOB", help="also say what state this job is in")
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace) -> int:
    req = EchoRequest(text=args.text, job=args.job)
    return _operator.call("echo", args, req, lambda r: print(_text(r)), reply=EchoReply)


def _text(reply: EchoReply) -> str:
    return f"{reply.text} ({reply.jobs} jobs" + (f", {reply.state})" if reply.state else ")")


def answer(req: EchoRequest, ctx) -> EchoReply:  # type: ignore[no-untyped-def]
    state = ctx.known_job(req.job).state if req.job else ""
    return EchoReply(text=req.text.upper(), jobs=len(ctx.registry), state=state)
