"""etcd killed, stopped or restarted under running members: they fall back within 5 s,
rejoin by themselves, and leak no slot."""

from __future__ import annotations

import time

import pytest
from fleet_helpers import Etcd, MemberProc, holders, settings

from adaptd.fleet.agent import FleetAgent

T = "nfs://10.0.4.20/export/ckpt"
FALLBACK_S = 5.0
PREFIX = "/adaptd/"


def agent(etcd: Etcd, host: str, ttl: int = 3) -> FleetAgent:
    return FleetAgent(settings(etcd.url, host, PREFIX, lease_ttl_s=ttl), poll_s=0.2).start()


@pytest.mark.slow
def test_etcd_killed_and_restarted_mid_run(own_etcd: Etcd):
    """A holds the slot, B waits. etcd dies: both fall back within 5 s. A's save ends
    while etcd is away (its release cannot reach etcd). etcd comes back: both rejoin by
    themselves, A's stale claim is gone (no slot leaked), and B gets the slot."""
    a = agent(own_etcd, "host-a")
    b = MemberProc(own_etcd.url, PREFIX, "host-b")
    try:
        a.want("ja", T, cap=1, at_risk_gpu_s=500, gpus=8)
        a.wait_for(lambda v: "ja" in v.granted, 10)
        b.send(f"want jb {T} 1 100 8")
        b.wait(lambda v: "jb" in v["waiting"], 10)

        own_etcd.kill()
        killed = time.monotonic()
        a.wait_for(lambda v: not v.up, FALLBACK_S)
        b.wait(lambda v: not v["up"], FALLBACK_S + killed - time.monotonic() + 1)
        assert time.monotonic() - killed <= FALLBACK_S
        down = a.view()
        assert down.granted == frozenset() and "did not answer" in down.reason
        a.release("ja")  # the save became durable while etcd was away

        own_etcd.start()
        a.wait_for(lambda v: v.up, 15)
        b.wait(lambda v: "jb" in v["granted"], 15)
        assert holders(own_etcd, PREFIX) == [("host-b", T, "jb")]
        assert sorted(a.view().hosts) == ["host-a", "host-b"]
    finally:
        b.close()
        a.stop()


@pytest.mark.slow
def test_a_stopped_etcd_is_a_partition_the_member_rides_out(own_etcd: Etcd):
    """etcd stopped (SIGSTOP: connections are accepted and hang, as in a partition or an
    overloaded etcd): the member decides locally within 5 s, says why, and once etcd
    answers again it renews the lease it had (etcd does not expire leases while it
    is stopped) and holds its slot again, without a new session."""
    a = agent(own_etcd, "host-a")
    try:
        a.want("ja", T, cap=1, at_risk_gpu_s=500, gpus=8)
        a.wait_for(lambda v: "ja" in v.granted, 10)
        own_etcd.pause()
        t0 = time.monotonic()
        down = a.wait_for(lambda v: not v.up, FALLBACK_S)
        assert time.monotonic() - t0 <= FALLBACK_S
        assert "did not answer" in down.reason and not down.granted
        assert not down.usable(time.monotonic(), stale_after_s=3.0)
        own_etcd.resume()
        back = a.wait_for(lambda v: v.up and "ja" in v.granted, 15)
        assert back.rejoins == 0 and back.errors >= 1
    finally:
        own_etcd.resume()
        a.stop()


@pytest.mark.slow
def test_a_lost_lease_is_replaced_without_a_restart(own_etcd: Etcd):
    """The member's lease is revoked behind its back (as when etcd expired it during a
    partition, or while the daemon was stopped): its next keepalive sees the loss, and
    in the same round it re-registers under a new lease and takes the slot again for
    the job that still wants it. etcd answered, so the view never turns down (a down
    view would let the daemon decide locally meanwhile)."""
    a = FleetAgent(settings(own_etcd.url, "host-a", PREFIX, lease_ttl_s=3), poll_s=0.2)
    a.want("ja", T, cap=1, at_risk_gpu_s=500, gpus=8)
    first = a.poll_once()
    assert first.up and "ja" in first.granted
    lease = a._session.lease_id  # the test's one look inside: whose lease to revoke
    own_etcd.call("lease/revoke", {"ID": lease})
    assert holders(own_etcd, PREFIX) == []
    a._next_keepalive = 0.0  # renew at the next round instead of within TTL/3
    back = a.poll_once()
    assert back.up and "ja" in back.granted and back.rejoins == 1
    assert holders(own_etcd, PREFIX) == [("host-a", T, "ja")]
    a.stop()
