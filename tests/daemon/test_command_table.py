"""An operator command is one entry in the daemon's table, plus its answer (issues 22, 32).

``adaptd.daemon.admin.commands.OPERATOR_COMMANDS`` names each operator command the daemon
answers: its request, its reply, its answer and, for a command that acts on a job decided
on another host, the operations it is relayed as, what the deciding daemon does with
each, and whether they travel only signed. ``adaptd.commands.COMMANDS`` is the CLI's
table; the daemon imports no command. A command that exists only in these tests
(tests/daemon/echo_command.py: its CLI side, its own request and reply, its answer) is
registered by one entry in each and runs end to end: ``adaptd echo`` asks a real daemon
on its real admin socket, which answers through the entry. A daemon built without the
entry refuses the request, and a relayed operation does what its entry says, signed or
not: the table decides.
"""

from __future__ import annotations

import dataclasses
import json
import typing as t
from pathlib import Path

import pytest
from daemon_helpers import Peer, thread_daemon
from test_relay_auth import chief_and_worker, refused, request  # noqa: F401 (a fixture)

from adaptd import cli
from adaptd.commands import COMMANDS
from adaptd.daemon.admin import answers
from adaptd.daemon.admin import commands as table
from adaptd.daemon.admin.commands import CommandError, OperatorCommand, OperatorCommands
from adaptd.protocol import admin
from adaptd.protocol import job as p


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registration of the test-only command: its line in the CLI's table and its
    entry in the daemon's."""
    from echo_command import EchoReply, EchoRequest, answer

    monkeypatch.setitem(COMMANDS, "echo", "echo_command")
    entry = OperatorCommand(EchoRequest, EchoReply, answer)
    monkeypatch.setattr(table, "OPERATOR_COMMANDS", (*table.OPERATOR_COMMANDS, entry))


def test_a_command_added_by_one_entry_runs_end_to_end(echo, short_dir: Path, zctx, capsys) -> None:
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


def test_every_request_of_the_admin_protocol_has_its_entry_and_every_relayed_operation() -> None:
    commands = OperatorCommands.from_table()
    assert set(commands.answers) == set(t.get_args(admin.AnyRequest))
    assert {c.reply for c in commands.table} <= set(t.get_args(admin.AnyReply))
    # the job protocol's relayed operations (the wire's list) are the table's
    assert set(commands.relayed) == set(t.get_args(p.Operation))
    # only an operator may ask these: relayed, they must carry a daemon's signature
    signed = {op for op, r in commands.relayed.items() if r.signed}
    assert signed == {"set_policy", "pause", "resume"}


def _save_now_entry(monkeypatch: pytest.MonkeyPatch, **changes: object) -> None:
    """The daemon's table with save-now's entry changed (set before the daemons start)."""
    changed = tuple(
        dataclasses.replace(c, **changes) if c.request is admin.SaveNowRequest else c  # type: ignore[arg-type]
        for c in table.OPERATOR_COMMANDS
    )
    monkeypatch.setattr(table, "OPERATOR_COMMANDS", changed)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """save-now's relayed operation, counted: (job, origin) of each one the deciding
    daemon ran."""
    ran: list[tuple[str, str]] = []

    def relayed(ops, job, msg, now):  # type: ignore[no-untyped-def]
        ran.append((job.id, msg.origin))
        return answers.relayed_save_now(ops, job, msg, now)

    _save_now_entry(monkeypatch, relayed={"save_now": relayed})
    return ran


def test_what_a_relayed_operation_does_is_its_entry(counted, chief_and_worker) -> None:  # noqa: F811
    _, _, chief, _ = chief_and_worker
    chief.send(request("save_now"))
    assert chief.expect(p.SaveNow).job == "mw"
    assert counted == [("mw", "host-b")]


@pytest.fixture
def signed_save_now(monkeypatch: pytest.MonkeyPatch) -> None:
    _save_now_entry(monkeypatch, signed=True)


def test_whether_a_relayed_operation_must_be_signed_is_its_entry(
    signed_save_now,
    chief_and_worker,  # noqa: F811
) -> None:
    _, _, chief, _ = chief_and_worker
    chief.send(request("save_now"))  # unsigned: any rank could have made it up
    assert "only an operator may ask it" in refused(chief)


def test_a_table_entry_that_cannot_be_a_command_is_a_start_up_error() -> None:
    status = OperatorCommand(admin.StatusRequest, admin.StatusReply, answers.status)
    bad = {
        "is no OperatorCommand": ["status"],
        "the request must be": [dataclasses.replace(status, request=dict)],
        "the reply must be": [dataclasses.replace(status, reply=admin.StatusRequest)],
        "StatusRequest is answered by None": [dataclasses.replace(status, answer=None)],
        "StatusRequest is in the table of operator commands twice": [status, status],
        "signed, but it names no relayed operation": [dataclasses.replace(status, signed=True)],
        "the relayed operation 'pause' is another command's too": [
            dataclasses.replace(status, relayed={"pause": answers.relayed_pause}),
            OperatorCommand(
                admin.PauseRequest,
                admin.PauseReply,
                answers.pause,
                relayed={"pause": answers.relayed_pause},
            ),
        ],
    }
    for message, entries in bad.items():
        with pytest.raises(CommandError, match=message):
            OperatorCommands.from_table(entries)  # type: ignore[arg-type]
