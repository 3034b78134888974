"""Two JAX processes under ``jax.distributed`` (CPU collectives over gloo, a loopback
coordinator) saving one sharded state with Orbax under adaptd's SavePolicy.

Orbax's save is collective: if one process said yes alone, it would wait in the save's
barrier for ever. The processes are given different policies on purpose (process 0
``fixed:steps=10``, process 1 ``fixed:steps=7``): they must save at process 0's steps
only, and the job must keep running. Killed with SIGKILL, the job resumes from the
newest finalized step with exactly the state each process had there.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from jax_orbax.jobs import MISSING, OrbaxJob, finalized, free_port

pytest.importorskip("orbax.checkpoint", reason=MISSING)

pytestmark = [pytest.mark.slow, pytest.mark.jax]


def start(tmp: Path, name: str, steps: int, *extra: object) -> list[OrbaxJob]:
    port = free_port()
    common = ("--dir", tmp / "ckpt", "--job", "j2", "--steps", steps,
              "--socket", tmp / "none.sock", "--policy", "fixed:steps=10",
              "--policy-1", "fixed:steps=7", "--processes", 2, "--port", port)  # fmt: skip
    return [OrbaxJob(tmp / f"{name}-{i}.log", *common, "--process-id", i, *extra) for i in (0, 1)]


def test_two_processes_save_at_the_primarys_steps_and_resume_exactly(short_dir: Path) -> None:
    first = start(short_dir, "a", 100000, "--step-sleep", 0.002)
    try:
        for job in first:
            job.wait_for(lambda e: e["event"] == "step" and e["step"] >= 45, 120)
        for job in first:
            job.proc.send_signal(signal.SIGKILL)
        for job in first:
            job.proc.wait(30)
    finally:
        for job in first:
            job.close()
    ran = [job.step_digests() for job in first]
    steps = finalized(short_dir / "ckpt")
    assert steps and all(s % 10 == 0 for s in steps), steps  # process 0's plan, agreed
    newest = steps[-1]
    until = min(max(r) for r in ran)
    assert ran[0][newest] != ran[1][newest]  # each process holds its own shard

    second = start(short_dir, "b", until + 3)
    try:
        ends = [job.finish() for job in second]
    finally:
        for job in second:
            job.close()
    for i, job in enumerate(second):
        begun = next(e for e in job.events if e["event"] == "start")
        assert begun["step"] == newest
        assert begun["digest"] == ran[i][newest]
        again = job.step_digests()
        assert all(again[s] == ran[i][s] for s in range(newest + 1, until + 1))
    assert "adaptd: rank 0/2 resumed from step" in second[0].stderr()
    # the resumed run's saves: the same steps on both processes, process 0's plan
    saved = [[r["step"] for r in end["reports"]] for end in ends]
    assert saved[0] == saved[1] and all(s % 10 == 0 for s in saved[0])
