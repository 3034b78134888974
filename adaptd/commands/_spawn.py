"""Start ``adaptd serve`` as a child process and wait until it listens.

Used by ``adaptd demo``, the benchmarks and the end-to-end tests, so they all
start the real daemon the same way: a separate process, its own socket, and a
deadline instead of a guess.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

__all__ = [
    "DaemonStartError",
    "LogWatch",
    "running_daemon",
    "start_daemon",
    "stop_daemon",
    "wait_for_path",
]


class LogWatch:
    """Collects a child process's output lines on a thread; waits for a line with a deadline.

    Used to wait for what a daemon or job *says* (a log line, an event) instead of
    guessing how long it takes.
    """

    def __init__(self, stream: IO[bytes], deadline_s: float = 30.0) -> None:
        self.lines: list[str] = []
        self.deadline_s = deadline_s
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            with self._cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, *needles: str, timeout: float | None = None, after: int = 0) -> str:
        """The first line (from index ``after``; 0: the start) holding every needle;
        TimeoutError otherwise. ``after=len(watch.lines)`` waits for a new line."""
        timeout = self.deadline_s if timeout is None else timeout

        def found() -> str | None:
            lines = self.lines[after:]
            return next((ln for ln in lines if all(n in ln for n in needles)), None)

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, timeout):
                tail = "\n".join(self.lines[-30:])
                raise TimeoutError(f"no log line with {needles} within {timeout}s; log:\n{tail}")
            return found()  # type: ignore[return-value]

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)


class DaemonStartError(RuntimeError):
    """The daemon exited or did not bind its socket in time."""


def wait_for_path(path: Path, proc: subprocess.Popen, deadline_s: float) -> None:
    """Wait until ``path`` exists; raise if ``proc`` exits first or time runs out."""
    end = time.monotonic() + deadline_s
    while not path.exists():
        if proc.poll() is not None:
            raise DaemonStartError(
                f"the daemon exited with status {proc.returncode} before binding {path}"
            )
        if time.monotonic() > end:
            raise DaemonStartError(f"the daemon did not bind {path} within {deadline_s:.0f}s")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)  # returns at once if the daemon dies


def start_daemon(
    socket: Path,
    args: Sequence[str] = (),
    *,
    state_dir: Path | None = None,
    log: IO | int | None = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
    deadline_s: float = 30.0,
) -> subprocess.Popen:
    """Start ``adaptd serve --socket SOCKET *args`` and return once it listens.

    A daemon started this way is private: unless ``args`` say otherwise, its state
    database lives in ``state_dir`` (default: ``state/`` beside the socket, so it never
    touches the user's real state and never learns from another run), and it serves
    no Prometheus endpoint (many can run at once).
    """
    extra: list[str] = []
    if "--state-dir" not in args and "--config" not in args:
        extra += ["--state-dir", str(state_dir or Path(socket).parent / "state")]
    if "--metrics-listen" not in args and "--config" not in args:
        extra += ["--metrics-listen", "off"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaptd.cli", "serve", "--socket", str(socket), *extra, *args],
        stdout=log,
        stderr=log,
        env=env if env is not None else dict(os.environ),
    )
    try:
        wait_for_path(socket, proc, deadline_s)
    except BaseException:
        stop_daemon(proc)
        raise
    return proc


def stop_daemon(proc: subprocess.Popen, timeout_s: float = 15.0) -> int:
    """SIGTERM the daemon and wait; SIGKILL it if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def running_daemon(socket: Path, args: Sequence[str] = (), **kwargs) -> Iterator[subprocess.Popen]:
    """``with running_daemon(path) as proc:`` — started and listening; stopped on exit."""
    proc = start_daemon(socket, args, **kwargs)
    try:
        yield proc
    finally:
        stop_daemon(proc)
