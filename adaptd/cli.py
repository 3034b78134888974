"""The ``adaptd`` command: one entry point with subcommands.

Subcommands live in :mod:`adaptd.commands`, imported lazily so a quick command
stays quick. Errors a user can fix (bad flags, bad config, no daemon) print one
clear line and exit non-zero; they never show a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from adaptd import __version__

#: name -> (module under adaptd.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("serve", "run the daemon (one per host)"),
    "status": ("status", "show the daemon's jobs, plans and telemetry"),
    "save-now": ("save_now", "ask a job (or all jobs) to save at the next step"),
    "drain": ("drain", "every job saves now; wait until all saves are durable"),
    "set-policy": ("set_policy", "change a running job's policy (the new plan reaches it at once)"),
    "pause": ("pause", "hold a job's (or every job's) non-urgent saves"),
    "resume": ("resume", "let a paused job (or every paused job) save on its plan again"),
    "simulate": ("simulate", "compare policies on failure scenarios"),
    "report": ("report", "plot a job's save history"),
    "verify": ("verify", "check that a TensorFlow checkpoint is complete and restorable"),
    "restore": ("restore", "fetch and verify a checkpoint from a durable destination"),
    "policies": ("policies", "list installed policies and where they come from"),
    "demo": ("demo", "run a daemon and a small real TensorFlow job, with a crash and resume"),
}


class UsageError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


def _available() -> dict[str, tuple[str, str]]:
    out = {}
    for name, (module, help_) in COMMANDS.items():
        if importlib.util.find_spec(f"adaptd.commands.{module}") is not None:
            out[name] = (module, help_)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adaptd", description="adaptd: adaptive checkpoint scheduling for training jobs"
    )
    parser.add_argument("--version", action="version", version=f"adaptd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        # configure lazily-imported modules only for the command being parsed
        p.set_defaults(_name=name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Parse the command name first, then let that module add its own arguments.
    commands = _available()
    name = next((a for a in argv if not a.startswith("-")), None)
    if name in commands:
        module = importlib.import_module(f"adaptd.commands.{commands[name][0]}")
        sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        module.configure(sub_action.choices[name])
    args = parser.parse_args(argv)
    module = importlib.import_module(f"adaptd.commands.{args._module}")
    try:
        return int(module.run(args) or 0)
    except UsageError as exc:
        print(f"adaptd {args._name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
