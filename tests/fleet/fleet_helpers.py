"""Helpers of the fleet tests: a real etcd on loopback, and test settings.

``etcd`` (Debian ``etcd-server``, installed by scripts/install-test-deps.sh) runs as a
subprocess with a temporary data directory. :class:`Etcd` can kill it (SIGKILL), start
it again on the same ports and data, stop it (SIGSTOP: a slow or partitioned etcd that
accepts connections and never answers) and let it go on (SIGCONT), and turn on
authentication with a role per host (:meth:`Etcd.enable_auth`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adaptd.fleet.keys import KeySpace, range_end
from adaptd.fleet.session import FleetSettings

#: Seconds for etcd to answer /health after a (re)start.
START_DEADLINE_S = 30.0
HOSTS = ("host-a", "host-b")
ROOT_PASSWORD = "root-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """One single-member etcd cluster on loopback."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir = data_dir
        self.log = log
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> Etcd:
        exe = shutil.which("etcd")
        if exe is None:
            pytest.skip("needs etcd (Debian etcd-server; scripts/install-test-deps.sh installs it)")
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    exe,
                    "--name=adaptd-test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=adaptd-test={peer}",
                    "--logger=zap",
                    "--log-level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.healthy():
                return self
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.1)  # a pause that ends early if etcd dies
        self.kill()
        raise RuntimeError(
            f"etcd did not become healthy within {START_DEADLINE_S:.0f}s; its log:\n"
            + self.log.read_text(errors="replace")[-3000:]
        )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1.0) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL: etcd vanishes mid-run (its data stays for :meth:`start`)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: connections are accepted, nothing is answered (slow / partitioned)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    # ------------------------------------------------------------------ admin calls

    def call(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST to the v3 gateway as root (once auth is on)."""
        req = urllib.request.Request(
            f"{self.url}/v3/{path}",
            data=json.dumps(payload).encode(),
            headers={"Authorization": self.token} if self.token else {},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=5.0) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"etcd {path}: {exc.read()!r}") from None

    def keys(self, prefix: str) -> list[str]:
        out = self.call("kv/range", {"key": _b64(prefix), "range_end": _b64(range_end(prefix))})
        return sorted(base64.b64decode(kv["key"]).decode() for kv in out.get("kvs", ()))

    def enable_auth(self, prefix: str, hosts: tuple[str, ...]) -> None:
        """Root, plus a user and role per host: readwrite on its own keys, read on the rest
        of ``prefix`` (the etcdctl commands of docs/fleet.md, through the gateway)."""
        keys = KeySpace(prefix)
        self.call("auth/user/add", {"name": "root", "password": ROOT_PASSWORD})
        self.call("auth/role/add", {"name": "root"})
        self.call("auth/user/grant", {"user": "root", "role": "root"})
        for host in hosts:
            self.call("auth/user/add", {"name": host, "password": f"{host}-secret"})
            self.call("auth/role/add", {"name": host})
            own = [(keys.member(host), None), (keys.host_claims(host), "prefix")]
            own.append((keys.host_failures(host), "prefix"))
            for key, kind in own:
                perm = {"key": _b64(key), "permType": "READWRITE"}
                if kind == "prefix":
                    perm["range_end"] = _b64(range_end(key))
                self.call("auth/role/grant", {"name": host, "perm": perm})
            read = {"key": _b64(prefix), "range_end": _b64(range_end(prefix)), "permType": "READ"}
            self.call("auth/role/grant", {"name": host, "perm": read})
            self.call("auth/user/grant", {"user": host, "role": host})
        self.call("auth/enable", {})
        self.token = self.call("auth/authenticate", {"name": "root", "password": ROOT_PASSWORD})[
            "token"
        ]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@contextlib.contextmanager
def running(tmp: Path) -> Iterator[Etcd]:
    server = Etcd(tmp / "data", tmp / "etcd.log")
    try:
        yield server.start()
    finally:
        server.kill()


def settings(url: str, host: str, prefix: str = "/adaptd/", **kw: Any) -> FleetSettings:
    """Fleet settings for tests: short leases and deadlines, so failures show fast."""
    kw.setdefault("lease_ttl_s", 3)
    kw.setdefault("call_timeout_s", 0.5)
    kw.setdefault("call_deadline_s", 1.0)
    return FleetSettings(endpoints=(url,), host=host, prefix=prefix, **kw)


MEMBER_SCRIPT = Path(__file__).with_name("member_proc.py")


class MemberProc:
    """A fleet member in its own process (tests/fleet/member_proc.py): send it
    ``want``/``release`` lines, wait for the JSON views it prints."""

    def __init__(self, url: str, prefix: str, host: str, ttl: int = 3) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            [sys.executable, str(MEMBER_SCRIPT), url, prefix, host, str(ttl)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.put(json.loads(line))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
        """The first view printed (since the last wait) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self.host}: no matching view in {timeout_s:g}s; seen {self.seen[-3:]}"
                )
            try:
                view = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(view)
            if predicate(view):
                return view

    def kill(self) -> float:
        """SIGKILL; returns the monotonic time it was sent."""
        t = time.monotonic()
        self.proc.kill()
        self.proc.wait(10)
        return t

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.send("quit")
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def holders(server: Etcd, prefix: str) -> list[tuple[str, str, str]]:
    """(host, target, job) of every claim that holds a slot, read from etcd directly."""
    keys = KeySpace(prefix)
    out = server.call(
        "kv/range", {"key": _b64(keys.claims), "range_end": _b64(range_end(keys.claims))}
    )
    found = []
    for kv in out.get("kvs", ()):
        parts = keys.claim_parts(base64.b64decode(kv["key"]).decode())
        if parts and json.loads(base64.b64decode(kv["value"]))["holding"]:
            found.append(parts)
    return sorted(found)
