"""DaemonLink over a real ZeroMQ ROUTER: hello, liveness, drops, bad frames."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import zmq

from adaptd.client.daemon.link import DaemonLink
from adaptd.protocol import job as protocol

from .conftest import FakeDaemon, welcome


def hello(job: str = "j") -> protocol.Hello:
    return protocol.Hello(v=protocol.VERSION, job=job, pid=1)


def receive_until(link: DaemonLink, now: float, timeout: float = 5.0):
    """Poll the link (the real socket) until something arrives."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if link._sock.poll(50):
            got = link.receive(now)
            if got:
                return got
    raise TimeoutError("nothing from the daemon")


def test_socket_options(ipc_endpoint):
    link = DaemonLink(ipc_endpoint)
    try:
        assert link._sock.getsockopt(zmq.LINGER) == 0
        assert link._sock.getsockopt(zmq.IMMEDIATE) == 1
        assert link._sock.type == zmq.DEALER
    finally:
        link.close()


def test_no_daemon_sends_are_dropped_and_counted(ipc_endpoint):
    link = DaemonLink(ipc_endpoint, timeout_s=1.0)
    try:
        assert not link.send(hello(), now=0.0)
        assert (link.sent, link.dropped) == (0, 1)
        assert not link.alive(0.0)  # never welcomed
        # a refused send still starts the silence clock (a dead daemon refuses them all)
        link.welcomed = True
        assert link.alive(0.9) and not link.alive(1.0)
    finally:
        link.close()


def test_welcome_then_silence_times_out(fake_daemon: FakeDaemon):
    link = DaemonLink(fake_daemon.endpoint, timeout_s=2.0)
    try:
        deadline = time.monotonic() + 5
        while not link.send(hello(), now=0.0):  # the pipe comes up asynchronously
            assert time.monotonic() < deadline, "the DEALER never connected"
            fake_daemon.sock.poll(20)
        assert isinstance(fake_daemon.recv(), protocol.Hello)
        fake_daemon.send(welcome("j"))
        msgs = receive_until(link, now=0.5)
        assert isinstance(msgs[0], protocol.Welcome) and link.welcomed
        assert link.alive(100.0)  # nothing unanswered: alive however long
        link.send(hello(), now=101.0)
        assert link.alive(102.9)
        assert not link.alive(103.0)  # 2 s of silence after a send
        link.forget()
        assert not link.alive(103.0) and not link.welcomed
    finally:
        link.close()


def test_daemon_death_is_noticed_after_the_timeout(fake_daemon: FakeDaemon, ipc_endpoint):
    link = DaemonLink(ipc_endpoint, timeout_s=1.0)
    try:
        deadline = time.monotonic() + 5
        while not link.send(hello(), now=0.0):
            assert time.monotonic() < deadline
            fake_daemon.sock.poll(20)
        fake_daemon.recv()
        fake_daemon.send(welcome("j"))
        receive_until(link, now=0.0)
        monitor = link._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        fake_daemon.close()  # the daemon dies: its peer goes away
        assert monitor.poll(5000), "ZeroMQ never saw the daemon go"
        link._sock.disable_monitor()
        monitor.close(0)
        # queued into a dying pipe or refused (no peer, IMMEDIATE=1): either way unanswered;
        # but sooner than KEEPALIVE_S after the daemon's last message it need not answer
        keep = protocol.KEEPALIVE_S
        link.send(hello(), now=keep / 2)
        assert link.alive(100.0)
        link.send(hello(), now=keep)  # this one it must answer
        assert link.alive(keep + 0.9)
        assert not link.alive(keep + 1.0)  # 1 s of silence since the refused send
    finally:
        link.close()


def test_bad_frames_are_dropped_and_counted(fake_daemon: FakeDaemon):
    link = DaemonLink(fake_daemon.endpoint)
    try:
        deadline = time.monotonic() + 5
        while not link.send(hello(), now=0.0):
            assert time.monotonic() < deadline
            fake_daemon.sock.poll(20)
        fake_daemon.recv()
        fake_daemon.send_raw(b"\xc1 not msgpack")
        fake_daemon.send_raw(protocol.encode(protocol.Hello(v=protocol.VERSION, job="x")))
        fake_daemon.send_raw(protocol.encode(protocol.Welcome(v=99, job="j", rank=0)))
        fake_daemon.send(welcome("j"))
        got: list = []
        deadline = time.monotonic() + 5
        while not got:
            assert time.monotonic() < deadline
            link._sock.poll(50)
            got += link.receive(0.0)
        assert [type(m) for m in got] == [protocol.Welcome]
        assert link.bad_frames == 3
    finally:
        link.close()


def test_bad_endpoint_is_a_value_error():
    import pytest

    with pytest.raises(ValueError, match="socket='nope://x'"):
        DaemonLink("nope://x")


_LAST_WORDS = """
import os, sys
from adaptd.protocol import job as protocol
from adaptd.client.daemon.link import DaemonLink

link = DaemonLink(sys.argv[1])
deadline = __import__("time").monotonic() + 10
while not link._sock.poll(10, 2):  # POLLOUT: the daemon's end is connected
    assert __import__("time").monotonic() < deadline
print("ready", flush=True)
sys.stdin.readline()  # the test makes the machine busy, then says go
for n in range(99):  # a full send queue ahead of the goodbye
    link.send(protocol.Steps(v=protocol.VERSION, job="j", rank=0, step=n, count=1, mean_s=0.1), 0.0)
link.send(protocol.Goodbye(v=protocol.VERSION, job="j", rank=0, step=99, reason="closed"), 0.0)
link.close(linger_ms=2000)
os._exit(0)  # as a forked worker ends: no interpreter shutdown, no atexit
"""


@pytest.mark.slow
def test_close_delivers_the_last_messages_before_the_process_ends(fake_daemon, tmp_path):
    """A goodbye queued before ``close(linger_ms)`` reaches the daemon even when the
    process ends right after (``os._exit``, as a forked worker does) on a busy machine:
    otherwise a cleanly finished job looks lost to the daemon, and would count as a
    failure once it resumes. Once connected, the job is reniced to 19 and two busy
    loops start before it sends: the old link (a shared context never terminated) then
    lost the goodbye (and everything queued before it) in most runs."""
    script = tmp_path / "last_words.py"
    script.write_text(_LAST_WORDS)
    for attempt in range(5):
        fake_daemon.received.clear()
        job = subprocess.Popen(
            [sys.executable, str(script), fake_daemon.endpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        burn: list[subprocess.Popen] = []
        try:
            assert job.stdout.readline().strip() == "ready"
            os.setpriority(os.PRIO_PROCESS, job.pid, 19)
            burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(2)]  # fmt: skip
            job.stdin.write("go\n")
            job.stdin.flush()
            assert job.wait(timeout=60) == 0
        finally:
            for proc in [*burn, job]:
                proc.kill()
                proc.wait()
        deadline = time.monotonic() + 10
        while not any(isinstance(m, protocol.Goodbye) for m in fake_daemon.received):
            assert time.monotonic() < deadline, (
                f"attempt {attempt}: no Goodbye; got {len(fake_daemon.received)} messages"
            )
            if fake_daemon.sock.poll(100):
                fake_daemon.recv()
        assert sum(isinstance(m, protocol.Steps) for m in fake_daemon.received) == 99
