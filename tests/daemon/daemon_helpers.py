"""Helpers for the daemon tests: a real daemon (subprocess or thread), raw DEALER peers.

Every wait is on the thing itself with a deadline: a daemon log line (read from
its stderr pipe), a daemon event (from an in-process sink), a reply on a socket.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import zmq

from adaptd.commands import _spawn as spawn
from adaptd.commands._spawn import start_daemon, stop_daemon
from adaptd.daemon.assembly import Seams, build
from adaptd.daemon.options import DaemonOptions
from adaptd.daemon.server import Daemon
from adaptd.protocol import admin
from adaptd.protocol import job as p

HERE = Path(__file__).parent
DEADLINE = 10.0


class LogWatch(spawn.LogWatch):
    """:class:`adaptd.commands._spawn.LogWatch` with this suite's deadline."""

    def __init__(self, stream) -> None:
        super().__init__(stream, DEADLINE)


#: The tests' daemon default: a fixed grid, so plans change only where a test expects
#: (the package default learns from step times and would re-plan as they arrive).
PINNED = "phased"


class Peer:
    """A raw DEALER socket speaking adaptd.protocol.job, as a job's rank would."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, msg: p.Message) -> None:
        self.sock.send(p.encode(msg))

    def send_raw(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self, timeout: float = DEADLINE) -> p.DaemonMessage:
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no message from the daemon within {timeout}s")
        return p.decode_daemon(self.sock.recv())

    def expect(self, kind: type, timeout: float = DEADLINE):
        msg = self.recv(timeout)
        assert isinstance(msg, kind), f"expected {kind.__name__}, got {msg!r}"
        return msg

    def silent_for(self, seconds: float) -> bool:
        """True when nothing arrives within ``seconds`` (used to check for absence)."""
        return not self.sock.poll(int(seconds * 1000))

    def hello(self, job: str, rank: int = 0, **kw) -> p.Plan:
        self.send(p.Hello(v=p.VERSION, job=job, rank=rank, **kw))
        welcome = self.expect(p.Welcome)
        assert (welcome.job, welcome.rank) == (job, rank)
        return self.expect(p.Plan)

    def barrier(self, job: str, rank: int = 0, **kw) -> list[p.DaemonMessage]:
        """Say hello again (a reconnect) and return what arrived before its Welcome: the
        pipe is ordered, so everything sent before was handled by then."""
        self.send(p.Hello(v=p.VERSION, job=job, rank=rank, **kw))
        before = []
        while not isinstance(msg := self.recv(), p.Welcome):
            before.append(msg)
        self.expect(p.Plan)
        return before

    def steps(self, job: str, step: int, rank: int = 0, count: int = 10, mean_s: float = 0.01):
        self.send(p.Steps(v=p.VERSION, job=job, rank=rank, step=step, count=count, mean_s=mean_s))

    def close(self) -> None:
        self.sock.close(linger=0)


class DaemonProc:
    """A real ``python -m adaptd.cli serve`` child with its stderr watched."""

    def __init__(
        self, socket: Path, args: tuple[str, ...] = ("--policy", PINNED), drain_grace: float = 0
    ) -> None:
        self.socket = socket
        # its own state database and no metrics port: tests must not share state, and
        # settings a test leaves (pause, set-policy) would come back in the next daemon
        isolate = ("--state-dir", str(socket.parent), "--metrics-listen", "off")
        grace = ("--drain-grace", f"{drain_grace:g}")
        self.proc = start_daemon(socket, (*isolate, *grace, *args), log=subprocess.PIPE)
        self.log = LogWatch(self.proc.stderr)

    @property
    def endpoint(self) -> str:
        return f"ipc://{self.socket}"

    def status(self) -> admin.StatusReply:
        reply = admin.request(self.socket, admin.StatusRequest(), timeout_s=DEADLINE)
        assert isinstance(reply, admin.StatusReply)
        return reply

    def job(self, job: str) -> admin.JobInfo:
        return next(j for j in self.status().jobs if j.job == job)

    def stop(self) -> int:
        return stop_daemon(self.proc)


class EventLog:
    """An in-process sink: records events and wakes waiters."""

    def __init__(self) -> None:
        self.events: list = []
        self._cond = threading.Condition()

    def __call__(self, event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, kind: type, pred: Callable = lambda e: True, timeout: float = DEADLINE):
        def found():
            return next((e for e in self.events if isinstance(e, kind) and pred(e)), None)

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(f"no {kind.__name__} event within {timeout}s: {self.events}")
            return found()

    def of(self, kind: type) -> list:
        with self._cond:
            return [e for e in self.events if isinstance(e, kind)]


@contextlib.contextmanager
def thread_daemon(socket: Path, **kw) -> Iterator[tuple[Daemon, EventLog]]:
    """A daemon in a thread, built as every daemon is (:func:`adaptd.daemon.assembly.build`):
    ``kw`` are its options (:class:`DaemonOptions`) and seams (:class:`Seams`) by name."""
    sink = EventLog()
    kw.setdefault("default_policy", PINNED)
    seams = {k: kw.pop(k) for k in list(kw) if k in Seams.__dataclass_fields__}
    d = build(DaemonOptions(socket=socket, **kw), Seams(sinks=[sink], **seams)).start()
    try:
        yield d, sink
    finally:
        d.stop()


class FakeJob:
    """A child process that says hello with its own pid and reports steps until killed."""

    def __init__(
        self, endpoint: str, job: str, rank: int = 0, world_size: int = 1, resumed_from: int = 0
    ) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "fake_job.py"),
                endpoint,
                job,
                str(rank),
                str(world_size),
                str(resumed_from),
            ],
            stdout=subprocess.PIPE,
        )
        self.log = LogWatch(self.proc.stdout)

    def wait_ready(self) -> dict:
        return msgspec.json.decode(self.log.wait_for('"ready"').encode())

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()  # reaped: the pid is really gone

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
