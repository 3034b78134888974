"""The culprit of a hang on another host (issue 34 item 2): each daemon's stall watch tells
its peers what is wrong with its own ranks, and the deciding daemon, once a job with ranks
elsewhere has been silent for part of its threshold, reads those facts and names the
remote rank in the abort. Two real registries and watches (two "hosts") share an
in-memory channel here; tests/fleet/test_fleet_rank_facts.py carries the same facts
through a real etcd, and tests/multiworker/test_hang.py's two-host job end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from adaptd import events as ev
from adaptd.core.stall import RankFact
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.stall_watch import PEERS_AT, StallWatch
from adaptd.protocol import job as p
from adaptd.telemetry.host import process_info


class Channel:
    """What etcd holds: host -> {(job, rank): state}."""

    def __init__(self) -> None:
        self.facts: dict[str, dict[tuple[str, int], str]] = {}


class Peers:
    """One host's end of :class:`Channel` (what :class:`adaptd.fleet.part.RankPeers` is
    over etcd): facts of a watched job are read at once."""

    channel = "a test channel"

    def __init__(self, host: str, shared: Channel) -> None:
        self.host, self.shared = host, shared
        self.watched: list[frozenset[str]] = []
        self.told: list[tuple[str, int, str | None]] = []

    def tell(self, job: str, rank: int, state: str | None) -> None:
        self.told.append((job, rank, state))
        mine = self.shared.facts.setdefault(self.host, {})
        if state is None:
            mine.pop((job, rank), None)
        else:
            mine[job, rank] = state

    def watch(self, jobs: frozenset[str]) -> None:
        self.watched.append(jobs)

    def facts(self, job: str) -> Sequence[RankFact] | None:
        if not self.watched or job not in self.watched[-1]:
            return None
        return [
            RankFact(job, rank, host, state)
            for host, facts in self.shared.facts.items()
            for (j, rank), state in facts.items()
            if j == job and host != self.host
        ]


class Host:
    """One daemon's registry and watch, with ``ranks`` of job "j" (2 ranks) connected."""

    def __init__(self, name: str, shared: Channel, ranks: tuple[int, ...], pid: int = 0):
        self.events: list[ev.Event] = []
        self.reg = Registry(emit=self.events.append)
        self.peers = Peers(name, shared)
        self.watch = StallWatch(self.reg.table, send=lambda who, m: True,
                                emit=self.events.append, peers=self.peers)  # fmt: skip
        self.ranks = []
        self.suspect_from: float | None = None  # when the watch first had "j" read
        for r in ranks:
            hello = p.Hello(v=p.VERSION, job="j", rank=r, world_size=2, pid=pid, gpus=8,
                            agreement="coordination")  # fmt: skip
            self.job, rank, _ = self.reg.hello(bytes([r]), hello, 0.0)
            if pid:
                rank.start_time = process_info(pid).start_time  # type: ignore[union-attr]
            self.ranks.append(rank)

    def steps(self, step: int, now: float) -> None:
        for r in self.ranks:
            msg = p.Steps(v=p.VERSION, job="j", rank=r.rank, step=step, count=10,
                          mean_s=0.05, max_s=0.06, warmup=step <= 10)  # fmt: skip
            self.reg.steps(self.job, r, msg, now)
            self.watch.steps(self.job, msg, now)

    def beat(self, step: int, now: float) -> None:
        for r in self.ranks:
            msg = p.Beat(v=p.VERSION, job="j", rank=r.rank, step=step)
            self.watch.beat(self.job, r, bytes([10 + r.rank]), msg, now)

    def stalls(self) -> list[ev.JobStalled]:
        return [e for e in self.events if isinstance(e, ev.JobStalled)]


def steady(hosts: list[Host], steps: int = 400) -> float:
    """``steps`` steps of 50 ms on every host, reported every 10; the time at the end."""
    t = 0.0
    for step in range(10, steps + 1, 10):
        t += 0.5
        for h in hosts:
            h.steps(step, t)
            h.beat(step, t)
            h.watch.tick(t)
    return t


def silence(a: Host, b: Host, end: float, *, b_beats: bool = True) -> float:
    """No step from then on, every host's ranks beating (``b``'s only with ``b_beats``)
    and every watch ticking once a second, until ``a`` fires; the time it did."""
    t = end
    while not a.stalls():
        t += 1.0
        a.beat(400, t)
        if b_beats:
            b.beat(400, t)
        b.watch.tick(t)
        a.watch.tick(t)
        if a.suspect_from is None and a.peers.watched and "j" in a.peers.watched[-1]:
            a.suspect_from = t
        assert t - end < 60, "no stall found"
    return t


def stopped_child() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while (info := process_info(child.pid)) is None or info.status != "stopped":
        assert time.monotonic() < deadline, info
        time.sleep(0.01)
    return child


def test_a_stopped_rank_on_another_host_is_named_by_its_own_daemon() -> None:
    """Rank 1's process on host-b is stopped (T): host-b's watch tells the channel, and
    host-a's, deciding, names ``rank 1 on host-b`` in the abort. Continued, the fact is
    taken back."""
    child = stopped_child()
    try:
        shared = Channel()
        a = Host("host-a", shared, (0,))
        b = Host("host-b", shared, (1,), pid=child.pid)
        assert a.job.decides and not b.job.decides
        end = steady([a, b])
        assert shared.facts["host-b"] == {("j", 1): f"its process (pid {child.pid}) is stopped (T)"}
        silence(a, b, end, b_beats=False)
        (stalled,) = a.stalls()
        assert stalled.culprit == 1, stalled
        assert (
            f"rank 1 on host-b: its process (pid {child.pid}) is stopped (T) (seen by its "
            "daemon, through a test channel)"
        ) in stalled.reason, stalled.reason
        assert b.stalls() == []  # host-b does not decide the job
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while shared.facts["host-b"]:
            assert time.monotonic() < deadline, shared.facts
            b.beat(400, end + 100)
            b.watch.tick(end + 100)
        assert b.peers.told[-1] == ("j", 1, None)
    finally:
        child.kill()
        child.wait(10)


def test_a_remote_rank_whose_heartbeat_stopped_is_named() -> None:
    shared = Channel()
    a, b = Host("host-a", shared, (0,)), Host("host-b", shared, (1,))
    end = steady([a, b])
    silence(a, b, end, b_beats=False)  # rank 1's beats stop with the steps
    (stalled,) = a.stalls()
    assert stalled.culprit == 1, stalled.reason
    assert "rank 1 on host-b: its heartbeat stopped" in stalled.reason, stalled.reason
    # told once, when its last beat was BEAT_LOST_S old, not at every tick
    assert b.peers.told == [("j", 1, "its heartbeat stopped")]


def test_the_facts_are_read_only_while_a_job_is_suspect() -> None:
    """A healthy job is never read; a silent one from PEERS_AT of its threshold on, and no
    more once it was aborted. With nothing wrong on the other host, the reason says so."""
    shared = Channel()
    a, b = Host("host-a", shared, (0,)), Host("host-b", shared, (1,))
    end = steady([a, b])
    assert a.peers.watched == []
    t = silence(a, b, end)
    (stalled,) = a.stalls()
    threshold = stalled.threshold_s
    assert a.peers.watched[0] == frozenset({"j"})
    # from the first tick at which the silence reached PEERS_AT of the threshold
    assert a.suspect_from is not None
    assert 0 <= a.suspect_from - (end + PEERS_AT * threshold) < 1.0, (a.suspect_from, threshold)
    assert stalled.culprit is None
    assert (
        "the daemons of rank 1 on other hosts see nothing wrong (a test channel)"
    ) in stalled.reason, stalled.reason
    a.watch.tick(t + 1)
    assert a.peers.watched[-1] == frozenset()  # aborted: read no more
    assert b.peers.told == []  # rank 1 beat on: nothing wrong with it


def test_a_remote_fact_does_not_name_a_rank_of_this_host_or_outside_the_job() -> None:
    """A fact of a rank this host sees itself (its own daemon judges it) or past the
    job's world size is not taken."""
    shared = Channel()
    shared.facts["host-c"] = {("j", 0): "its heartbeat stopped", ("j", 7): "its process is gone"}
    a, b = Host("host-a", shared, (0,)), Host("host-b", shared, (1,))
    end = steady([a, b])
    silence(a, b, end)
    (stalled,) = a.stalls()
    assert stalled.culprit is None, stalled.reason
