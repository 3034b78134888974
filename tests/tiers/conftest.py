"""Fixtures for the tiered-storage tests: a real S3-compatible server on loopback.

``s3`` is moto's server mode (``python -m moto.server``) in a subprocess bound to
127.0.0.1 on a free port: real HTTP, real s3fs/botocore on the client side, no
patching. One server serves the session; each test gets a fresh bucket, so tests
never see each other's objects. Where s3fs or moto is not installed the tests that
use it are skipped (``pip install 'adaptd[s3]' moto[server]``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: Seconds to wait for the moto server to answer (importing moto takes a few).
START_DEADLINE_S = 60.0
_buckets = itertools.count()


@dataclass(frozen=True)
class MotoServer:
    endpoint: str
    process: subprocess.Popen
    log: Path


@dataclass(frozen=True)
class S3:
    """One test's S3 bucket on the session's moto server.

    ``options`` are fsspec ``storage_options`` for s3fs (``Replica(url,
    storage_options=s3.options)``); ``env`` the same for a subprocess (botocore reads
    ``AWS_ENDPOINT_URL``); ``fs`` an s3fs filesystem for looking at or damaging
    objects behind the code under test's back.
    """

    endpoint: str
    bucket: str
    options: dict[str, Any]
    env: dict[str, str]
    fs: Any

    def url(self, *parts: str) -> str:
        """``s3://<bucket>/<parts...>``."""
        return "/".join([f"s3://{self.bucket}", *parts])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=1.0):
            return True
    except urllib.error.HTTPError:  # any HTTP answer means it is serving
        return True
    except OSError:
        return False


def _start(log: Path) -> MotoServer:
    """Start moto's server on a free loopback port; wait until it answers HTTP."""
    for _attempt in range(3):  # the port may be taken between choosing and binding
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(endpoint):
                return MotoServer(endpoint, proc, log)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.1)  # a pause that ends early if the server dies
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            break
    raise RuntimeError(
        f"moto server did not answer within {START_DEADLINE_S:.0f}s; its log:\n"
        + log.read_text(errors="replace")[-3000:]
    )


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    pytest.importorskip("moto.server", reason="needs moto[server] for a loopback S3 endpoint")
    server = _start(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture
def s3(moto_server: MotoServer, request: pytest.FixtureRequest) -> S3:
    """A fresh, empty bucket on the session's moto server."""
    s3fs = pytest.importorskip("s3fs", reason="needs s3fs (pip install 'adaptd[s3]')")
    options: dict[str, Any] = {
        "key": "testing",
        "secret": "testing",
        "endpoint_url": moto_server.endpoint,
    }
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_server.endpoint,
    }
    # bucket names: 3-63 lowercase letters, digits, hyphens
    name = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())
    bucket = f"t{next(_buckets)}-{name}"[:63].rstrip("-")
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **options)
    fs.mkdir(bucket)
    return S3(moto_server.endpoint, bucket, options, env, fs)


# ---------------------------------------------------------------------- synthetic checkpoints


def write_checkpoint(
    directory: Path, step: int, *, shards: tuple[int, ...] = (300_000,), index: int = 2_000
) -> Path:
    """Files named like TF's ``ckpt-<step>`` (data shards, then the index), seeded bytes.

    For the tests of the storage layer, where TF's content does not matter; the
    restore tests that need a real, restorable checkpoint let TF write it.
    """
    import random

    rng = random.Random(step)
    directory.mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(shards):
        (directory / f"ckpt-{step}.data-{i:05d}-of-{len(shards):05d}").write_bytes(
            rng.randbytes(size)
        )
    (directory / f"ckpt-{step}.index").write_bytes(rng.randbytes(index))
    return directory


@dataclass(frozen=True)
class Dest:
    """One job's folder at a destination, and raw access to its objects behind the
    Replica's back (to damage them, or to look)."""

    kind: str  # "local" (a mounted path) or "s3"
    url: str
    options: dict[str, Any]
    env: dict[str, str]
    _local: Path | None = None
    _s3: S3 | None = None

    def _key(self, name: str) -> str:
        return self.url.removeprefix("s3://") + "/" + name

    def names(self) -> list[str]:
        if self._local is not None:
            return sorted(p.name for p in self._local.iterdir()) if self._local.exists() else []
        assert self._s3 is not None
        prefix = self.url.removeprefix("s3://")
        if not self._s3.fs.exists(prefix):
            return []
        return sorted(p.rsplit("/", 1)[-1] for p in self._s3.fs.ls(prefix, detail=False))

    def read(self, name: str) -> bytes:
        if self._local is not None:
            return (self._local / name).read_bytes()
        assert self._s3 is not None
        return self._s3.fs.cat_file(self._key(name))

    def write(self, name: str, data: bytes) -> None:
        if self._local is not None:
            (self._local / name).write_bytes(data)
            return
        assert self._s3 is not None
        self._s3.fs.pipe_file(self._key(name), data)

    def delete(self, name: str) -> None:
        if self._local is not None:
            (self._local / name).unlink()
            return
        assert self._s3 is not None
        self._s3.fs.rm_file(self._key(name))


@pytest.fixture(params=["local", "s3"])
def dest(request: pytest.FixtureRequest, tmp_path: Path) -> Dest:
    """The same tests against a local directory (standing for NFS) and moto's S3."""
    if request.param == "local":
        folder = tmp_path / "dest" / "job"
        return Dest("local", str(folder), {}, {}, _local=folder)
    s3: S3 = request.getfixturevalue("s3")
    return Dest("s3", s3.url("ckpts", "job"), s3.options, s3.env, _s3=s3)
