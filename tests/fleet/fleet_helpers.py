"""Helpers of the fleet tests: the real etcd (scripts/local_etcd.py), test settings,
a fleet member in a process of its own, and a direct look at etcd's slot holders."""

from __future__ import annotations

import base64
import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import local_etcd
from local_etcd import Etcd, EtcdMissing, _b64

from adaptd.fleet.keys import KeySpace, range_end
from adaptd.fleet.session import FleetSettings

HOSTS = ("host-a", "host-b")


@contextlib.contextmanager
def running(tmp: Path) -> Iterator[Etcd]:
    """:func:`local_etcd.running`, skipping the test where etcd is not installed."""
    try:
        with local_etcd.running(tmp) as server:
            yield server
    except EtcdMissing as exc:
        pytest.skip(str(exc))


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
