"""Only an operator changes a job's policy or pause, also across hosts (issue 26).

Before the fix a job's own rank could send its daemon ``Request(op="set_policy")`` (or
``resume``) and override what the operator set: the request is in-band, carried by the
job's processes. Now the daemon an operator typed at signs what it relays
(``daemon.relay_key_file``, :mod:`adaptd.protocol.relay_auth`), and the deciding daemon takes
only a valid, fresh signature it has not seen. Two daemons in this process play two
hosts; the ranks are raw DEALER peers (tests/daemon/test_one_authority.py's setup).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import zmq
from daemon_helpers import DEADLINE, PINNED, Peer
from test_one_authority import FLEET_SECRET, V, hello, host, job_info

from adaptd.protocol import admin
from adaptd.protocol import job as p
from adaptd.protocol.relay_auth import MAX_AGE_S, RelayKey


@pytest.fixture
def chief_and_worker(short_dir: Path):
    """Host A decides job ``mw`` (its chief, rank 0), host B has rank 1; both daemons
    hold the fleet's relay key. Yields (A, B, chief peer, worker peer)."""
    for name in ("a", "b"):
        (short_dir / name).mkdir()
    ctx = zmq.Context.instance()
    with (
        host(short_dir / "a" / "d.sock", "host-a", relay_key=RelayKey(FLEET_SECRET)) as (a, _, _),
        host(short_dir / "b" / "d.sock", "host-b", relay_key=RelayKey(FLEET_SECRET)) as (b, _, _),
    ):
        chief, worker = Peer(ctx, a.endpoint), Peer(ctx, b.endpoint)
        try:
            hello(chief, 0, "host-a")
            chief.expect(p.Plan)
            hello(worker, 1, "host-b")
            yield a, b, chief, worker
        finally:
            chief.close()
            worker.close()


def request(op: str, auth: str = "", spec: str = "", origin: str = "host-b") -> p.Request:
    return p.Request(v=V, job="mw", rank=0, op=op, spec=spec, origin=origin, auth=auth)


def refused(peer: Peer) -> str:
    error = peer.expect(p.Error)
    assert error.code == "refused", error
    return error.message


def test_a_rank_cannot_set_its_own_jobs_policy_or_resume_its_saves(chief_and_worker) -> None:
    a, _, chief, _ = chief_and_worker
    chief.send(request("set_policy", spec="fixed:steps=1"))  # made up by the job
    assert "only an operator" in refused(chief)
    assert job_info(a).policy == PINNED and "mw" not in a.job_settings
    reply = admin.request(a.socket_path, admin.PauseRequest(job="mw"), timeout_s=DEADLINE)
    assert reply.jobs == ["mw"] and chief.expect(p.Plan).next_step is None  # the operator's
    chief.send(request("resume"))
    assert "not signed" in refused(chief)
    assert job_info(a).paused  # the operator's pause holds
    chief.send(request("save_now"))  # a save of its own: a job may ask that anyway
    assert chief.expect(p.SaveNow).job == "mw"


def test_a_request_typed_on_the_other_host_is_taken_once_signed_as_it_was(
    chief_and_worker,
) -> None:
    a, b, chief, worker = chief_and_worker
    reply = admin.request(
        b.socket_path, admin.SetPolicyRequest(job="mw", spec="fixed:steps=7"), DEADLINE
    )
    assert reply.relayed_to  # the chief's daemon
    relay = worker.expect(p.Relay)
    assert relay.auth.startswith("v1:")
    chief.send(request("set_policy", relay.auth, spec="fixed:steps=9"))  # changed in transit
    assert "does not match" in refused(chief)
    chief.send(request("set_policy", relay.auth, spec="fixed:steps=7"))
    assert chief.expect(p.Plan).every_steps == 7 and job_info(a).policy == "fixed:steps=7"
    chief.send(request("set_policy", relay.auth, spec="fixed:steps=7"))  # replayed
    assert "taken before" in refused(chief)


def test_a_signature_of_another_key_or_too_old_is_refused(chief_and_worker) -> None:
    a, _, chief, _ = chief_and_worker
    other = RelayKey(b"x" * 32).sign("mw", "set_policy", "fixed:steps=3", "", "host-b")
    chief.send(request("set_policy", other, spec="fixed:steps=3"))
    assert "does not match" in refused(chief)
    old = RelayKey(FLEET_SECRET, wall=lambda: time.time() - MAX_AGE_S - 60)
    stale = old.sign("mw", "set_policy", "fixed:steps=3", "", "host-b")
    chief.send(request("set_policy", stale, spec="fixed:steps=3"))
    assert "beyond" in refused(chief)
    skewed = RelayKey(FLEET_SECRET, wall=lambda: time.time() + 30)  # clocks 30 s apart
    ok = skewed.sign("mw", "set_policy", "fixed:steps=3", "", "host-b")
    chief.send(request("set_policy", ok, spec="fixed:steps=3"))
    assert chief.expect(p.Plan).every_steps == 3 and job_info(a).policy == "fixed:steps=3"


def test_without_a_relay_key_only_save_now_is_relayed(short_dir: Path) -> None:
    for name in ("a", "b"):
        (short_dir / name).mkdir()
    ctx = zmq.Context.instance()
    with (
        host(short_dir / "a" / "d.sock", "host-a") as (a, _, _),
        host(short_dir / "b" / "d.sock", "host-b") as (b, _, _),
    ):
        chief, worker = Peer(ctx, a.endpoint), Peer(ctx, b.endpoint)
        try:
            hello(chief, 0, "host-a")
            chief.expect(p.Plan)
            hello(worker, 1, "host-b")
            with pytest.raises(admin.AdminError) as info:
                admin.request(b.socket_path, admin.SetPolicyRequest(job="mw", spec="young"))
            assert info.value.code == "not_deciding" and "relay_key_file" in str(info.value)
            reply = admin.request(b.socket_path, admin.SaveNowRequest(job="mw", reason="op-b"))
            assert reply.relayed == ["mw"] and worker.expect(p.Relay).auth == ""
            chief.send(request("set_policy", spec="young"))  # and A takes none unsigned
            assert "no daemon.relay_key_file" in refused(chief)
        finally:
            chief.close()
            worker.close()


def test_the_key_file_must_be_private_and_long_enough(tmp_path: Path) -> None:
    key = tmp_path / "relay.key"
    key.write_bytes(b"s" * 32)
    os.chmod(key, 0o644)
    with pytest.raises(ValueError, match="readable by every user"):
        RelayKey.load(key)
    os.chmod(key, 0o600)
    assert RelayKey.load(key).check("j", "pause", "", "", "h", "nope") != ""
    key.write_bytes(b"short")
    with pytest.raises(ValueError, match="at least 16"):
        RelayKey.load(key)
    with pytest.raises(ValueError, match="cannot read"):
        RelayKey.load(tmp_path / "missing.key")
