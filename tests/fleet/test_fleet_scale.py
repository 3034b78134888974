"""The fleet's scale path, at N = 50 members on the session's real etcd (issue 35).

What benchmarks/scale_fleet.py measures up to 2,000 members, asserted here on what
cannot be timing noise: etcd's own request counters (its ``/metrics``). Before issue
35 an idle member polled every member and every claim twice a second (4.2 requests a
second each), and in a storm every waiter re-read the whole queue at each release
(about 150 range reads per grant at N = 50): both grow with the fleet, and either
coming back fails these tests.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from fleet_helpers import Etcd, settings

from adaptd.fleet.agent import FleetAgent

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
