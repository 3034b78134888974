"""``adaptd resume --job J | --all``: lift ``adaptd pause``; the job's plan is pushed again."""

from __future__ import annotations

import argparse

from adaptd.commands import _operator, pause

HELP = "let a paused job (or every paused job) save on its plan again"


def configure(parser: argparse.ArgumentParser) -> None:
    _operator.add_target_args(parser, "every paused job (also ones not running now)")
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace) -> int:
    return pause.run(args, paused=False)
