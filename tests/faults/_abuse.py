"""Helpers for the abuse, isolation and bounds tests: a real ``adaptd serve`` child
configured by a TOML file, a well-behaved rank that measures how fast the daemon
answers it, and measurements of the daemon process (RSS, open fds).

Every wait is on the thing itself with a deadline: a file, a reply, a status field.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import psutil
import zmq
from integration._serve import Peer

from adaptd.commands import _spawn as spawn
from adaptd.protocol import admin
from adaptd.protocol import job as p

DEADLINE = 15.0
V = p.VERSION


def raw(**fields: object) -> bytes:
    """A msgpack map, for frames the typed encoder would never produce."""
    return msgspec.msgpack.encode(fields)


class Served:
    """``python -m adaptd.cli serve --config CONFIG`` with its stderr watched.

    ``settings`` become the config file's ``[daemon]`` (and other) tables; the
    socket, state directory and admin socket live in ``where``. ``ready`` is the
    file whose appearance means the daemon listens (the job socket, or for a
    ``tcp://`` daemon the admin socket in ``$RUNTIME_DIRECTORY``).
    """

    def __init__(
        self,
        where: Path,
        *,
        daemon: dict[str, object] | None = None,
        extra_toml: str = "",
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        python: tuple[str, ...] = (),
    ) -> None:
        self.where = where
        self.socket = where / "adaptd.sock"
        settings: dict[str, object] = {
            "socket": str(self.socket),
            "state_dir": str(where / "state"),
            "drain_grace_s": 0,
            "watchdog": False,
            **(daemon or {}),
        }
        lines = ["[daemon]", *(f"{k} = {_toml(v)}" for k, v in settings.items())]
        lines += ["[metrics]", 'listen = "off"', extra_toml]
        self.config = where / "adaptd.toml"
        self.config.write_text("\n".join(lines) + "\n")
        tcp = str(settings["socket"]).startswith("tcp://")
        self.endpoint = str(settings["socket"]) if tcp else f"ipc://{self.socket}"
        self.admin_socket = (where / "adaptd.admin.sock") if tcp else admin.admin_path(self.socket)
        full = {**os.environ, "RUNTIME_DIRECTORY": str(where), **(env or {})}
        for key in ("ADAPTD_SOCKET", "ADAPTD_CONFIG", "STATE_DIRECTORY", "NOTIFY_SOCKET"):
            full.pop(key, None)
        cmd = python or (sys.executable,)
        self.proc = subprocess.Popen(
            [*cmd, "-m", "adaptd.cli", "serve", "--config", str(self.config), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=full,
        )
        self.log = spawn.LogWatch(self.proc.stderr, DEADLINE)
        try:
            spawn.wait_for_path(self.admin_socket if tcp else self.socket, self.proc, 30)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self) -> admin.StatusReply:
        # admin.request derives the admin socket from a job socket path beside it
        reply = admin.request(
            self.admin_socket.with_name("adaptd.sock"), admin.StatusRequest(), timeout_s=DEADLINE
        )
        assert isinstance(reply, admin.StatusReply)
        return reply

    def request(self, req: admin.Request) -> admin.AnyReply:
        return admin.request(self.admin_socket.with_name("adaptd.sock"), req, timeout_s=DEADLINE)

    def job(self, job: str) -> admin.JobInfo | None:
        return next((j for j in self.status().jobs if j.job == job), None)

    def rss(self) -> int:
        return psutil.Process(self.pid).memory_info().rss

    def fds(self) -> int:
        return psutil.Process(self.pid).num_fds()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        return spawn.stop_daemon(self.proc)


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


class Rank(Peer):
    """One rank of a job over a raw DEALER: the integration tests' :class:`Peer` with a
    rank number, a hello that waits for the plan, and a goodbye."""

    def __init__(self, ctx: zmq.Context, endpoint: str, job: str, rank: int = 0) -> None:
        super().__init__(ctx, endpoint, job)
        self.rank = rank

    def silent_for(self, seconds: float) -> bool:
        return not self.sock.poll(int(seconds * 1000))

    def hello(self, **kw: object) -> p.Plan:
        self.send(p.Hello(v=V, job=self.job, rank=self.rank, pid=os.getpid(), **kw))
        self.until(p.Welcome)
        return self.until(p.Plan)

    def steps(self, step: int, count: int = 10, mean_s: float = 0.05) -> None:
        self.send(p.Steps(v=V, job=self.job, rank=self.rank, step=step, count=count, mean_s=mean_s))

    def saved(self, step: int, **kw: object) -> None:
        fields = {"blocking_s": 0.05, "durable_s": 1.0, "bytes": 4096, **kw}
        self.send(p.SaveReport(v=V, job=self.job, rank=self.rank, step=step, **fields))

    def goodbye(self, step: int) -> None:
        self.send(p.Goodbye(v=V, job=self.job, rank=self.rank, step=step))


@dataclass
class Latencies:
    """Round trips a well-behaved job measured (seconds), by kind."""

    hello: list[float] = field(default_factory=list)
    save_now: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @staticmethod
    def summary(xs: list[float]) -> str:
        if not xs:
            return "none"
        q = statistics.quantiles(xs, n=100) if len(xs) > 1 else [xs[0]] * 99
        return (
            f"n={len(xs)} p50={q[49] * 1e3:.1f}ms p99={q[98] * 1e3:.1f}ms max={max(xs) * 1e3:.1f}ms"
        )


class GoodJob:
    """A well-behaved job measuring, on a thread, how fast the daemon serves it.

    Round after round until stopped: a reconnect (hello on its connection: time to
    Welcome and Plan), then an operator's save-now for it on the admin socket (time
    from the request until its SaveNow arrives on the job's connection).
    """

    def __init__(self, served: Served, ctx: zmq.Context, job: str = "good") -> None:
        self.served = served
        self.rank = Rank(ctx, served.endpoint, job)
        self.rank.hello(policy="fixed:steps=1000")
        self.lat = Latencies()
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-job", daemon=True)

    def start(self) -> GoodJob:
        self._thread.start()
        return self

    def _run(self) -> None:
        r = self.rank
        step = 0
        while not self._stop.is_set():
            try:
                t0 = time.perf_counter()
                r.hello(policy="fixed:steps=1000")
                self.lat.hello.append(time.perf_counter() - t0)
                step += 10
                r.steps(step)
                t0 = time.perf_counter()
                self.served.request(admin.SaveNowRequest(job=r.job, reason="probe"))
                r.until(p.SaveNow)
                self.lat.save_now.append(time.perf_counter() - t0)
                r.saved(step)
            except (TimeoutError, admin.AdminError) as exc:
                self.lat.errors.append(f"{type(exc).__name__}: {exc}")
            self.rounds += 1
            self._stop.wait(0.02)  # a paced job, not a second flood

    def stop(self) -> Latencies:
        self._stop.set()
        self._thread.join(DEADLINE)
        self.rank.close()
        return self.lat


def wait_until(cond: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Poll ``cond`` until it holds; raise naming ``what`` at the deadline."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {timeout}s")
        threading.Event().wait(0.05)


class PeerProc:
    """``_peer_proc.py`` as a child process: a rank (or operator) with its own pid,
    and with ``uid``/``gid``/``groups`` in ``spec``, its own user (root only)."""

    def __init__(self, spec: dict[str, object]) -> None:
        import json

        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_peer_proc.py")), json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.log = spawn.LogWatch(self.proc.stdout, DEADLINE)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, *needles: str, timeout: float | None = None) -> str:
        return self.log.wait_for(*needles, timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()  # reaped: its pid is really gone
