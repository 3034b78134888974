"""Hang detection in a real 2-worker MultiWorkerMirroredStrategy job
(tests/multiworker/jit_worker.py) with a real ``adaptd serve``: a rank that sleeps
inside its step (alive, beating) and a rank that is SIGSTOPped. The daemon finds the
job stalled within seconds (the hook's ``stall_floor=2``; the collective timeout stays
at its 120 s), the survivor's collective is aborted and it saves the last completed
step just in time, exactly (the job resumes there and ends as the uninterrupted run);
the hung rank, when it comes back, finds the job aborted and exits without writing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from faults.zygote import Zygote

from adaptd.checkpoints import rank_parts
from adaptd.client.save.peer_failure import ABORTED_MARKER
from multiworker import daemons
from multiworker.forked import cluster_of
from multiworker.jit_jobs import COMPARED, HERE, STEPS, run

pytestmark = [pytest.mark.slow, pytest.mark.tf]

#: The hook's floor and cap of the daemon's threshold in these jobs (seconds): the
#: model alone, with a save's slow steps seen in a 16-step job, would say about 10 s.
FLOOR, CAP = "2", "3"
#: A hang must be over well before this (the collective timeout is 120 s).
BOUND_S = 10.0


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hang")


@pytest.fixture(scope="module")
def sock(root: Path) -> Any:
    proc = daemons.serve(root, "a", "fixed:steps=5")
    try:
        yield root / "a" / "d.sock"
    finally:
        from adaptd.commands._spawn import stop_daemon

        stop_daemon(proc)


def listing(ckpt: Path, since: int) -> dict[str, int]:
    """The files of steps ``since`` and later, and the ``checkpoint`` state file, with
    their times (a write in flight when the rank stopped, of an older step, may end)."""
    out = {}
    for path in ckpt.iterdir():
        found = re.search(r"-(\d+)", path.name)
        if path.name == "checkpoint" or (found and int(found.group(1)) >= since):
            out[path.name] = path.stat().st_mtime_ns
    return out


_reference: list[Any] = []


def resumes_exactly(root: Path, ckpt: Path, step: int, zygote: Zygote) -> None:
    """The job started again from ``ckpt`` resumes from ``step`` and ends as the
    uninterrupted run (run once per module)."""
    if not _reference:
        _reference.append(run(root / "reference", 2, root / "reference" / "ckpt", zygote=zygote))
    ref = _reference[0]
    again = run(root / f"resumed-{ckpt.parent.name}", 2, ckpt, zygote=zygote)
    assert ref.codes == again.codes == [0, 0]
    for rank, (got, want) in enumerate(zip(again.results, ref.results, strict=True)):
        assert got is not None and want is not None and got["resumed_from"] == step, got
        for key in COMPARED:
            assert got[key] == want[key], f"rank {rank}: {key} differs from the uninterrupted run"


def test_a_rank_sleeping_in_its_step_frees_the_survivor_in_seconds(
    root: Path, sock: Path, zygote: Zygote
) -> None:
    """Rank 1 sleeps 15 s before step 13 (alive: its heartbeat goes on). The chief,
    blocked in step 13's all-reduce, is freed by the daemon's abort within seconds and
    saves step 12 just in time; rank 1 wakes, finds the job aborted and exits without
    writing; the job resumes from 12 exactly."""
    ckpt = root / "sleep" / "ckpt"
    ended = run(root / "sleep" / "job", 2, ckpt, zygote=zygote, timeout=90,
                SOCKET=f"ipc://{sock}", STALL_FLOOR=FLOOR, STALL_CAP=CAP, SLOW_RANK="1",
                SLOW_AT="13", SLOW_S="15")  # fmt: skip
    chief, hung = ended.results
    assert ended.codes == [3, 3], ended
    assert chief is not None and hung is not None
    assert ABORTED_MARKER in chief["message"], chief["message"]
    assert chief["jit"]["saved"] and chief["jit"]["step"] == 12, chief["jit"]
    freed_s = chief["ended_at"] - hung["hung_at"]
    assert freed_s < BOUND_S, f"the survivor ended {freed_s:.1f}s after the hang"
    assert hung["aborted"] is not None and "stalled" in hung["aborted"]["reason"]
    assert hung["jit"] is None or not hung["jit"]["saved"], hung["jit"]
    assert all(reason != "just-in-time" for _, reason, _ in hung["history"])
    assert rank_parts.status(rank_parts.listing(ckpt), 12).complete
    resumes_exactly(root, ckpt, 12, zygote)


def test_a_stopped_rank_is_named_and_saves_nothing_when_it_comes_back(
    root: Path, sock: Path, zygote: Zygote
) -> None:
    """Rank 1 SIGSTOPs itself once step 12 is done: the daemon sees it stopped (T) and
    its heartbeat silent, names it, and frees the chief before TensorFlow's own heartbeat
    (about 10 s) would. Continued afterwards, rank 1 exits non-zero and writes nothing."""
    work = root / "stop"
    ckpt, mark = work / "ckpt", work / "stopped.json"
    env = {"CKPT": str(ckpt), "STEPS": str(STEPS), "EVERY": "5", "SOCKET": f"ipc://{sock}",
           "STALL_FLOOR": FLOOR, "STALL_CAP": CAP, "STOP_RANK": "1", "STOP_AT": "12",
           "HANG_MARK": str(mark)}  # fmt: skip
    cluster = cluster_of(zygote, work / "job", 2, HERE / "jit_worker.py", env)
    with cluster:
        chief_proc, stopped = cluster.procs
        deadline = time.monotonic() + 90
        while chief_proc.poll() is None:
            assert time.monotonic() < deadline, cluster.tails()
            time.sleep(0.05)
        before = listing(ckpt, 11)
        os.kill(stopped.pid, signal.SIGCONT)
        while stopped.poll() is None:
            assert time.monotonic() < deadline, cluster.tails()
            time.sleep(0.05)
        assert [chief_proc.poll(), stopped.poll()] == [3, 3], cluster.tails()
        chief, late = cluster.result(0), cluster.result(1)
    stop = json.loads(mark.read_text())
    assert chief["jit"]["saved"] and chief["jit"]["step"] == 12, chief
    assert ABORTED_MARKER in chief["message"], chief["message"]
    freed_s = chief["ended_at"] - stop["at"]
    assert freed_s < BOUND_S, f"the survivor ended {freed_s:.1f}s after the stop"
    assert "stopped (T)" in chief["aborted"]["reason"] and chief["aborted"]["culprit"] == 1
    assert late["jit"] is None or not late["jit"]["saved"], late
    assert listing(ckpt, 11) == before, "the rank that came back wrote to the checkpoints"
    resumes_exactly(root, ckpt, 12, zygote)
