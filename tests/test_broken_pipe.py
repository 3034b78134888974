"""Every command stops quietly when the reader of its output goes away.

``adaptd serve --check-config --json | head -1`` ended in a traceback (BrokenPipeError).
Here the pipe's read end is closed before the command starts, so its first write fails
every time (a ``| head -1`` only fails when the output outgrows the pipe's buffer).
The commands that ask a daemon are checked in tests/daemon/test_history.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptd.cli import BROKEN_PIPE_STATUS

CLI = [sys.executable, "-m", "adaptd.cli"]


def run_into_closed_pipe(args: list[str], timeout: float = 60.0) -> tuple[int, str]:
    """Run ``adaptd ARGS`` with stdout a pipe nobody reads; (exit status, stderr)."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            [*CLI, *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=timeout
        )
    finally:
        os.close(write)
    return r.returncode, r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--check-config", "--json"],
        ["serve", "--check-config"],
        ["policies"],
        ["simulate", "--scenario", "seed-article", "--policy", "young", "--seeds", "1",
         "--jobs", "1"],
        ["demo", "--dir", "{tmp}"],  # stops at its first line: nothing is started
    ],
    ids=["check-config-json", "check-config", "policies", "simulate", "demo"],
)  # fmt: skip
def test_a_command_whose_output_pipe_is_closed_exits_quietly(args, tmp_path: Path) -> None:
    args = [a.replace("{tmp}", str(tmp_path / "demo")) for a in args]
    rc, err = run_into_closed_pipe(args)
    assert (rc, err) == (BROKEN_PIPE_STATUS, "")
    if args[0] == "demo":
        assert not (tmp_path / "demo" / "daemon.log").exists()


def test_help_into_a_closed_pipe_is_quiet() -> None:
    rc, err = run_into_closed_pipe(["--help"])
    assert err == "" and rc in (0, BROKEN_PIPE_STATUS)


def test_a_broken_pipe_that_is_not_stdout_is_an_error_shown() -> None:
    """Only a closed stdout is quiet: a command whose socket or child pipe broke fails
    with its traceback (here a command made to raise one while stdout is read)."""
    code = (
        "import sys\n"
        "import adaptd.commands.policies as cmd\n"
        "from adaptd import cli\n"
        "def run(args): raise BrokenPipeError(32, 'the upload socket')\n"
        "cmd.run = run\n"
        "sys.exit(cli.main(['policies']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "BrokenPipeError: [Errno 32] the upload socket" in r.stderr
