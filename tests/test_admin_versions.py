"""An operator command and a daemon one version apart still talk (issue 26).

A newer daemon adds fields to its replies (as every release so far did: ``relayed``,
``rounds``, ``decided_by``...). The command of the release before must read such a
reply, keep what it knows and ignore the rest; before the fix every reply forbade
unknown fields and the command failed with ``bad_reply``. Requests stay strict: an
older daemon must not silently drop an option it does not know. A real admin socket
(ZeroMQ REP on the path the commands look for) answered as a newer daemon would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
from test_tables import reply as status_reply

from adaptd import cli
from adaptd.protocol import admin


def newer(reply: admin.Reply) -> bytes:
    """``reply`` as a newer daemon sends it: fields this version does not know, at the
    top, in a nested struct and in a list's items."""
    data = msgspec.to_builtins(reply)
    data["fleet_epoch"] = 7
    if "daemon" in data:
        data["daemon"]["slots_fenced"] = 2
        data["jobs"][0]["gpus_vouched"] = 8
        data["jobs"][0]["ranks"][0]["numa_node"] = 1
    return msgspec.msgpack.encode(data)


@pytest.fixture
def newer_daemon(short_dir: Path) -> Iterator[tuple[Path, list[bytes]]]:
    """The job socket path of a 'daemon' whose admin socket answers each request with
    the next of the replies the test puts in the list."""
    job_socket = short_dir / "adaptd.sock"
    replies: list[bytes] = []
    sock = zmq.Context.instance().socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"ipc://{admin.admin_path(job_socket)}")
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if sock.poll(50):
                sock.recv()
                sock.send(replies.pop(0))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield job_socket, replies
    stop.set()
    t.join(5)
    sock.close(0)


def test_a_status_reply_with_fields_this_version_does_not_know_is_read(
    newer_daemon, capsys
) -> None:
    job_socket, replies = newer_daemon
    replies.append(newer(status_reply()))
    got = admin.request(job_socket, admin.StatusRequest(), timeout_s=10)
    assert isinstance(got, admin.StatusReply) and got == status_reply()
    replies.append(newer(status_reply()))
    assert cli.main(["status", "--socket", str(job_socket)]) == 0
    assert "llm" in capsys.readouterr().out


def test_every_reply_kind_takes_unknown_fields(newer_daemon) -> None:
    job_socket, replies = newer_daemon
    cases = [
        (admin.SaveNowRequest(job="a"), admin.SaveNowReply(jobs=["a"], ranks=1)),
        (admin.SetPolicyRequest(job="a", spec="young"),
         admin.SetPolicyReply(job="a", policy="young", previous="default", plan_seq=2)),
        (admin.PauseRequest(job="a"), admin.PauseReply(jobs=["a"], paused=True)),
        (admin.DrainRequest(timeout_s=1), admin.DrainReply(jobs=[], seconds=0.1,
                                                            timed_out=False)),
    ]  # fmt: skip
    for req, rep in cases:
        replies.append(newer(rep))
        assert admin.request(job_socket, req, timeout_s=10) == rep


def test_requests_stay_strict() -> None:
    data = msgspec.to_builtins(admin.SaveNowRequest(job="a"))
    data["at_step"] = 5  # an option of a newer command: refused, not dropped
    with pytest.raises(admin.AdminError) as info:
        admin.decode_request(msgspec.msgpack.encode(data))
    assert info.value.code == "invalid" and "at_step" in str(info.value)


class _OlderSetPolicy(admin.Request, frozen=True, tag="set_policy"):
    """``set_policy`` as the release before ``--clear`` declared it."""

    job: str
    spec: str = ""


def test_an_older_daemon_takes_a_newer_commands_request_that_needs_no_new_field() -> None:
    older = admin.RequestDecoder([_OlderSetPolicy])
    plain = older.decode(admin.encode(admin.SetPolicyRequest(job="j", spec="young")))
    assert plain == _OlderSetPolicy(job="j", spec="young")
    # what the older daemon cannot do is still refused, never dropped
    with pytest.raises(admin.AdminError, match="clear"):
        older.decode(admin.encode(admin.SetPolicyRequest(job="j", clear=True)))


@pytest.mark.parametrize(
    "request_",
    [
        admin.StatusRequest(),
        admin.SaveNowRequest(job="j", reason="x"),
        admin.DrainRequest(timeout_s=3.0),
        admin.SetPolicyRequest(job="j", spec="young"),
        admin.SetPolicyRequest(job="j", clear=True),
    ],
)
def test_a_request_round_trips_with_its_version(request_: admin.Request) -> None:
    frame = admin.encode(request_)
    assert msgspec.msgpack.decode(frame)["v"] == admin.ADMIN_VERSION
    assert admin.decode_request(frame) == request_
