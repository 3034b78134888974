"""``adaptd policies``: the installed policies and where each comes from."""

from __future__ import annotations

import argparse
import json

from adaptd.core import policy

HELP = "list installed policies and where they come from"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    found = policy.available()
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    width = max((len(n) for n in found), default=4)
    for name, origin in found.items():
        print(f"{name:<{width}}  {origin}")
    return 0
