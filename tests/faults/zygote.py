"""A zygote: one process that imports TensorFlow once and forks each training job.

Importing TensorFlow and Keras costs ~5 s of CPU per process (more on a loaded
2-core CI box), so a test that kills a training job twenty times and resumes it
after each kill would spend minutes only importing. Forked from a process that has
imported TensorFlow *but never ran an op* (no thread pools, no device set up yet),
each job is a real, separate process that starts training within a second, and
whose results are bit-identical to a job started with ``python script.py``
(tests/faults/test_training_crash.py compares them).

Server (run by :class:`Zygote`; one request per stdin line, JSON)::

    {"id": "j1", "out": "/tmp/x/j1.fifo", "script": "train_script.py", "argv": [...]}
    {"id": "v1", "out": "/tmp/x/v1.fifo", "module": "adaptd.cli", "argv": ["verify", DIR]}

It opens ``out`` (a FIFO the test reads) for the child's stdout and stderr, forks,
prints ``forked ID PID``, and prints ``exit ID CODE`` when it reaps the child (CODE
as :class:`subprocess.Popen` has it: negative for a signal). A child dies with the
zygote (``PR_SET_PDEATHSIG``); the zygote exits when its stdin closes.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import fcntl
import json
import os
import re
import runpy
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from adaptd.commands._spawn import LogWatch

#: A line of TensorFlow's C++ logging (absl: ``E0000 00:00:1796318173.596830  12261
#: cuda_platform.cc:52] failed call to cuInit: ...``) or absl's note before it is set up.
NATIVE_LOG = re.compile(
    r"^([IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]|WARNING: All log messages before absl)"
)


#: The hook's own line to its user on stderr (``adaptd: resumed from step 40 ...``,
#: client/restore/notes.py), said once per run before the job prints ``start N``.
NOTE = "adaptd: "


class JobLog(LogWatch):
    """A job's output without TensorFlow's C++ log lines, which come on stderr when
    they like (a failed ``cuInit`` on a host without a GPU, whatever TF_CPP_MIN_LOG_LEVEL
    says) and are not the job's to parse; they are kept apart in ``native``, and the
    hook's notes to its user (:data:`NOTE`) in ``notes``."""

    def __init__(self, stream, deadline_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        self.native: list[str] = []
        self.notes: list[str] = []
        super().__init__(stream, deadline_s)

    def ended(self, timeout: float = 30.0) -> list[str]:
        """Every line, once the child's output has ended (EOF: it exited): the lines a
        test reads after :meth:`Child.wait`, which may return before the last were read.
        TimeoutError if the output is still open after ``timeout`` seconds."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the child's output still open after {timeout}s")
        return self.lines

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._cond:
                if NATIVE_LOG.match(line):
                    self.native.append(line)
                elif line.startswith(NOTE):
                    self.notes.append(line)
                else:
                    self.lines.append(line)
                self._cond.notify_all()


READY = "zygote ready"


# ---------------------------------------------------------------------- server side


def _child(req: dict, fd: int) -> None:
    """In the forked child: stdout/stderr to ``fd``, run the entry point, exit."""
    code = 1
    try:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(fd, 1)
        os.dup2(fd if req.get("stderr", True) else devnull, 2)
        os.close(fd)
        # one write per line: print() writes the text and the newline in two calls when
        # unbuffered, and TensorFlow's C++ log lines (absl ignores TF_CPP_MIN_LOG_LEVEL
        # before its InitializeLog; "failed call to cuInit" on a host without a GPU)
        # landed between them, inside a line the test was parsing
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True, write_through=False)
        # a crash in TensorFlow's C++ (a worker ended by SIGSEGV after a collective's
        # timeout, once in a two-process suite run) prints every thread's Python stack
        # into the output the test shows, so the next one says where it happened
        faulthandler.enable(sys.stderr, all_threads=True)
        os.environ.update(req.get("env", {}))
        for key in req.get("unset", []):
            os.environ.pop(key, None)
        sys.argv = [req.get("script") or req["module"], *req["argv"]]
        try:
            if req.get("script"):
                sys.path.insert(0, str(Path(req["script"]).parent))
                runpy.run_path(req["script"], run_name="__main__")
            else:
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        if req.get("normal_exit"):
            _exit_as_python_does()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _exit_as_python_does() -> None:
    """What the interpreter does before a process ends by itself (and ``os._exit``
    skips): join the non-daemon threads, run the ``atexit`` handlers (the hook's close,
    TensorFlow's own). For jobs whose end is under test (a worker ending on an error)."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()


def serve() -> None:
    """The zygote's loop: import TensorFlow, then fork one child per request."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras  # noqa: F401
    import numpy  # noqa: F401
    import tensorflow  # noqa: F401

    # adaptd.client's hook and callback load on first use: here, not in every child
    import adaptd.cli
    import adaptd.client
    import adaptd.client.callback
    import adaptd.client.checkpointer
    import adaptd.client.restore.verify  # noqa: F401

    r, w = os.pipe()
    for fd in (r, w):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    ids: dict[int, str] = {}
    print(READY, flush=True)
    stdin = sys.stdin.buffer
    while True:
        try:
            ready, _, _ = select.select([stdin, r], [], [])
        except InterruptedError:
            continue
        if r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(r, 4096)
        while ids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            print(f"exit {ids.pop(pid)} {os.waitstatus_to_exitcode(status)}", flush=True)
        if stdin in ready:
            line = stdin.readline()
            if not line:
                return
            req = json.loads(line)
            fd = os.open(req["out"], os.O_WRONLY)
            pid = os.fork()
            if pid == 0:
                os.close(r)
                os.close(w)
                _child(req, fd)
            os.close(fd)
            ids[pid] = req["id"]
            print(f"forked {req['id']} {pid}", flush=True)


# ---------------------------------------------------------------------- test side


class Child:
    """One forked job: its pid, its output (a :class:`LogWatch`), its exit code."""

    def __init__(
        self, zygote: Zygote, ident: str, pid: int, log: LogWatch | None, stdout: IO[str] | None
    ) -> None:
        self.zygote = zygote
        self.id = ident
        self.pid = pid
        #: the child's lines, read on a thread (spawned with ``reader=True``) ...
        self.log = log
        #: ... or its output for the caller to read, as a ``Popen(text=True)``'s
        self.stdout = stdout
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (negative: killed by that signal); TimeoutError after ``timeout``."""
        if self.returncode is None:
            line = self.zygote.log.wait_for(f"exit {self.id} ", timeout=timeout)
            self.returncode = int(line.rsplit(" ", 1)[1])
        return self.returncode

    def poll(self) -> int | None:
        """The exit code if the zygote has reaped the child, else None."""
        if self.returncode is None:
            done = [ln for ln in self.zygote.log.lines if ln.startswith(f"exit {self.id} ")]
            if done:
                self.returncode = int(done[0].rsplit(" ", 1)[1])
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child if it still runs (as ``Popen.send_signal``)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> int:
        """SIGKILL the child (if it still runs) and return its exit code once reaped."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        return self.wait(30.0)


class Zygote:
    """The test's handle on a zygote process (see the module docstring)."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None, deadline_s: float = 120):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        full = dict(os.environ if env is None else env)
        full.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        full["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=full,
        )
        self.log = LogWatch(self.proc.stdout, deadline_s)
        self._n = 0
        self.children: list[Child] = []
        self.log.wait_for(READY)

    def spawn(
        self,
        argv: list[str],
        *,
        script: str | os.PathLike[str] | None = None,
        module: str | None = None,
        env: dict[str, str] | None = None,
        unset: tuple[str, ...] = ("ADAPTD_SOCKET",),
        deadline_s: float = 120.0,
        normal_exit: bool = False,
        stderr: bool = True,
        reader: bool = True,
    ) -> Child:
        """Fork ``python SCRIPT ARGV`` (or ``python -m MODULE ARGV``) from the zygote.
        ``normal_exit``: the child ends as a process does (non-daemon threads joined,
        ``atexit`` handlers run), not at once. ``stderr=False``: its stderr goes to
        /dev/null (``Popen(stderr=DEVNULL)``). ``reader=False``: no thread reads its
        output into :attr:`Child.log`; the caller reads :attr:`Child.stdout` (text) as
        it would a ``Popen(stdout=PIPE, text=True)``'s."""
        if (script is None) == (module is None):
            raise ValueError("give exactly one of script= or module=")
        self._n += 1
        ident = f"c{self._n}"
        fifo = self.workdir / f"{ident}.fifo"
        os.mkfifo(fifo)
        rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        req = {"id": ident, "out": str(fifo), "argv": [str(a) for a in argv], "env": env or {},
               "unset": list(unset), "normal_exit": normal_exit, "stderr": stderr}  # fmt: skip
        if script is not None:
            req["script"] = str(script)
        else:
            req["module"] = module
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        line = self.log.wait_for(f"forked {ident} ")
        # the child holds the write end now, so EOF means that it exited
        os.set_blocking(rfd, True)
        pid = int(line.rsplit(" ", 1)[1])
        if reader:
            child = Child(self, ident, pid, JobLog(os.fdopen(rfd, "rb"), deadline_s), None)
        else:
            child = Child(self, ident, pid, None, open(rfd, encoding="utf-8", errors="replace"))  # noqa: SIM115 - the caller's
        self.children.append(child)
        return child

    def close(self) -> None:
        """Kill every child still running, then end the zygote."""
        for child in self.children:
            with contextlib.suppress(TimeoutError):
                child.kill()
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def zygote(workdir: Path) -> Iterator[Zygote]:
    z = Zygote(workdir)
    try:
        yield z
    finally:
        z.close()


if __name__ == "__main__":
    serve()
