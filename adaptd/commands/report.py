"""``adaptd report --job J --out FILE.png|FILE.html``: plot a job's save history.

Reads the daemon's state database read-only (safe beside a running daemon; no
daemon needed at all). The database is ``--db``, else the one the config names
(``daemon.db_path``), which is also where the slow-save line comes from
(``metrics.slow_save_s``). Drawing is in :mod:`adaptd.commands._report_figures`.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from adaptd.commands import UsageError

HELP = "plot a job's save history"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", required=True, metavar="JOB", help="the job to plot")
    parser.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="FILE.png (the figure) or FILE.html (figure and a table of the last saves)",
    )
    parser.add_argument(
        "--db", metavar="PATH", help="the state database (default: the config's daemon.db_path)"
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="the daemon's config, for the database and metrics.slow_save_s "
        "(default: $ADAPTD_CONFIG or /etc/adaptd/adaptd.toml, if present)",
    )
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only history from then on: a duration back from now (30m, 6h, 2d, 1w), "
        "an ISO date/time (UTC unless it has an offset) or Unix seconds",
    )


def parse_since(text: str, *, now: float | None = None) -> float:
    """``--since`` as Unix seconds. Raises :class:`UsageError` naming the value."""
    now = time.time() if now is None else now
    if m := _DURATION.match(text):
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"--since {text!r}: not a duration (30m, 6h, 2d, 1w), an ISO date/time "
            "(2025-06-01T12:00) or Unix seconds"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def run(args: argparse.Namespace) -> int:
    from adaptd.commands import _report_figures as report
    from adaptd.config import loader as config
    from adaptd.state.store import Store, StoreError

    out = Path(args.out)
    if out.suffix.lower() not in report.FORMATS:
        raise UsageError(f"--out {out}: unknown extension {out.suffix!r}; use .png or .html")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: the directory {out.parent} does not exist")
    since = parse_since(args.since) if args.since else None
    try:
        cfg = config.load(args.config)
    except config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    db = Path(args.db) if args.db else cfg.db_path
    try:
        store = Store.open(db, readonly=True)
    except StoreError as exc:
        hint = "" if args.db else " (or pass --db PATH)"
        raise UsageError(f"{exc}{hint}") from None
    try:
        history = report.load(store, args.job, since=since)
    except report.ReportError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.close()
    try:
        summary = report.write(history, out, slow_save_s=cfg.slow_save_s)
    except report.ReportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write ({exc.strerror})") from None
    print(
        f"wrote {summary.out} ({summary.format}, {summary.bytes / 1024:.0f} KiB, "
        f"{summary.width_px}x{summary.height_px} px): {summary.saves} saves "
        f"({summary.failed} failed, {summary.over_alert} over the "
        f"{report.ALERT_BLOCKING_S:g} s alert), {summary.decisions} decisions"
        + (f", {summary.stalls} hangs detected" if summary.stalls else ""),
        file=sys.stdout,
    )
    return 0
