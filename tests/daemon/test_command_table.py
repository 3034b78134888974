"""An operator command is one module plus its line in the table (issue 22 item 6).

``adaptd.commands.COMMANDS`` is the one table both the CLI and the daemon's admin handler
read. A command that exists only in these tests (tests/daemon/echo_command.py: its CLI
side, its own request and reply, its daemon side) is registered by one entry and runs end
to end: ``adaptd echo`` asks a real daemon on its real admin socket, which answers through
the module. A daemon built without the entry refuses the request: the table decides what
the daemon answers. And the built-in protocol's every request has its command there.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest
from daemon_helpers import Peer, thread_daemon

from adaptd import cli
from adaptd.commands import COMMANDS
from adaptd.daemon.admin.commands import CommandError, OperatorCommands
from adaptd.protocol import admin


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registration line of the test-only command."""
    monkeypatch.setitem(COMMANDS, "echo", "echo_command")


def test_a_command_added_by_one_module_runs_end_to_end(echo, short_dir: Path, zctx, capsys) -> None:
    sock = short_dir / "adaptd.sock"
    with thread_daemon(sock):
        peer = Peer(zctx, f"ipc://{sock}")
        peer.hello("train-1")
        assert cli.main(["echo", "--socket", str(sock), "hello", "--job", "train-1"]) == 0
        assert capsys.readouterr().out == "HELLO (1 jobs, active)\n"
        assert cli.main(["echo", "--socket", str(sock), "--json", "hi"]) == 0
        assert json.loads(capsys.readouterr().out) == {
            "op": "echo", "v": admin.ADMIN_VERSION, "text": "HI", "jobs": 1, "state": ""
        }  # fmt: skip
        # its daemon side refuses as every command does: one line, exit 1
        assert cli.main(["echo", "--socket", str(sock), "x", "--job", "nosuch"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("adaptd echo: job 'nosuch' is unknown; known jobs: train-1")
        peer.close()
    assert "echo" in cli.build_parser().format_help()


def test_a_daemon_answers_only_the_commands_in_its_table(short_dir: Path, capsys) -> None:
    from echo_command import EchoReply, EchoRequest

    sock = short_dir / "adaptd.sock"
    with thread_daemon(sock), pytest.raises(admin.AdminError) as info:
        admin.request(sock, EchoRequest(text="hi"), timeout_s=10, reply=EchoReply)
    assert info.value.code == "invalid" and "echo" in str(info.value)


def test_every_request_of_the_admin_protocol_has_its_command_in_the_table() -> None:
    answered = set(OperatorCommands.from_table().answers)
    assert answered == set(t.get_args(admin.AnyRequest))


def test_a_table_entry_that_is_no_command_is_a_start_up_error(monkeypatch) -> None:
    monkeypatch.setitem(COMMANDS, "twin", "adaptd.commands.pause")  # answers PauseRequest again
    with pytest.raises(CommandError, match="'pause' and 'twin' both answer PauseRequest"):
        OperatorCommands.from_table()
    monkeypatch.setitem(COMMANDS, "twin", "no_such_module_here")
    with pytest.raises(CommandError, match="cannot import no_such_module_here"):
        OperatorCommands.from_table()
