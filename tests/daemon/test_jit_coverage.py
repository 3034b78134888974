"""The daemon learns which failures a just-in-time save covered, with a real
``adaptd serve`` and a real process killed: rank 1 of a 2-rank job is SIGKILLed, rank 0
reports a save with reason ``just-in-time`` and leaves, the job comes back resuming
from that step; ``adaptd status`` (its JSON and its text) shows the split."""

from __future__ import annotations

import os

from daemon_helpers import FakeJob, Peer

from adaptd.commands import status as status_command
from adaptd.protocol import job as p

V = p.VERSION


def test_a_job_back_from_a_just_in_time_save_counts_a_covered_failure(daemon_proc, zctx) -> None:
    victim = FakeJob(daemon_proc.endpoint, "jit-1", rank=1, world_size=2)
    survivor = Peer(zctx, daemon_proc.endpoint)
    try:
        victim.wait_ready()
        survivor.hello("jit-1", rank=0, world_size=2, pid=os.getpid())
        survivor.steps("jit-1", 12)
        victim.kill()
        jit = p.SaveReport(v=V, job="jit-1", rank=0, step=12, blocking_s=0.04, durable_s=0.04,
                           bytes=100, ok=True, reason=p.JIT_REASON)  # fmt: skip
        survivor.send(jit)
        survivor.send(p.Goodbye(v=V, job="jit-1", rank=0, step=12, reason="peer failure"))
        daemon_proc.log.wait_for("event=job_lost", "job=jit-1")
    finally:
        victim.close()
        survivor.close()
    assert daemon_proc.job("jit-1").failures_covered == 0  # not known before it comes back
    again = [Peer(zctx, daemon_proc.endpoint) for _ in range(2)]
    try:
        for rank, peer in enumerate(again):
            peer.hello("jit-1", rank=rank, world_size=2, pid=os.getpid(), resumed_from=12)
        again[0].steps("jit-1", 13)
        daemon_proc.log.wait_for("event=job_resumed", "job=jit-1")
        info = daemon_proc.job("jit-1")
        assert info.failures == 1 and info.failures_covered == 1
        assert info.jit_coverage is not None and abs(info.jit_coverage - 0.5) < 1e-9
        assert info.saves == 0  # the just-in-time save is no periodic save
        text = status_command.render(daemon_proc.status())
        assert "failures: 1 covered just in time, 0 not, planned with 50%" in text
    finally:
        for peer in again:
            peer.close()
