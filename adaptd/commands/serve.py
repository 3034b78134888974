"""``adaptd serve``: run the daemon in the foreground (systemd runs it this way).

Settings come from the config file (``--config``, else ``$ADAPTD_CONFIG``, else
``/etc/adaptd/adaptd.toml`` if present, else built-in defaults); the flags below
override it. ``--check-config`` prints the effective settings as a config file (with
``--json``: as JSON), named and written as the file names and writes them, and exits
0, or prints what is wrong on one line and exits 1, without starting anything.

Logs go to stderr, one structured ``key=value`` line per event that matters
(plan changes, saves, jobs lost). SIGTERM and SIGINT drain (every job is asked to
save; the daemon waits up to ``daemon.drain_grace_s`` for the saves) and end with
exit status 0; a second signal stops at once. A start-up problem (a bad setting,
another daemon on the socket, a busy metrics port named in the config) is one
line and exit status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

from adaptd.config.schema import DRAIN_GRACE_S, LIVENESS_TIMEOUT_S, METRICS_LISTEN
from adaptd.core import policy

HELP = "run the daemon (one per host)"

LEVELS = ("debug", "info", "warning", "error")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML config file (default: $ADAPTD_CONFIG, else /etc/adaptd/adaptd.toml "
        "if it exists, else built-in defaults)",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="validate the config, print the effective settings (as a config file) and exit",
    )
    parser.add_argument(
        "--json", action="store_true", help="with --check-config: print the settings as JSON"
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="job socket path (default: daemon.socket, $ADAPTD_SOCKET, /run/adaptd/adaptd.sock, "
        "$XDG_RUNTIME_DIR/adaptd/adaptd.sock or a per-user temp dir)",
    )
    parser.add_argument(
        "--policy",
        metavar="SPEC",
        help=f"policy for jobs that do not name one (default: policy.default, "
        f"{policy.DEFAULT_SPEC!r})",
    )
    parser.add_argument(
        "--silence-timeout",
        metavar="SECONDS",
        type=float,
        help="a rank that sends nothing for this long is marked lost "
        f"(default: daemon.liveness_timeout_s, {LIVENESS_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--drain-grace",
        metavar="SECONDS",
        type=float,
        help="on SIGTERM/SIGINT, wait this long for the jobs' final saves; 0 stops at once "
        f"(default: daemon.drain_grace_s, {DRAIN_GRACE_S:g})",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="directory of the state database (default: daemon.state_dir, $STATE_DIRECTORY "
        "or $XDG_STATE_HOME/adaptd)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help='Prometheus endpoint, or "off" (default: metrics.listen, {}:{})'.format(
            *METRICS_LISTEN
        ),
    )
    parser.add_argument("--log-level", choices=LEVELS, help="default: daemon.log_level, info")
    parser.add_argument(
        "--etcd",
        metavar="URL",
        action="append",
        help="an etcd endpoint of the fleet (repeatable; default: fleet.etcd, $ADAPTD_ETCD); "
        "daemons sharing one etcd share write slots and failures (docs/fleet.md)",
    )


def run(args: argparse.Namespace) -> int:
    from adaptd.config import loader as config
    from adaptd.daemon.service import Service, ServiceError

    try:
        cfg = config.load(args.config).with_overrides(
            socket=args.socket,
            policy=args.policy,
            liveness_timeout_s=args.silence_timeout,
            log_level=args.log_level,
            state_dir=args.state_dir,
            metrics_listen=args.metrics_listen,
            drain_grace_s=args.drain_grace,
        )
        if args.etcd:
            from adaptd.fleet.config import with_endpoints

            try:
                cfg = dataclasses.replace(cfg, fleet=with_endpoints(cfg.fleet, args.etcd))
            except ValueError as exc:
                raise config.ConfigError(f"--etcd: {exc}") from None
    except config.ConfigError as exc:
        print(f"adaptd serve: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    if args.check_config:
        print(json.dumps(cfg.as_dict(), indent=2) if args.json else cfg.to_toml(), end="\n")
        return 0
    logging.basicConfig(
        stream=sys.stderr,
        level=cfg.log_level_number,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # A busy metrics port is fatal when someone chose the address (metrics.listen in the
    # file, or --metrics-listen); with the built-in default it only turns metrics off,
    # so a second daemon (the demo's, one with a config file for its fleet) still runs.
    strict = "metrics.listen" in cfg.chosen
    service = Service(cfg, metrics_strict=strict)
    try:
        service.open()
    except ServiceError as exc:
        print(f"adaptd serve: {exc}", file=sys.stderr)
        return 1
    try:
        service.serve()
    finally:
        service.close()
    return 0
