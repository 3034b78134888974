"""The CLI side every operator command shares (status, history, save-now, drain,
set-policy, pause, resume, and any command added to :data:`adaptd.commands.COMMANDS`).

Each asks the daemon's admin socket once, with a deadline: with no daemon (or one that
does not answer) it prints one line naming the socket and exits 1, never hangs. With
``--json`` it prints the daemon's reply as JSON, for scripts; else the command's text.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import msgspec

#: How long a command waits for the daemon's answer unless told (``--answer-timeout``).
ANSWER_TIMEOUT_S = 3.0


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


def add_socket_args(
    parser: argparse.ArgumentParser,
    timeout: float = ANSWER_TIMEOUT_S,
    *,
    json_help: str = "print the daemon's reply as JSON",
    timeout_flag: str = "--answer-timeout",
) -> None:
    """``--socket``, ``--json`` and the deadline (``--answer-timeout``, or the flag the
    command has always called it), stored as ``args.answer_timeout``."""
    parser.add_argument("--socket", metavar="PATH", help="the daemon's job socket")
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument(
        timeout_flag,
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


def ask(
    name: str, args: argparse.Namespace, req: object, timeout_s: float, reply: type | None = None
) -> Any | None:
    """Send ``req`` (its answer is a ``reply``: a command's own reply type, else one of the
    built-in ones); on failure print ``adaptd NAME: message`` and return ``None``."""
    from adaptd.protocol import admin, paths

    try:
        return admin.request(
            paths.socket_path(args.socket),
            req,  # type: ignore[arg-type]
            timeout_s=timeout_s,
            reply=reply,
        )
    except admin.AdminError as exc:
        print(f"adaptd {name}: {exc}", file=sys.stderr)
        return None


def call(
    name: str,
    args: argparse.Namespace,
    req: object,
    show: Callable[[Any], object],
    *,
    reply: type | None = None,
    timeout_s: float | None = None,
    exit_status: Callable[[Any], int] | None = None,
) -> int:
    """The whole CLI side of an operator command: ask (``timeout_s``, default
    ``args.answer_timeout``), then print the reply as JSON (``--json``) or as ``show``
    writes it. Returns the exit status: 1 when the daemon did not answer, else
    ``exit_status(reply)`` (default 0)."""
    got = ask(name, args, req, args.answer_timeout if timeout_s is None else timeout_s, reply)
    if got is None:
        return 1
    if args.json:
        print_json(got)
    else:
        show(got)
    return exit_status(got) if exit_status is not None else 0


def print_json(reply: object) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(reply), indent=2).decode() + "\n")
