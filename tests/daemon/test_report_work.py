"""The daemon's work per step report, counted (not timed), against how many jobs and
ranks it serves: a guard for benchmarks/scale_host.py's figures (docs/scale.md, "One
host"). A job's policy runs once per round of its ranks' step reports, on one
snapshot, and writes no history row unless the plan changed; neither may grow with the
number of jobs on the host.

A real daemon in a thread (:func:`daemon_helpers.thread_daemon`), raw DEALER peers
speaking the real protocol; what is counted: the snapshot source's calls (one per
policy run) and the daemon's events (each history row is one)."""

from __future__ import annotations

import threading
from pathlib import Path

import zmq
from daemon_helpers import DEADLINE, thread_daemon

from adaptd import events as ev
from adaptd.core.snapshot import Snapshot
from adaptd.protocol import job as p

WORLD = 8
REPORTS = 3


class Counted:
    """The snapshot source, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> Snapshot:
        with self._lock:
            self.calls += 1
        return Snapshot(time=0.0)


def synced(socks: list[zmq.Socket], job_of: list[str]) -> list[p.DaemonMessage]:
    """Ask each peer's job config and wait for the answers: the pipe is ordered, so
    everything each peer sent before was handled by then. What came before them."""
    for s, job in zip(socks, job_of, strict=True):
        s.send(p.encode(p.AskConfig(v=p.VERSION, job=job)))
    before = []
    for s in socks:
        while True:
            assert s.poll(int(DEADLINE * 1000)), "the daemon did not answer in time"
            msg = p.decode_daemon(s.recv())
            if isinstance(msg, p.JobConfig):
                break
            before.append(msg)
    return before


def work_per_report(short_dir: Path, jobs: int) -> dict[str, float]:
    snapshots = Counted()
    ctx = zmq.Context()
    with thread_daemon(
        short_dir / f"adaptd-{jobs}.sock",
        default_policy="fixed:steps=1000",
        snapshot_source=snapshots,
    ) as (_, sink):
        endpoint = f"ipc://{short_dir / f'adaptd-{jobs}.sock'}"
        socks, job_of = [], []
        for j in range(jobs):
            for r in range(WORLD):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(endpoint)
                s.send(p.encode(p.Hello(v=p.VERSION, job=f"j{j}", rank=r, world_size=WORLD,
                                        agreement="coordination")))  # fmt: skip
                socks.append(s)
                job_of.append(f"j{j}")
        synced(socks, job_of)
        calls0, events0 = snapshots.calls, len(sink.events)
        for i in range(1, REPORTS + 1):
            for s, job in zip(socks, job_of, strict=True):
                rank = socks.index(s) % WORLD
                s.send(p.encode(p.Steps(v=p.VERSION, job=job, rank=rank, step=10 * i, count=10,
                                        mean_s=0.1)))  # fmt: skip
        synced(socks, job_of)
        reports = REPORTS * len(socks)
        out = {
            "policy_runs": (snapshots.calls - calls0) / reports,
            "events": (len(sink.events) - events0) / reports,
        }
        for s in socks:
            s.close()
    ctx.term()
    return out


def test_a_job_is_decided_once_per_round_of_its_ranks_reports_with_2_jobs_and_with_16(
    short_dir: Path,
) -> None:
    """A job's plan is decided from job-wide figures: once every live rank reported, not
    at each rank's report (issue 35: 8 policy runs per job per second at 8 ranks, a
    third of a host's CPU at 64 jobs). A tick of the loop between a job's reports may
    decide it once more; nothing grows with the number of jobs."""
    few, many = work_per_report(short_dir, 2), work_per_report(short_dir, 16)
    for got in (few, many):
        # per report: 1/8 (the round's last report), 2/8 with a tick inside a round;
        # 1.0 when every report ran the policy. No history row (the plan, every 1000
        # steps, does not change with the step time). What the daemon sends is not
        # counted: its keep-alives come by the clock, not by the report.
        assert got["policy_runs"] * WORLD <= 2.0 and got["events"] == 0.0, (few, many)


def test_a_rank_that_does_not_report_holds_its_job_decision_back_a_tick_at_most(
    short_dir: Path,
) -> None:
    """Only rank 0 of 8 reports (the job's first step time): the loop's tick decides the
    job anyway, within a second, and the plan in seconds becomes one in steps."""
    ctx = zmq.Context()
    sock_path = short_dir / "adaptd-lag.sock"
    with thread_daemon(sock_path, default_policy="fixed:seconds=60") as (_, sink):
        socks = []
        for r in range(WORLD):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"ipc://{sock_path}")
            s.send(p.encode(p.Hello(v=p.VERSION, job="j", rank=r, world_size=WORLD,
                                    agreement="coordination")))  # fmt: skip
            socks.append(s)
        synced(socks, ["j"] * WORLD)
        socks[0].send(p.encode(p.Steps(v=p.VERSION, job="j", rank=0, step=50, count=10,
                                       mean_s=0.1)))  # fmt: skip
        sink.wait_for(ev.PlanChanged, lambda e: e.step == 50 and e.decision.every_steps == 600)
        for s in socks:
            s.close()
    ctx.term()
