"""Helpers for the integration tests: a real ``adaptd serve`` child, its sd_notify
socket, its log, and a raw DEALER peer speaking adaptd.protocol.job.

Every wait is on the thing itself with a deadline: a notify datagram, a log line,
a reply on a socket, the process's exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import zmq

from adaptd.commands import _spawn as spawn
from adaptd.protocol import job as p

DEADLINE = 15.0


class LogWatch(spawn.LogWatch):
    """:class:`adaptd.commands._spawn.LogWatch` with this suite's deadline."""

    def __init__(self, stream) -> None:
        super().__init__(stream, DEADLINE)


class NotifyListener:
    """The datagram socket systemd would own: collects what the daemon sends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []

    def wait_for(
        self, key: str, value: str | None = None, timeout: float = DEADLINE, *, prefix: str = ""
    ) -> dict:
        """The first message (from the start) assigning ``key`` (``=value`` if given,
        else a value starting with ``prefix``)."""
        end = time.monotonic() + timeout
        while True:
            for m in self.messages:
                if key not in m:
                    continue
                if m[key] == value if value is not None else m[key].startswith(prefix):
                    return m
            left = end - time.monotonic()
            if left <= 0:
                want = value if value is not None else prefix + "*"
                raise TimeoutError(f"no {key}={want} within {timeout}s: {self.messages}")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append(dict(ln.split("=", 1) for ln in data.decode().splitlines()))

    def close(self) -> None:
        self.sock.close()


class Serve:
    """``python -m adaptd.cli serve ARGS`` with NOTIFY_SOCKET pointing at ``notify``."""

    def __init__(self, args: list[str], notify: NotifyListener, env: dict[str, str]) -> None:
        full = {**os.environ, **env, "NOTIFY_SOCKET": str(notify.path)}
        full.pop("STATE_DIRECTORY", None)
        full.pop("ADAPTD_CONFIG", None)
        self.notify = notify
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "adaptd.cli", "serve", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=full,
        )
        self.log = LogWatch(self.proc.stderr)

    def ready(self) -> dict:
        """The daemon's ``READY=1``; on a timeout, whether it still runs and its log (a
        suite run in two processes once saw no READY within 15 s and nothing else)."""
        try:
            return self.notify.wait_for("READY", "1")
        except TimeoutError as exc:
            code = self.proc.poll()
            state = "still running" if code is None else f"exited with {code}"
            raise TimeoutError(f"{exc}; adaptd serve {state}:\n{self.log.text()}") from None

    def terminate(self) -> None:
        self.proc.send_signal(15)

    def wait(self, timeout: float = DEADLINE) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            log = self.log.text()
            raise AssertionError(f"adaptd serve did not exit in {timeout}s:\n{log}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Peer:
    """A raw DEALER socket speaking adaptd.protocol.job, as one rank of a job would."""

    def __init__(self, ctx: zmq.Context, endpoint: str, job: str) -> None:
        self.job = job
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, msg: p.Message) -> None:
        self.sock.send(p.encode(msg))

    def recv(self, timeout: float = DEADLINE) -> p.DaemonMessage:
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no message from the daemon within {timeout}s")
        return p.decode_daemon(self.sock.recv())

    def until(self, kind: type, timeout: float = DEADLINE):
        """Skip plans and the like until a ``kind`` message arrives."""
        end = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.0, end - time.monotonic()))
            if isinstance(msg, kind):
                return msg

    def hello(self) -> None:
        self.send(p.Hello(v=p.VERSION, job=self.job, pid=os.getpid(), gpus=1))
        self.until(p.Welcome)

    def steps(self, step: int, count: int = 10, mean_s: float = 0.05) -> None:
        self.send(p.Steps(v=p.VERSION, job=self.job, rank=0, step=step, count=count, mean_s=mean_s))

    def saved(self, step: int, blocking_s: float, durable_s: float = 1.0) -> None:
        self.send(
            p.SaveReport(
                v=p.VERSION,
                job=self.job,
                rank=0,
                step=step,
                blocking_s=blocking_s,
                durable_s=durable_s,
                bytes=4096,
            )
        )

    def close(self) -> None:
        self.sock.close(linger=0)
