"""etcd with authentication on and a role per host (the deployment docs/fleet.md
describes): each daemon works within its own keys and cannot touch another host's."""

from __future__ import annotations

import pytest
from fleet_helpers import Etcd, holders, settings
from local_etcd import _b64

from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.failures import FailureRecord
from adaptd.fleet.keys import KeySpace, range_end
from adaptd.fleet.session import EtcdSession, FleetAuthError

T = "nfs://10.0.4.20/export/ckpt"


def as_host(etcd: Etcd, host: str, password: str | None = None, **kw):
    # etcd checks a password with bcrypt: on a loaded 2-core box that alone can pass
    # the other tests' 0.5 s request timeout
    kw.setdefault("call_timeout_s", 2.0)
    kw.setdefault("call_deadline_s", 4.0)
    return settings(
        etcd.url, host, "/adaptd/", user=host, password=password or f"{host}-secret", **kw
    )


def test_members_with_their_own_roles_share_slots_and_knowledge(auth_etcd: Etcd):
    a = FleetAgent(as_host(auth_etcd, "host-a"), poll_s=0.2).start()
    b = FleetAgent(as_host(auth_etcd, "host-b"), poll_s=0.2).start()
    try:
        a.want("ja", T, cap=1, at_risk_gpu_s=100, gpus=8)
        a.wait_for(lambda v: "ja" in v.granted, 10)
        b.want("jb", T, cap=1, at_risk_gpu_s=100, gpus=8)
        b.wait_for(lambda v: "jb" in v.waiting, 10)  # reads host-a's claim, waits
        a.publish(FailureRecord("host-a", "H100", gpu_seconds=1e9, failures=3))
        a.release("ja")
        b.wait_for(lambda v: "jb" in v.granted and len(v.records) == 1, 15)
        assert holders(auth_etcd, "/adaptd/") == [("host-b", T, "jb")]
        assert sorted(b.view().hosts) == ["host-a", "host-b"]
    finally:
        a.stop()
        b.stop()


def test_a_host_cannot_write_another_hosts_keys(auth_etcd: Etcd):
    s = EtcdSession(as_host(auth_etcd, "host-a")).open()
    keys = s.keys
    s.put(keys.claim("host-a", T, "mine"), b"{}", leased=True)  # its own: fine
    for key in (
        keys.claim("host-b", T, "theirs"),
        keys.member("host-b"),
        keys.failure("host-b", "H100"),
        keys.rank("host-b", "job", 1),
        "/adaptd/anything-else",
    ):
        with pytest.raises(FleetAuthError, match="permission denied"):
            s.put(key, b"{}", leased=False)
    s.close()


def test_a_wrong_password_is_a_configuration_error_not_an_outage(auth_etcd: Etcd):
    with pytest.raises(FleetAuthError, match="host-a"):
        EtcdSession(as_host(auth_etcd, "host-a", password="wrong")).open()
    agent = FleetAgent(as_host(auth_etcd, "host-a", password="wrong"), poll_s=0.2)
    view = agent.poll_once()
    assert not view.up and "user/password" in view.reason
    agent.stop()


def test_without_credentials_nothing_is_allowed(auth_etcd: Etcd):
    with pytest.raises(FleetAuthError):
        s = EtcdSession(settings(auth_etcd.url, "host-a", "/adaptd/")).open()
        s.put("/adaptd/members/host-a", b"{}", leased=True)


def test_an_expired_token_is_renewed(auth_etcd: Etcd):
    """etcd's simple tokens expire (``--auth-token-ttl``, 300 s by default): a session
    whose token etcd no longer knows asks for a new one and goes on."""
    s = EtcdSession(as_host(auth_etcd, "host-a")).open()
    for client in s._clients:  # the test's one look inside: a token etcd never issued
        client.session.headers["Authorization"] = "expired.1"
    s.put(s.keys.member("host-a"), b"{}", leased=True)
    assert [e.key for e in s.get_prefix(s.keys.members)] == ["/adaptd/members/host-a"]
    s.close()


def test_a_role_made_before_the_ranks_keys_keeps_the_fleet_up(auth_etcd: Etcd):
    """A host whose role lacks readwrite on ranks/{host}/ (made by the docs of an earlier
    release): its rank fact is refused and logged once, its round and everything else
    of the fleet go on (the slot is still granted)."""
    own = KeySpace("/adaptd/").host_ranks("host-b")
    span = {"key": _b64(own), "range_end": _b64(range_end(own))}
    auth_etcd.call("auth/role/revoke", {"role": "host-b", **span})
    b = FleetAgent(as_host(auth_etcd, "host-b"), poll_s=0.2)
    try:
        b.tell_rank("j", 1, "its heartbeat stopped")
        b.want("jb", T, cap=1, at_risk_gpu_s=100, gpus=8)
        view = b.poll_once()
        assert view.up and "jb" in view.granted, view.reason
        assert b._rank_refused
        assert auth_etcd.keys("/adaptd/ranks/") == []
    finally:
        b.stop()
        perm = {**span, "permType": "READWRITE"}
        auth_etcd.call("auth/role/grant", {"name": "host-b", "perm": perm})
