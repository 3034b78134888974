"""A real etcd on loopback for tests and benchmarks: start, kill, stop, auth roles.

``etcd`` (Debian ``etcd-server``, installed by scripts/install-test-deps.sh) runs as a
subprocess on free loopback ports with a data directory of the caller's. :class:`Etcd`
can kill it (SIGKILL), start it again on the same ports and data, stop it (SIGSTOP: a
slow or partitioned etcd that accepts connections and never answers) and let it go on
(SIGCONT), and turn on authentication with a role per host (:meth:`Etcd.enable_auth`,
the roles docs/fleet.md tells operators to create)::

    from local_etcd import running          # with scripts/ on sys.path
    with running(tmp_dir) as etcd:
        ...                                # etcd.url is http://127.0.0.1:PORT

Not part of the installed package: the daemon never starts an etcd.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from adaptd.fleet.keys import KeySpace, range_end

#: Seconds for etcd to answer /health after a (re)start.
START_DEADLINE_S = 30.0
ROOT_PASSWORD = "root-secret"


class EtcdMissing(RuntimeError):
    """No etcd binary on PATH (the message names the package)."""


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
            raise EtcdMissing(
                "needs etcd (Debian etcd-server; scripts/install-test-deps.sh installs it)"
            )
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
    """A started :class:`Etcd` with its data under ``tmp``, killed at the end."""
    tmp.mkdir(parents=True, exist_ok=True)
    server = Etcd(tmp / "data", tmp / "etcd.log")
    try:
        yield server.start()
    finally:
        server.kill()
