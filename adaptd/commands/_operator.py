"""Shared plumbing of the operator commands (save-now, drain, set-policy, pause, resume).

Each asks the daemon's admin socket once, with a deadline: with no daemon (or one
that does not answer) it prints one line naming the socket and exits 1, never hangs.
"""

from __future__ import annotations

import argparse
import math
import sys

import msgspec


def seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (a negative or NaN deadline made the
    wait for the daemon's answer endless, or crashed)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def add_socket_args(parser: argparse.ArgumentParser, timeout: float = 3.0) -> None:
    parser.add_argument("--socket", metavar="PATH", help="the daemon's job socket")
    parser.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
    parser.add_argument(
        "--answer-timeout",
        metavar="SECONDS",
        type=seconds,
        default=timeout,
        dest="answer_timeout",
        help=f"give up when the daemon does not answer within this long (default: {timeout:g})",
    )


def add_target_args(parser: argparse.ArgumentParser, all_help: str) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--job", metavar="JOB", help="the job id (as `adaptd status` shows it)")
    target.add_argument("--all", action="store_true", help=all_help)


def ask(name: str, args: argparse.Namespace, req: object, timeout_s: float) -> object | None:
    """Send ``req``; on failure print ``adaptd NAME: message`` and return ``None``."""
    from adaptd.protocol import admin, paths

    try:
        return admin.request(paths.socket_path(args.socket), req, timeout_s=timeout_s)  # type: ignore[arg-type]
    except admin.AdminError as exc:
        print(f"adaptd {name}: {exc}", file=sys.stderr)
        return None


def print_json(reply: object) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(reply), indent=2).decode() + "\n")
