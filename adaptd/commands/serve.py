"""``adaptd serve``: run the daemon in the foreground (systemd runs it this way).

Logs go to stderr, one structured ``key=value`` line per event that matters
(plan changes, saves, jobs lost). SIGTERM and SIGINT end it cleanly with exit
status 0: the sockets are closed and their files removed. A start-up problem (a
bad ``--policy``, another daemon on the socket) is one line and exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from adaptd import policy

HELP = "run the daemon (one per host)"

LEVELS = ("debug", "info", "warning", "error")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="job socket path (default: $ADAPTD_SOCKET, /run/adaptd/adaptd.sock, "
        "$XDG_RUNTIME_DIR/adaptd/adaptd.sock or a per-user temp dir)",
    )
    parser.add_argument(
        "--policy",
        metavar="SPEC",
        default=policy.DEFAULT_SPEC,
        help=f"policy for jobs that do not name one (default: {policy.DEFAULT_SPEC!r})",
    )
    parser.add_argument(
        "--silence-timeout",
        metavar="SECONDS",
        type=float,
        default=300.0,
        help="a rank that sends nothing for this long is marked lost (default: 300)",
    )
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="default: info")


def run(args: argparse.Namespace) -> int:
    from adaptd.server import Daemon, DaemonError

    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        daemon = Daemon(args.socket, policy=args.policy, silence_timeout_s=args.silence_timeout)
        daemon.open()
    except DaemonError as exc:
        print(f"adaptd serve: {exc}", file=sys.stderr)
        return 1

    def on_signal(signum: int, frame: object) -> None:
        logging.getLogger("adaptd.server").info(
            "event=signal signal=%s", signal.Signals(signum).name
        )
        daemon.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # the C-level handler writes to this fd, which wakes the poll at once
    previous = signal.set_wakeup_fd(daemon.wakeup_fd, warn_on_full_buffer=False)
    try:
        daemon.serve()
    finally:
        signal.set_wakeup_fd(previous)
    return 0
