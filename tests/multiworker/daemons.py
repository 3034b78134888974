"""The multi-worker tests' daemons: real ``adaptd serve`` processes, their status over
the admin socket, and ending a job of endless steps the agreed way (SIGTERM of the
non-chief: one agreed save, then every worker stops)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from adaptd.commands._spawn import start_daemon, stop_daemon
from adaptd.protocol import admin, paths
from multiworker.cluster import Cluster

DEADLINE = 120.0
#: Far more steps than a run takes: the test ends it (:func:`stop_job`) after its checks.
ENDLESS = "1000000"
JOB = "mw"


def serve(root: Path, name: str, policy: str, config: str = "") -> subprocess.Popen:
    """``adaptd serve`` of host ``name``: socket ``root/name/d.sock``, its state beside
    it, its log ``root/daemon-<name>.log`` (appended to: a restart keeps the first
    run's lines). A socket file left by a killed daemon is removed first. Every host
    has the same relay key (``root/relay.key``), so an operator's set-policy, pause and
    resume typed on any host are relayed signed to the deciding one. ``config``: more
    lines of its configuration file (sections after ``[metrics]``; ``{host}`` is the
    host's name)."""
    (root / name).mkdir(exist_ok=True)
    sock = root / name / "d.sock"
    for stale in (sock, paths.admin_socket_path(sock)):
        stale.unlink(missing_ok=True)
    key = root / "relay.key"
    if not key.exists():
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
    path = root / name / "adaptd.toml"
    path.write_text(
        f"[daemon]\nstate_dir = {json.dumps(str(root / name / 'state'))}\n"
        f'relay_key_file = {json.dumps(str(key))}\n[metrics]\nlisten = "off"\n'
        + config.replace("{host}", name)
    )
    with open(root / f"daemon-{name}.log", "ab") as log:
        return start_daemon(sock, ["--policy", policy, "--config", str(path)], log=log)


@contextlib.contextmanager
def hosts(
    root: Path, policy: str, names: Sequence[str] = ("a", "b"), config: str = ""
) -> Iterator[list[Path]]:
    """One ``adaptd serve`` per host, each with its own socket and state (and ``config``,
    as for :func:`serve`); their sockets."""
    procs = []
    try:
        for name in names:
            procs.append(serve(root, name, policy, config))
        yield [root / name / "d.sock" for name in names]
    finally:
        for proc in procs:
            stop_daemon(proc)


def job_info(sock: Path) -> admin.JobInfo | None:
    reply = admin.request(sock, admin.StatusRequest(), timeout_s=10.0)
    assert isinstance(reply, admin.StatusReply)
    return next((j for j in reply.jobs if j.job == JOB), None)


def wait_for(
    what: str, check: Callable[[], Any], cluster: Cluster, timeout: float = DEADLINE
) -> Any:
    """Poll ``check`` (a daemon's status: there is no event to wait on over its socket)
    until it returns something true; AssertionError naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.procs):
            raise AssertionError(f"no {what} within {timeout:g}s\n{cluster.tails()}")
        time.sleep(0.05)
    return got


def stop_job(cluster: Cluster) -> list[dict[str, Any]]:
    """SIGTERM rank 1: every worker saves at one agreed step and stops. Their results."""
    cluster.signal(1, signal.SIGTERM)
    codes = cluster.wait(timeout=DEADLINE)
    assert codes == [128 + signal.SIGTERM] * cluster.n, cluster.tails()
    return [cluster.result(r) for r in range(cluster.n)]


def policy_is(sock: Path, spec: str) -> admin.JobInfo | None:
    """The job's status on ``sock`` once its policy is ``spec``."""
    info = job_info(sock)
    return info if info is not None and info.policy == spec else None


def shows_plan(sock: Path, every: int) -> admin.JobInfo | None:
    """The job's status on ``sock`` once it shows a plan of every ``every`` steps and
    the host that decided it."""
    info = job_info(sock)
    ok = info is not None and info.plan is not None and info.plan.every_steps == every
    return info if ok and info.decided_by else None
