"""The ``adaptd`` entry point: each command's help is the command's own ``HELP``."""

from __future__ import annotations

import argparse
import importlib

from adaptd import cli


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_commands_help_comes_from_its_module() -> None:
    parser = cli.build_parser()
    listing = parser.format_help()
    for name, sub in _subparsers(parser).items():
        help_ = importlib.import_module(cli.COMMANDS[name]).HELP
        assert sub.description == help_, name
        assert " ".join(help_.split()[:3]) in " ".join(listing.split()), name
    assert set(_subparsers(parser)) == set(cli.COMMANDS)


def test_a_named_command_builds_only_its_own_arguments() -> None:
    subs = _subparsers(cli.build_parser("status"))
    assert any("--json" in a.option_strings for a in subs["status"]._actions)
    assert not any("--config" in a.option_strings for a in subs["serve"]._actions)
