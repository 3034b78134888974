"""The fleet's scale path, at N = 50 members on the session's real etcd (issue 35).

What benchmarks/scale_fleet.py measures up to 2,000 members, asserted here on what
cannot be timing noise: etcd's own request counters (its ``/metrics``). Before issue
35 an idle member polled every member and every claim twice a second (4.2 requests a
second each), and in a storm every waiter re-read the whole queue at each release
(about 150 range reads per grant at N = 50): both grow with the fleet, and either
coming back fails these tests. A grant compared the whole claims range until issue 35's
second pass: in a storm spread over 10 targets that retried 1.5-2.1 times per grant,
against 0.2-0.5 with the per-target compare (measured in the test's own two storms).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from fleet_helpers import Etcd, settings

from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.session import EtcdSession

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from scale_fleet import etcd_figures

N = 50
T = "shared-nfs"


def _agents(etcd: Etcd, prefix: str, on_grant=None) -> list[FleetAgent]:
    return [
        FleetAgent(
            settings(etcd.url, f"h{i:03d}", prefix, lease_ttl_s=10),  # the daemon's TTL
            on_grant=(lambda i=i: on_grant(i)) if on_grant else None,
        ).start()
        for i in range(N)
    ]


def _up(agents: list[FleetAgent]) -> None:
    for a in agents:
        a.wait_for(lambda v: v.up and v.records_at is not None, 30)


def test_an_idle_fleet_costs_etcd_under_one_request_per_host_and_second(etcd: Etcd, fleet_prefix):
    agents = _agents(etcd, fleet_prefix)
    try:
        _up(agents)
        before, t0 = etcd_figures([etcd.url]), time.monotonic()
        threading.Event().wait(4.5)  # the window measured over: two idle rounds and more
        d = etcd_figures([etcd.url]).minus(before)
        per_host_s = d.requests / (time.monotonic() - t0) / N
        assert all(a.view().usable(time.monotonic(), 3.0) for a in agents)
    finally:
        for a in agents:
            a.stop()
    # main before issue 35: 4.2 (a range of the members and one of the claims every 0.5 s)
    assert per_host_s <= 1.0, f"{per_host_s:.2f} etcd requests/s per idle member"


def test_a_storm_wakes_the_waiters_next_in_line_not_the_whole_queue(etcd: Etcd, fleet_prefix):
    """50 members want one target (cap 2) at once and release 0.1 s after their grant:
    every save is granted, never more than 2 at once, and the reads per grant stay a
    handful (8-11 measured; main: about 150, every waiter re-reading every claim at each
    release)."""
    cap, save_s = 2, 0.1
    lock = threading.Lock()
    holding: set[int] = set()
    granted: set[int] = set()
    most = 0
    all_done = threading.Event()
    timers: list[threading.Timer] = []

    def release(i: int) -> None:
        with lock:
            holding.discard(i)
        agents[i].release("save")

    def on_grant(i: int) -> None:
        nonlocal most
        if "save" not in agents[i].view().granted:
            return
        with lock:
            if i in granted:
                return
            granted.add(i)
            holding.add(i)
            most = max(most, len(holding))
            if len(granted) == N:
                all_done.set()
        t = threading.Timer(save_s, release, args=(i,))
        t.start()
        timers.append(t)

    agents = _agents(etcd, fleet_prefix, on_grant)
    try:
        _up(agents)
        before = etcd_figures([etcd.url])
        for i, a in enumerate(agents):
            a.want("save", T, cap=cap, at_risk_gpu_s=float((i * 37) % N), gpus=1)
        assert all_done.wait(60), f"only {len(granted)} of {N} saves granted"
        for t in timers:
            t.join(5)
        for a in agents:
            a.wait_for(lambda v: not v.granted and not v.waiting, 10)
        d = etcd_figures([etcd.url]).minus(before)
    finally:
        for a in agents:
            a.stop()
    assert most <= cap
    reads = d.by_method.get("Range", 0.0) + d.by_method.get("Txn", 0.0)
    assert reads / N <= 15, f"{reads / N:.1f} range reads and transactions per grant"
    # what etcd sent per grant: 25-30 KB here; 124 KB with every waiter woken by every
    # release (releases_needed() always 1), more on main
    assert d.sent_bytes / N <= 60_000, f"{d.sent_bytes / N:.0f} bytes from etcd per grant"


def _spread_storm(etcd: Etcd, prefix: str, targets: int, old_member: bool) -> tuple[float, int]:
    """N members over ``targets`` targets (member i on target i mod targets, cap 1 each)
    want a slot at once and release 0.1 s after their grant: transaction conflicts per
    grant, and the most holders one target had at once. ``old_member``: a member from
    before per-target grants is up, so every daemon compares the whole claims range."""
    lock = threading.Lock()
    holding: dict[str, set[int]] = {}
    granted: set[int] = set()
    most = 0
    all_done = threading.Event()
    timers: list[threading.Timer] = []

    def release(i: int) -> None:
        with lock:
            holding[f"t{i % targets}"].discard(i)
        agents[i].release("save")

    def on_grant(i: int) -> None:
        nonlocal most
        if "save" not in agents[i].view().granted:
            return
        with lock:
            if i in granted:
                return
            granted.add(i)
            held = holding.setdefault(f"t{i % targets}", set())
            held.add(i)
            most = max(most, len(held))
            if len(granted) == N:
                all_done.set()
        t = threading.Timer(0.1, release, args=(i,))
        t.start()
        timers.append(t)

    old = None
    if old_member:
        old = EtcdSession(settings(etcd.url, "old", prefix)).open()
        old.put(old.keys.member("old"), b'{"host": "old", "pid": 1, "started": 0, '
                b'"version": "0"}', leased=True)  # fmt: skip
    agents = _agents(etcd, prefix, on_grant)
    try:
        _up(agents)
        for i, a in enumerate(agents):
            a.want("save", f"t{i % targets}", cap=1, at_risk_gpu_s=float((i * 37) % N), gpus=1)
        assert all_done.wait(60), f"only {len(granted)} of {N} saves granted"
        for t in timers:
            t.join(5)
        conflicts = sum(a.view().conflicts for a in agents)
    finally:
        for a in agents:
            a.stop()
        if old is not None:
            old.close()
    return conflicts / N, most


def test_a_grant_on_one_target_is_not_retried_for_claims_on_others(etcd: Etcd, fleet_prefix):
    """50 members over 10 targets (cap 1 each) at once: a grant compares its own target's
    grant key, so claims and grants on the other 9 targets do not make it retry. With a
    member from before that rule up (every grant compares the whole claims range, as all
    did before issue 35's second pass) the same storm retries several times as often."""
    per_target, most = _spread_storm(etcd, fleet_prefix, 10, old_member=False)
    assert most <= 1
    whole, most = _spread_storm(etcd, fleet_prefix + "old/", 10, old_member=True)
    assert most <= 1
    assert per_target <= 0.5 * whole, f"{per_target:.2f} vs {whole:.2f} conflicts per grant"
