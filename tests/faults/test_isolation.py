"""Isolation between jobs, and between jobs and operators, on a real ``adaptd serve``.

A connection reports for, and hears about, only the job it said hello as; a second
process or another user cannot take a running job's rank; operator commands exist
only on the admin socket, which answers root, the daemon's user and the admin
group; the job socket is 0660 in the runtime directory; TCP needs CURVE and then
admits only allowed keys; nothing is unpickled and no path from a message is ever
written or deleted by the daemon.
"""

from __future__ import annotations

import grp
import os
import pickle
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth

from adaptd.client.daemon.link import DaemonLink
from adaptd.config import loader as config
from adaptd.protocol import admin
from adaptd.protocol import job as p

from ._abuse import PeerProc, Rank, Served, V, raw, wait_until

ROOT = Path(__file__).resolve().parents[2]
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
NOBODY = 65534


@pytest.fixture
def where() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="adi-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def served(where: Path) -> Iterator[Served]:
    d = Served(where, daemon={"socket_mode": "0666", "admin_socket_mode": "0666"})
    yield d
    d.stop()


# ------------------------------------------------------------------ jobs


def test_decisions_reach_only_the_job_that_said_hello(served: Served, zctx: zmq.Context) -> None:
    """Two jobs on one daemon: an operator's save-now for one reaches only its
    connection, and a report for the other job from it is refused and changes nothing."""
    a, b = Rank(zctx, served.endpoint, "iso-a"), Rank(zctx, served.endpoint, "iso-b")
    a.hello(policy="fixed:steps=100")
    b.hello(policy="fixed:steps=100")
    served.request(admin.SaveNowRequest(job="iso-a", reason="ops"))
    assert a.until(p.SaveNow).job == "iso-a"
    assert b.silent_for(0.5)  # nothing for b
    b.send(p.Steps(v=V, job="iso-a", rank=0, step=999, count=1, mean_s=0.1))
    b.send(p.SaveReport(v=V, job="iso-a", rank=0, step=50, blocking_s=1, durable_s=1, bytes=1))
    assert b.until(p.Error).code == "wrong_job" and b.until(p.Error).code == "wrong_job"
    info = served.job("iso-a")
    assert info is not None and info.step == 0 and info.saves == 0
    # a report before any hello on a fresh connection: refused, nothing created
    c = Rank(zctx, served.endpoint, "iso-c")
    c.steps(10)
    assert c.until(p.Error).code == "unknown_peer"
    assert served.job("iso-c") is None


def test_a_second_process_cannot_take_a_live_rank(served: Served, zctx: zmq.Context) -> None:
    """Process B says hello as the rank process A holds, even claiming A's pid: refused
    (``rank_taken``) while A lives, and A keeps its plan and save requests. Once A is
    dead, a new process for the rank is a resume, as a restarted job's is."""
    a = PeerProc({"endpoint": served.endpoint, "job": "held", "policy": "fixed:steps=100"})
    b = c = None
    try:
        a.wait_for('"kind": "plan"')
        b = PeerProc({"endpoint": served.endpoint, "job": "held", "pid": a.pid})
        line = b.wait_for('"kind": "error"')
        assert '"rank_taken"' in line, line
        info = served.job("held")
        assert info is not None and [r.pid for r in info.ranks] == [a.pid]
        assert info.incarnation == 1 and served.status().daemon.rejected["rank_taken"] >= 1
        served.request(admin.SaveNowRequest(job="held", reason="ops"))
        a.wait_for('"kind": "save_now"')
        assert not any("welcome" in ln or "save_now" in ln for ln in b.log.lines)
        a.kill()
        c = PeerProc({"endpoint": served.endpoint, "job": "held", "retry": True})
        c.wait_for('"kind": "welcome"')
        info = served.job("held")
        assert info is not None and [r.pid for r in info.ranks] == [c.pid]
        assert info.incarnation == 2  # the dead process's run was lost, this one resumed
    finally:
        for proc in (a, b, c):
            if proc is not None:
                proc.kill()


@root_only
def test_another_user_cannot_join_a_running_job(served: Served, zctx: zmq.Context) -> None:
    """A job started by root: a process of user nobody may not say hello into it
    (``wrong_job``), but may run a job of its own on the same daemon."""
    os.chmod(served.where, 0o755)  # let nobody reach the 0666 test socket
    owner = Rank(zctx, served.endpoint, "roots-job")
    owner.hello(policy="fixed:steps=100")
    drop = {"uid": NOBODY, "gid": NOBODY, "groups": []}
    intruder = PeerProc({"endpoint": served.endpoint, "job": "roots-job", "rank": 0, **drop})
    other = PeerProc({"endpoint": served.endpoint, "job": "nobodys-job", **drop})
    try:
        line = intruder.wait_for('"kind": "error"')
        assert '"wrong_job"' in line, line
        other.wait_for('"kind": "welcome"')
        info = served.job("roots-job")
        assert info is not None and len(info.ranks) == 1 and info.incarnation == 1
        assert not any("welcome" in ln for ln in intruder.log.lines)
    finally:
        intruder.kill()
        other.kill()


# ------------------------------------------------------------------ operators


@pytest.mark.parametrize(
    "frame",
    [
        admin.encode(admin.SaveNowRequest(job="victim", reason="evil")),
        admin.encode(admin.DrainRequest(timeout_s=5)),
        admin.encode(admin.SetPolicyRequest(job="victim", spec="fixed:steps=1")),
        admin.encode(admin.PauseRequest(job="victim")),
        admin.encode(admin.StatusRequest()),
        p.encode(p.SaveNow(v=V, job="victim", reason="evil")),  # a daemon's message
        p.encode(p.Plan(v=V, job="victim", seq=99, next_step=1, every_steps=1)),
        raw(kind="save_now", v=V, job="victim", reason="evil"),
        raw(kind="drain", v=V),
    ],
    ids=["save_now", "drain", "set_policy", "pause", "status", "SaveNow", "Plan", "kind", "op"],
)
def test_operator_commands_are_refused_on_the_job_socket(
    served: Served, zctx: zmq.Context, frame: bytes
) -> None:
    """Every operator request, and every daemon-side message, sent on the job socket
    is refused as ``invalid`` and has no effect on the job it names."""
    victim = Rank(zctx, served.endpoint, "victim")
    victim.hello(policy="fixed:steps=100")
    before = served.job("victim")
    evil = Rank(zctx, served.endpoint, "evil")
    evil.sock.send(frame)
    assert evil.until(p.Error).code == "invalid"
    assert victim.silent_for(0.3)
    after = served.job("victim")
    assert after is not None and before is not None
    assert (after.urgent, after.paused, after.policy, after.plan) == (
        before.urgent, before.paused, before.policy, before.plan,
    )  # fmt: skip
    assert not served.status().daemon.by_kind.get("save_now")


@root_only
def test_admin_socket_answers_root_and_the_admin_group_only(where: Path) -> None:
    """Even with its file opened to everyone (0666), the admin socket refuses a user
    who is neither root, the daemon's user nor in ``daemon.admin_group``, and
    answers one who is in the group."""
    group = grp.getgrgid(NOBODY).gr_name
    served = Served(where, daemon={"admin_socket_mode": "0666", "admin_group": group})
    os.chmod(where, 0o755)
    try:
        out = PeerProc({"admin": str(served.socket), "uid": NOBODY, "gid": NOBODY - 1})
        line = out.wait_for("error")
        assert '"denied"' in line, line
        ok = PeerProc({"admin": str(served.socket), "uid": NOBODY, "gid": NOBODY})
        assert '"StatusReply"' in ok.wait_for("op")
        member = PeerProc(
            {"admin": str(served.socket), "uid": NOBODY, "gid": NOBODY - 1, "groups": [NOBODY]}
        )
        assert '"StatusReply"' in member.wait_for("op")  # a supplementary group counts
        assert isinstance(served.status(), admin.StatusReply)  # root
        assert served.status().daemon.rejected.get("admin_denied") == 1
    finally:
        served.stop()


def test_socket_files_live_in_the_runtime_dir_with_their_modes(where: Path) -> None:
    """Defaults of ``adaptd serve``: job socket 0660, admin socket 0600, both sockets
    (not regular files) in the runtime directory."""
    served = Served(where)
    try:
        # ``Served`` returns once the job socket exists; the daemon gives the sockets
        # their modes after binding them and before it serves. An answer means it
        # serves (a fresh-clone run under load read the job socket's 0700 in between).
        assert isinstance(served.status(), admin.StatusReply)
        for path, mode in ((served.socket, 0o660), (served.admin_socket, 0o600)):
            st = os.lstat(path)
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == mode, path
            assert path.parent == where  # $RUNTIME_DIRECTORY of this daemon
    finally:
        served.stop()


# ------------------------------------------------------------------ TCP and CURVE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tcp_is_refused_without_curve_keys(where: Path) -> None:
    port = free_port()
    with pytest.raises(config.ConfigError, match="TCP is refused without CURVE"):
        config.loads(f'[daemon]\nsocket = "tcp://127.0.0.1:{port}"')
    res = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "serve", "--socket", f"tcp://127.0.0.1:{port}",
         "--state-dir", str(where), "--metrics-listen", "off"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 1 and "CURVE" in res.stderr
    with socket.socket() as s:  # nothing listens there
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_curve_admits_only_allowed_keys(where: Path, zctx: zmq.Context) -> None:
    """A TCP daemon with CURVE: a plain ZeroMQ peer and a peer with an unknown key get
    nothing (ZAP refuses them before a message reaches the daemon); an allowed
    client's hook link is welcomed and planned."""
    keys = where / "keys"
    allowed = keys / "clients"
    allowed.mkdir(parents=True)
    _, server_secret = zmq.auth.create_certificates(keys, "server")
    client_public, client_secret = zmq.auth.create_certificates(keys, "client")
    shutil.copy(client_public, allowed)
    _, stranger_secret = zmq.auth.create_certificates(keys, "stranger")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    served = Served(
        where,
        daemon={
            "socket": endpoint,
            "curve_secret_key": str(server_secret),
            "curve_client_keys": str(allowed),
        },
    )
    try:
        server_public = keys / "server.key"
        plain = Rank(zctx, endpoint, "plain")
        plain.send(p.Hello(v=V, job="plain"))
        stranger = zctx.socket(zmq.DEALER)
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.curve_serverkey = zmq.auth.load_certificate(server_public)[0]
        stranger.curve_publickey, stranger.curve_secretkey = zmq.auth.load_certificate(
            stranger_secret
        )
        stranger.connect(endpoint)
        stranger.send(p.encode(p.Hello(v=V, job="stranger")))
        link = DaemonLink(endpoint, curve_server_key=server_public, curve_client_key=client_secret)
        got: list[p.DaemonMessage] = []

        def welcomed() -> bool:  # the hook says hello until answered (IMMEDIATE=1 drops
            if not got:  # a send made before the CURVE handshake is done)
                link.send(p.Hello(v=V, job="trusted", pid=os.getpid()), 0.0)
            got.extend(link.receive(0.0))
            return len(got) >= 2

        wait_until(welcomed, "welcome and plan for the allowed key")
        assert [type(m) for m in got[:2]] == [p.Welcome, p.Plan]
        assert plain.silent_for(0.5) and not stranger.poll(100)
        info = served.status()
        assert [j.job for j in info.jobs] == ["trusted"]
        assert set(info.daemon.by_kind) == {"hello"} and info.daemon.rejected == {}
        assert re.search(r"curve.*client_keys=1", served.log.text())
        # operators reach a TCP daemon's admin socket in the runtime directory
        res = subprocess.run(
            [sys.executable, "-m", "adaptd.cli", "status", "--json"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "ADAPTD_SOCKET": endpoint, "RUNTIME_DIRECTORY": str(where)},
        )  # fmt: skip
        assert res.returncode == 0 and '"trusted"' in res.stdout, res.stderr
        link.close()
        stranger.close(0)
        plain.close()
        # without keys the hook refuses to connect to a tcp:// daemon, naming what to set
        env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTD_CURVE")}
        res = subprocess.run(
            [sys.executable, "-c",
             f"from adaptd.client.daemon.link import DaemonLink; DaemonLink({endpoint!r})"],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert res.returncode != 0 and "ADAPTD_CURVE_SERVER_KEY" in res.stderr
    finally:
        served.stop()


# ------------------------------------------------------------------ no pickle, no paths

#: Names whose use in the daemon or the hook would deserialise executable objects.
UNSAFE = re.compile(
    r"\b(pickle|cPickle|_pickle|dill|cloudpickle|shelve|marshal\.loads?|jsonpickle)\b"
    r"|yaml\.(unsafe_)?load\b|allow_pickle\s*=\s*True"
)


def test_no_code_path_can_unpickle() -> None:
    """The shipped code (daemon, hook, policies) never names a deserialiser that
    can run code; every message goes through msgspec's typed decoders."""
    hits = []
    for folder in ("adaptd", "client", "policies"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if UNSAFE.search(code) and "Nothing is ever unpickled" not in line:
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, hits


AUDITED = Path(__file__).with_name("_audited.py")


def test_paths_in_messages_are_never_written_or_deleted(where: Path, zctx: zmq.Context) -> None:
    """Hellos and save reports whose checkpoint directory and paths name a victim
    directory and file, and a pickle sent as a message: under a Python audit hook
    (every open for writing, remove, rename, rmdir, chmod, chown, truncate, utime in
    the daemon process), nothing touches the victim, nothing is unpickled, and the
    victim's bytes, times and listing are unchanged after the daemon exits."""
    victim = where / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "checkpoint").write_text("model_checkpoint_path: ckpt-1\n")
    (victim / "ckpt-1.index").write_bytes(os.urandom(512))
    (victim / "sub" / "keep").write_text("keep")
    before = {str(p): (p.read_bytes() if p.is_file() else b"", os.lstat(p).st_mtime_ns)
              for p in sorted(victim.rglob("*"))}  # fmt: skip
    audit = where / "audit.log"
    served = Served(
        where,
        env={"ADAPTD_AUDIT_LOG": str(audit), "ADAPTD_AUDIT_WATCH": str(victim)},
        python=(sys.executable, str(AUDITED)),
    )
    try:
        targets = [str(victim), str(victim / "checkpoint"), f"{victim}/../victim/sub", "/"]
        for i, target in enumerate(targets):
            r = Rank(zctx, served.endpoint, f"path-{i}")
            r.hello(checkpoint_dir=target, policy="fixed:steps=10")
            r.steps(10)
            r.saved(10, path=target, error="", ok=True)
            r.saved(20, path=str(victim / "ckpt-1.index"), ok=False, error=f"rm -rf {target}")
            if i % 2:
                r.goodbye(20)
            r.close()
        served.request(admin.SaveNowRequest(job=None, reason=str(victim)))
        pickled = pickle.dumps(os.system)  # unpickling it would import posix.system
        evil = Rank(zctx, served.endpoint, "evil")
        evil.sock.send(pickled)
        assert evil.until(p.Error).code in {"malformed", "invalid"}  # msgpack says no
        evil.close()
        served.log.wait_for("event=save", "job=path-3", "ok=False")
    finally:
        assert served.stop() == 0
    after = {str(p): (p.read_bytes() if p.is_file() else b"", os.lstat(p).st_mtime_ns)
             for p in sorted(victim.rglob("*"))}  # fmt: skip
    assert after == before
    lines = audit.read_text().splitlines()
    assert lines and lines[0] == "audit on", lines[:3]
    assert lines[1:] == [], lines[1:20]

    # the hook does see writes: the same wrapper running a module that writes there
    probe = where / "probe.log"
    (where / "in.json").write_text("{}")
    env = {**os.environ, "ADAPTD_AUDIT_LOG": str(probe), "ADAPTD_AUDIT_WATCH": str(victim)}
    subprocess.run(
        [sys.executable, str(AUDITED), "-m", "json.tool", str(where / "in.json"),
         str(victim / "sub" / "keep")],
        env=env, check=True, timeout=60,
    )  # fmt: skip
    assert "open-for-write" in probe.read_text()
