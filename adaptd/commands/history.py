"""``adaptd history JOB [--since WHEN] [--json]``: a job's saves as a table, newest last.

Per save: when it ended, the step, the rank (for a job of several), its tier (``local``
for a two-tier job's save to its local tier only, else ``durable``), why it was taken,
how long it blocked the loop, how long until it was durable, its size and whether it
succeeded (the error of each failed one below the table). ``--json`` prints the
daemon's reply for scripts.

It asks the running daemon on its admin socket, as ``adaptd status`` does, rather
than reading the state database: the operator who may run ``status`` may run this
(root, the daemon's user, ``daemon.admin_group``), while the database under
systemd's ``StateDirectory`` is the daemon user's alone (mode 0700); no path to the
database or config is needed; and the daemon flushes its queued rows first, so a
save reported a second ago is listed. ``adaptd report`` reads the database itself,
for a host whose daemon is stopped. The daemon's side is
:func:`adaptd.daemon.admin.answers.history`.
"""

from __future__ import annotations

import argparse
import time

from adaptd import tables
from adaptd.commands import _operator
from adaptd.protocol.admin import MAX_HISTORY, HistoryReply, HistoryRequest
from adaptd.protocol.job import tier_name
from adaptd.tables import Table

HELP = "show a job's saves (step, tier, reason, blocked, durable, size, ok/error), newest last"

DEFAULT_LIMIT = 100


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="the job id (as `adaptd status` shows it)")
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only saves from then on: a duration back from now (30m, 6h, 2d, 1w), an ISO "
        "date/time (UTC unless it has an offset) or Unix seconds",
    )
    parser.add_argument(
        "--limit",
        metavar="N",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"the newest N saves at most (default {DEFAULT_LIMIT}, at most {MAX_HISTORY})",
    )
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace) -> int:
    from adaptd.commands import UsageError
    from adaptd.commands.report import parse_since

    if not 1 <= args.limit <= MAX_HISTORY:
        raise UsageError(f"--limit must be in [1, {MAX_HISTORY}], got {args.limit}")
    since = parse_since(args.since) if args.since else None
    req = HistoryRequest(job=args.job, since=since, limit=args.limit)
    return _operator.call(
        "history", args, req, lambda r: tables.emit(parts(r, since=since, limit=args.limit))
    )


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _row(s, ranks: bool) -> tuple[str, ...]:
    rank = (str(s.rank),) if ranks else ()
    figures = (tables.duration(s.blocking_s), tables.duration(s.durable_s), tables.size(s.bytes))
    return (_when(s.ended), str(s.step), *rank, tier_name(s.tier), s.reason or "-", *figures,
            "ok" if s.ok else "FAILED")  # fmt: skip


def parts(reply: object, *, since: float | None = None, limit: int = DEFAULT_LIMIT) -> list:
    """The saves as a table (rank shown when more than one saved), the errors of the
    failed ones, and a line of totals."""
    assert isinstance(reply, HistoryReply)
    window = f" since {_when(since)}" if since is not None else ""
    if not reply.saves:
        return [f"{reply.job}: no saves{window}"]
    ranks = len({s.rank for s in reply.saves}) > 1
    header = ("ENDED", "STEP", *(("RANK",) if ranks else ()), "TIER", "REASON", "BLOCKED",
              "DURABLE", "SIZE", "RESULT")  # fmt: skip
    rows = [_row(s, ranks) for s in reply.saves]
    numeric = frozenset(range(1, 3 if ranks else 2)) | frozenset(
        range(len(header) - 4, len(header) - 1)
    )
    out: list[tables.Part] = [Table(header, rows, numeric=numeric)]
    failed = [s for s in reply.saves if not s.ok]
    if failed:
        out.append(
            "\n".join(
                f"step {s.step}" + (f" rank {s.rank}" if ranks else "") + f" failed: {s.error}"
                for s in failed
            )
        )
    total = f"\n{reply.job}: {len(reply.saves)} saves{window}, {len(failed)} failed"
    if reply.more:
        total += f"; older ones left out (the newest {limit} shown: --limit for more)"
    out.append(total)
    return out
