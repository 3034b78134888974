"""The ``adaptd`` command: one entry point with subcommands.

Subcommands are the modules named in :data:`adaptd.commands.COMMANDS`, imported lazily
so a quick command stays quick. Errors a user can fix (bad flags, bad config, no daemon) print one
clear line and exit non-zero; they never show a traceback. A command whose output pipe
closes early (``adaptd status | head -1``) stops quietly with the status a shell gives a
program killed by SIGPIPE (141), as ``cat`` would.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Sequence
from types import ModuleType

from adaptd import __version__
from adaptd.commands import COMMANDS, UsageError

__all__ = [
    "BROKEN_PIPE_STATUS",
    "COMMANDS",
    "UsageError",
    "build_parser",
    "main",
]


#: Exit status when the reader of stdout went away: 128 + SIGPIPE, what a shell reports
#: for a program the signal killed (Python ignores SIGPIPE, so it is set by hand).
BROKEN_PIPE_STATUS = 141


def _available() -> dict[str, str]:
    return {
        name: module
        for name, module in COMMANDS.items()
        if importlib.util.find_spec(module) is not None
    }


def _command(module: str) -> ModuleType:
    return importlib.import_module(module)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``adaptd`` parser. With ``command``, only that command's module is imported
    (its ``HELP`` and arguments): a quick command stays quick. Without one, every
    command's module is imported for the list of commands in ``adaptd --help``."""
    parser = argparse.ArgumentParser(
        prog="adaptd", description="adaptd: adaptive checkpoint scheduling for training jobs"
    )
    parser.add_argument("--version", action="version", version=f"adaptd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in _available().items():
        if command is None or name == command:
            mod = _command(module)
            p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
            if name == command:
                mod.configure(p)
        else:
            p = sub.add_parser(name)
        p.set_defaults(_module=module, _name=name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``adaptd`` command; returns its exit status."""
    try:
        try:
            return _main(argv)
        finally:  # what is still buffered goes now, while a closed pipe can be caught
            sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_gone():  # another pipe or socket broke: that is an error to show
            raise
        # Nothing more can be shown, and Python's flush at exit would fail again with a
        # traceback: point stdout at /dev/null and stop.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return BROKEN_PIPE_STATUS


def _stdout_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader went away (POLLERR/POLLHUP)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):  # no real file behind stdout (a test's capture)
        return False


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The command name first: only its module is imported and adds its arguments.
    name = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(name if name in _available() else None).parse_args(argv)
    module = _command(args._module)
    try:
        return int(module.run(args) or 0)
    except UsageError as exc:
        print(f"adaptd {args._name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
