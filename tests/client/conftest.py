"""Fixtures for the client tests: a real ZeroMQ ROUTER that speaks adaptd.protocol.job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from adaptd.protocol import job as protocol


class FakeDaemon:
    """The daemon side of the wire, driven by the test: a real ROUTER socket."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self._monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sock.bind(endpoint)
        self.peer: bytes | None = None
        self.received: list[protocol.ClientMessage] = []

    def recv(self, timeout: float = 10.0) -> protocol.ClientMessage:
        """The next client message (waits on the socket up to ``timeout`` seconds)."""
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no client message within {timeout}s")
        peer, frame = self.sock.recv_multipart()
        self.peer = peer
        msg = protocol.decode_client(frame)
        self.received.append(msg)
        return msg

    def wait_for(self, kind: type, timeout: float = 10.0, where=lambda m: True):
        """Receive until a message of ``kind`` matching ``where`` arrives."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind.__name__} within {timeout}s")
            msg = self.recv(left)
            if isinstance(msg, kind) and where(msg):
                return msg

    def wait_connected(self, timeout: float = 10.0) -> None:
        """Block until a client's connection has completed its ZMTP handshake.

        The hook sends its first Hello straight from ``restore_or_initialize`` with
        ``IMMEDIATE=1``; if the ipc connection is still being made that Hello is
        refused and only resent from a later step boundary. Tests that wait for
        Hello without training call this first, so they do not race the connect.
        """
        if not self._monitor.poll(int(timeout * 1000)):
            raise TimeoutError(f"no client connected within {timeout}s")
        recv_monitor_message(self._monitor)

    def send(self, msg: protocol.Message) -> None:
        assert self.peer is not None, "no client has spoken yet"
        self.sock.send_multipart([self.peer, protocol.encode(msg)])

    def send_raw(self, frame: bytes) -> None:
        assert self.peer is not None
        self.sock.send_multipart([self.peer, frame])

    def close(self) -> None:
        if self.sock.closed:
            return
        self.sock.disable_monitor()
        self._monitor.close(0)
        self.sock.close(0)


@pytest.fixture
def ipc_endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/adaptd.sock"


@pytest.fixture
def fake_daemon(ipc_endpoint: str) -> Iterator[FakeDaemon]:
    d = FakeDaemon(ipc_endpoint)
    yield d
    d.close()


def connected(session, daemon: FakeDaemon) -> None:
    """Until ``session``'s link takes sends, then its Hello reached ``daemon``.

    ``wait_connected`` sees the daemon's side of the handshake; the hook's DEALER
    (``IMMEDIATE``) refuses sends until its own side has made the pipe, a moment
    later on a loaded machine: so say hello until a send is taken."""
    daemon.wait_connected()
    deadline = time.monotonic() + 10
    while not session.send_hello(time.perf_counter()):
        assert time.monotonic() < deadline, "the link never connected"
        time.sleep(0.005)  # the pipe is being made: nothing to wait on from here
    daemon.wait_for(protocol.Hello)


def welcome(job: str, rank: int = 0) -> protocol.Welcome:
    return protocol.Welcome(v=protocol.VERSION, job=job, rank=rank, daemon_version="test")


def plan(job: str, seq: int, next_step: int | None, every: int | None = None, **kw):
    return protocol.Plan(
        v=protocol.VERSION, job=job, seq=seq, next_step=next_step, every_steps=every,
        policy=kw.pop("policy", "fixed"), reason=kw.pop("reason", "test plan"), **kw,
    )  # fmt: skip
