"""An operator command is its module plus its entries in two tables (issues 22 and 32).

``adaptd.commands.COMMANDS`` is the CLI's table; ``adaptd.daemon.admin.commands.ANSWERS``
the daemon's (request type -> its answer): the daemon imports no command. A command that
exists only in these tests (tests/daemon/echo_command.py: its CLI side, its own request
and reply, its daemon side) is registered by one entry in each and runs end to end:
``adaptd echo`` asks a real daemon on its real admin socket, which answers through the
module. A daemon built without the entry refuses the request: the table decides what the
daemon answers. And the built-in protocol's every request has its answer there.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest
from daemon_helpers import Peer, thread_daemon

from adaptd import cli
from adaptd.commands import COMMANDS
from adaptd.daemon.admin import answers
from adaptd.daemon.admin.commands import ANSWERS, CommandError, OperatorCommands
from adaptd.protocol import admin


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registration lines of the test-only command: the CLI's and the daemon's."""
    import echo_command

    monkeypatch.setitem(COMMANDS, "echo", "echo_command")
    monkeypatch.setitem(ANSWERS, echo_command.EchoRequest, echo_command.answer)


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


def test_a_table_entry_that_is_no_request_and_answer_is_a_start_up_error() -> None:
    with pytest.raises(CommandError, match="'pause' in the table of answers"):
        OperatorCommands.from_table({"pause": answers.pause})  # type: ignore[dict-item]
    with pytest.raises(CommandError, match="PauseRequest is answered by None"):
        OperatorCommands.from_table({admin.PauseRequest: None})  # type: ignore[dict-item]
