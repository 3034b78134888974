"""The etcd session against a real etcd: leases, compare-and-swap, bounded calls."""

from __future__ import annotations

import time

import pytest
from fleet_helpers import Etcd, settings

from adaptd.fleet.session import (
    EtcdSession,
    FleetError,
    FleetSettings,
    FleetUnavailable,
    LeaseLost,
    newest_revision,
)


def test_leased_key_lives_with_the_session_and_goes_with_its_revoke(etcd: Etcd, fleet_prefix):
    s = EtcdSession(settings(etcd.url, "h1", fleet_prefix)).open()
    s.put(fleet_prefix + "x", b"1", leased=True)
    s.put(fleet_prefix + "kept", b"2", leased=False)
    assert s.keepalive() > 0
    assert [e.value for e in s.get_prefix(fleet_prefix)] == [b"2", b"1"]
    s.close()
    assert etcd.keys(fleet_prefix) == [fleet_prefix + "kept"]


def test_a_lease_not_renewed_expires_with_its_keys(etcd: Etcd, fleet_prefix):
    s = EtcdSession(settings(etcd.url, "h1", fleet_prefix, lease_ttl_s=2)).open()
    s.put(fleet_prefix + "x", b"1", leased=True)
    deadline = time.monotonic() + 10
    while etcd.keys(fleet_prefix) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling etcd for the expiry it promises (no event to wait on)
    assert etcd.keys(fleet_prefix) == []
    with pytest.raises(LeaseLost):
        s.keepalive()
    s.close()


def test_put_if_unchanged_loses_to_a_write_after_the_read(etcd: Etcd, fleet_prefix):
    a = EtcdSession(settings(etcd.url, "a", fleet_prefix)).open()
    b = EtcdSession(settings(etcd.url, "b", fleet_prefix)).open()
    watched = fleet_prefix + "claims/"
    seen = newest_revision(a.get_prefix(watched))  # empty: 0
    assert seen == 0
    assert b.put_if_unchanged(watched + "b", b"b", leased=True, watched=watched, seen_revision=0)
    # a decided from the empty range: its write must fail now
    assert not a.put_if_unchanged(
        watched + "a", b"a", leased=True, watched=watched, seen_revision=seen
    )
    seen = newest_revision(a.get_prefix(watched))
    assert a.put_if_unchanged(watched + "a", b"a", leased=True, watched=watched, seen_revision=seen)
    # a deletion does not count as a change
    seen = newest_revision(a.get_prefix(watched))
    b.delete(watched + "b")
    assert a.put_if_unchanged(
        watched + "a2", b"a", leased=True, watched=watched, seen_revision=seen
    )
    a.close()
    b.close()


def test_a_stopped_etcd_is_unavailable_within_the_call_deadline(own_etcd: Etcd):
    s = EtcdSession(settings(own_etcd.url, "h1")).open()
    own_etcd.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(FleetUnavailable):
            s.get_prefix("/adaptd/")
        assert time.monotonic() - t0 < s.settings.call_deadline_s + 1.0
    finally:
        own_etcd.resume()
    s.keepalive()  # answered again, the lease survived
    s.close()


def test_an_unreachable_etcd_is_unavailable_at_once(own_etcd: Etcd):
    url = own_etcd.url
    own_etcd.kill()
    t0 = time.monotonic()
    with pytest.raises(FleetUnavailable, match="did not answer"):
        EtcdSession(settings(url, "h1")).open()
    assert time.monotonic() - t0 < 2.0


def test_the_second_endpoint_answers_when_the_first_is_dead(etcd: Etcd, fleet_prefix):
    dead = "http://127.0.0.1:9"  # discard port: connection refused
    cfg = settings(etcd.url, "h1", fleet_prefix)
    s = EtcdSession(
        FleetSettings(
            endpoints=(dead, etcd.url),
            host="h1",
            prefix=fleet_prefix,
            lease_ttl_s=3,
            call_timeout_s=cfg.call_timeout_s,
            call_deadline_s=cfg.call_deadline_s,
        )
    ).open()
    s.put(fleet_prefix + "k", b"v", leased=True)
    assert [e.value for e in s.get_prefix(fleet_prefix)] == [b"v"]
    s.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"endpoints": ()}, "at least one etcd endpoint"),
        ({"endpoints": ("127.0.0.1:2379",)}, "http://HOST:PORT"),
        ({"prefix": "adaptd"}, "start and end with '/'"),
        ({"host": "a/b"}, "without '/'"),
        ({"user": "u"}, "user and password go together"),
        ({"cert_file": "c.pem"}, "cert_file and key_file"),
        ({"lease_ttl_s": 1}, "lease_ttl_s"),
        ({"call_timeout_s": 5.0, "call_deadline_s": 1.0}, "call_timeout_s"),
    ],
)
def test_settings_say_what_is_wrong(change, message):
    base = {"endpoints": ("http://127.0.0.1:2379",), "host": "h1"}
    with pytest.raises(ValueError, match=message):
        FleetSettings(**{**base, **change})


def test_errors_are_fleet_errors():
    assert issubclass(FleetUnavailable, FleetError) and issubclass(LeaseLost, FleetError)
