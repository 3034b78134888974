"""``adaptd drain [--timeout S] [--json]``: every job saves now; wait until all are durable.

For node maintenance: the daemon sends SaveNow to every active job and answers
once each job's ranks have all reported that save durable (or failed, or the job
went away), or after ``--timeout``. The daemon keeps serving meanwhile. Prints one
line per job (job, step saved, durable yes/no, seconds); exit 0 only when every
job's save is durable, 1 otherwise (or when no daemon answers). The daemon's side is
:func:`adaptd.daemon.admin.answers.drain` (:class:`~adaptd.daemon.admin.drains.Drains`).
"""

from __future__ import annotations

import argparse

from adaptd import tables
from adaptd.commands import _operator
from adaptd.protocol.admin import DRAIN_TIMEOUT_S, MAX_DRAIN_S, DrainReply, DrainRequest
from adaptd.tables import Table

HELP = "every job saves now; wait until all saves are durable"
#: Extra seconds the command waits beyond --timeout for the daemon's reply.
REPLY_MARGIN_S = 5.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=DRAIN_TIMEOUT_S,
        help="stop waiting for saves after this long (default: %(default)g)",
    )
    parser.add_argument("--reason", default="drain", help="why (default: %(default)s)")
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace) -> int:
    from adaptd.commands import UsageError

    if not 0 < args.timeout <= MAX_DRAIN_S:
        raise UsageError(f"--timeout must be in (0, {MAX_DRAIN_S:g}] seconds, got {args.timeout:g}")
    req = DrainRequest(timeout_s=args.timeout, reason=args.reason)
    return _operator.call(
        "drain",
        args,
        req,
        lambda r: tables.emit(parts(r)),
        timeout_s=args.timeout + REPLY_MARGIN_S,
        exit_status=lambda r: 0 if all(j.durable for j in r.jobs) else 1,
    )


def render(reply: object) -> str:
    """The drain's outcome as plain text (what a pipe gets)."""
    return tables.plain(parts(reply))


def parts(reply: object) -> list[tables.Part]:
    """One row per job (step saved, durable, seconds, why not), then the total."""
    assert isinstance(reply, DrainReply)
    if not reply.jobs:
        return ["no active jobs: nothing to drain"]
    rows = [
        (
            j.job,
            "-" if j.step is None else str(j.step),
            "yes" if j.durable else "no",
            f"{j.seconds:.2f}",
            j.error,
        )
        for j in reply.jobs
    ]
    durable = sum(j.durable for j in reply.jobs)
    return [
        Table(("JOB", "STEP", "DURABLE", "SECONDS", "NOTE"), rows, numeric=frozenset({1, 3})),
        f"{durable}/{len(reply.jobs)} job(s) durable in {reply.seconds:.2f}s"
        + (" (timed out)" if reply.timed_out else ""),
    ]
