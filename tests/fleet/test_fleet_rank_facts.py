"""What a daemon sees wrong with its ranks, through a real etcd (adaptd/fleet/rank_facts.py):
the deciding daemon of a hung job names a culprit on another host (issue 34 item 2).
The agents are driven round by round (``poll_once``): no thread, no sleep."""

from __future__ import annotations

import pytest
from fleet_helpers import Etcd, settings

from adaptd.core.stall import RankFact
from adaptd.fleet import rank_facts
from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.keys import KeySpace
from adaptd.fleet.session import EtcdSession

STOPPED = "its process (pid 4242) is stopped (T)"


def agents(etcd: Etcd, prefix: str) -> tuple[FleetAgent, FleetAgent]:
    a = FleetAgent(settings(etcd.url, "host-a", prefix), poll_s=0.2)
    b = FleetAgent(settings(etcd.url, "host-b", prefix), poll_s=0.2)
    return a, b


def test_a_fact_told_on_one_host_is_read_on_another_while_watched(etcd, fleet_prefix) -> None:
    a, b = agents(etcd, fleet_prefix)
    try:
        assert a.poll_once().rank_facts == {}  # nothing watched: nothing read
        b.tell_rank("job/1", 1, STOPPED)  # a job name with a '/': its key part is encoded
        b.poll_once()
        assert etcd.keys(fleet_prefix + "ranks/") == [fleet_prefix + "ranks/host-b/job%2F1/1"]
        a.watch_ranks(frozenset({"job/1", "other"}))
        view = a.poll_once()
        assert view.rank_facts == {
            "job/1": (RankFact("job/1", 1, "host-b", STOPPED),),
            "other": (),
        }
        assert view.ranks_at is not None
        b.tell_rank("job/1", 1, None)  # continued: taken back
        b.poll_once()
        assert a.poll_once().rank_facts["job/1"] == ()
        a.watch_ranks(frozenset())
        assert a.poll_once().rank_facts == {}
    finally:
        a.stop()
        b.stop()


def test_the_facts_go_with_the_daemon_and_come_back_with_a_new_lease(etcd, fleet_prefix) -> None:
    """Leased: a daemon that stops takes its facts with it; a lease lost behind the
    daemon's back (etcd expired it) is replaced and the facts still true are put again."""
    a, b = agents(etcd, fleet_prefix)
    try:
        b.tell_rank("j", 1, STOPPED)
        b.tell_rank("j", 3, "its heartbeat stopped")
        b.tell_rank("j", 3, None)  # taken back before it was ever written
        b.poll_once()
        a.watch_ranks(frozenset({"j"}))
        assert a.poll_once().rank_facts["j"] == (RankFact("j", 1, "host-b", STOPPED),)
        etcd.call("lease/revoke", {"ID": b._session.lease_id})  # type: ignore[union-attr]
        assert a.poll_once().rank_facts["j"] == ()
        b._next_keepalive = 0.0  # renew at the next round: it finds the lease lost
        assert b.poll_once().rejoins == 1
        assert a.poll_once().rank_facts["j"] == (RankFact("j", 1, "host-b", STOPPED),)
        b.stop()
        assert a.poll_once().rank_facts["j"] == ()
    finally:
        a.stop()
        b.stop()


def test_a_damaged_fact_is_skipped_and_the_others_read(etcd, fleet_prefix) -> None:
    a, b = agents(etcd, fleet_prefix)
    keys = KeySpace(fleet_prefix)
    s = EtcdSession(settings(etcd.url, "host-c", fleet_prefix)).open()
    try:
        s.put(keys.rank("host-c", "j", 2), b"{not json", leased=True)
        s.put(keys.rank("host-c", "j", 5), b'{"version": 1}', leased=True)
        b.tell_rank("j", 1, STOPPED)
        b.poll_once()
        a.watch_ranks(frozenset({"j"}))
        assert a.poll_once().rank_facts["j"] == (RankFact("j", 1, "host-b", STOPPED),)
    finally:
        s.close()
        a.stop()
        b.stop()


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("/p/ranks/h/j/x", b'{"state": "s"}', "not a rank key"),
        ("/p/ranks/h/j/1", b"\xff", "not JSON"),
        ("/p/ranks/h/j/1", b'{"state": ""}', "no state"),
        ("/p/ranks/h/j/1", b"[1]", "no state"),
    ],
)
def test_decode_names_what_is_wrong(key: str, value: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        rank_facts.decode(KeySpace("/p/"), key, value)
