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

It can also serve TLS (:class:`Tls`: ``https://`` with a CA and a server certificate,
optionally requiring client certificates), start as one member of a cluster
(:func:`cluster`: three members on loopback) and be wiped (:meth:`Etcd.wipe`: killed,
its data directory emptied, started again as a new, empty cluster).

Not part of the installed package: the daemon never starts an etcd.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptd.fleet.keys import KeySpace, range_end

#: Seconds for etcd to answer /health after a (re)start.
START_DEADLINE_S = 30.0
ROOT_PASSWORD = "root-secret"
MISSING = "needs etcd (Debian etcd-server; scripts/install-test-deps.sh installs it)"


class EtcdMissing(RuntimeError):
    """No etcd binary on PATH (the message names the package)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Tls:
    """The files of an etcd serving TLS: its CA (what clients trust), its certificate
    and key (for 127.0.0.1), and whether clients must show a certificate of that CA."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_auth: bool = False
    #: a client certificate and key of the same CA (for ``client_cert_auth``)
    client_cert: Path | None = None
    client_key: Path | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if self.client_cert is not None and self.client_key is not None:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def make_tls(folder: Path, *, client_cert_auth: bool = False) -> Tls:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, made
    with the ``openssl`` program (EC P-256, valid a day) in ``folder``."""
    exe = shutil.which("openssl")
    if exe is None:
        raise EtcdMissing("needs openssl (Debian openssl) to make test certificates")
    folder.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([exe, *args], check=True, capture_output=True, cwd=folder)

    run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=adaptd-test-ca")  # fmt: skip
    # etcd's gateway calls its own gRPC server with the server's certificate, so with
    # --client-cert-auth that one must be good for client use too
    for who, usage in (("server", "serverAuth,clientAuth"), ("client", "clientAuth")):
        run("req", *key, "-keyout", f"{who}.key", "-out", f"{who}.csr",
            "-subj", f"/CN=adaptd-test-{who}")  # fmt: skip
        (folder / f"{who}.ext").write_text(
            f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"
        )
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{who}.pem", "-days", "1",
            "-extfile", f"{who}.ext")  # fmt: skip
    return Tls(
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server.key",
        client_cert_auth=client_cert_auth,
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
    )


class Etcd:
    """One etcd member on loopback: a single-member cluster unless :func:`cluster`
    makes it one of several (``name``, ``initial_cluster``)."""

    def __init__(
        self,
        data_dir: Path,
        log: Path,
        *,
        name: str = "adaptd-test",
        tls: Tls | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log = log
        self.name = name
        self.tls = tls
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.initial_cluster = f"{name}={self.peer_url}"
        self.cluster_state = "new"
        self.proc: subprocess.Popen | None = None
        self.token: str | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self) -> Etcd:
        exe = shutil.which("etcd")
        if exe is None:
            raise EtcdMissing(MISSING)
        self.spawn(exe)
        return self.wait_healthy()

    def spawn(self, exe: str) -> None:
        """Start the process (:meth:`start` also waits until it answers)."""
        peer = self.peer_url
        args = [
            exe,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.initial_cluster}",
            f"--initial-cluster-state={self.cluster_state}",
            "--logger=zap",
            "--log-level=warn",
        ]
        if self.tls is not None:
            args += [f"--cert-file={self.tls.cert_file}", f"--key-file={self.tls.key_file}"]
            if self.tls.client_cert_auth:
                args += ["--client-cert-auth", f"--trusted-ca-file={self.tls.ca_file}"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def wait_healthy(self) -> Etcd:
        """Wait until the member answers /health (raises, with its log, if it does not)."""
        assert self.proc is not None
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
            with self._open(urllib.request.Request(self.url + "/health"), 1.0) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _open(self, req: urllib.request.Request, timeout: float) -> Any:
        if self.tls is None:
            return urllib.request.urlopen(req, timeout=timeout)
        return urllib.request.urlopen(req, timeout=timeout, context=self.tls.context())

    def wipe(self) -> None:
        """Kill, empty the data directory, start again: a new cluster that knows no key,
        no lease and no revision of the old one (an operator restoring nothing)."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()

    def kill(self) -> None:
        """SIGKILL: etcd vanishes mid-run (its data stays for :meth:`start`)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: connections are accepted, nothing is answered (slow / partitioned).

        Returns once the kernel shows the process stopped (a signal is delivered
        asynchronously: a request sent at once could otherwise still be answered).
        Raises RuntimeError when it is not stopped within 5 s."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{self.proc.pid}/stat")
        deadline = time.monotonic() + 5.0
        while stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd (pid {self.proc.pid}) not stopped 5 s after SIGSTOP")
            time.sleep(0.005)

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
            with self._open(req, 5.0) as r:
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
            own.append((keys.host_ranks(host), "prefix"))
            own.append((keys.grants, "prefix"))  # every host's: a grant rewrites its target's
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
def running(tmp: Path, tls: Tls | None = None) -> Iterator[Etcd]:
    """A started :class:`Etcd` with its data under ``tmp``, killed at the end."""
    tmp.mkdir(parents=True, exist_ok=True)
    server = Etcd(tmp / "data", tmp / "etcd.log", tls=tls)
    try:
        yield server.start()
    finally:
        server.kill()


@contextlib.contextmanager
def cluster(tmp: Path, members: int = 3) -> Iterator[list[Etcd]]:
    """``members`` etcd members on loopback forming one cluster (started together, as a
    cluster must be: each waits for a quorum), killed at the end."""
    exe = shutil.which("etcd")
    if exe is None:
        raise EtcdMissing(MISSING)
    tmp.mkdir(parents=True, exist_ok=True)
    nodes = [Etcd(tmp / f"m{i}", tmp / f"m{i}.log", name=f"m{i}") for i in range(members)]
    initial = ",".join(f"{n.name}={n.peer_url}" for n in nodes)
    try:
        for n in nodes:
            n.initial_cluster = initial
            n.spawn(exe)
        for n in nodes:
            n.wait_healthy()
        yield nodes
    finally:
        for n in nodes:
            n.kill()
