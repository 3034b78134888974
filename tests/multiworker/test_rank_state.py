"""Exact resume of a real multi-worker job whose ranks each read their own data
(tests/multiworker/rank_worker.py): a rank is SIGKILLed (the chief or not, at a random
step or while its write is in flight), the job is started again, and every rank ends
with the weights, optimizer slots, step and next batches of the *uninterrupted* run,
for each input style (a plain per-worker iterator with a per-rank generator, and
both ``tf.distribute`` input styles), with 2 and 3 workers.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from multiworker.cluster import HERE, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.tf]

STYLES = ("plain", "distribute", "function")
STEPS, EVERY, KEEP = 50, 10, 3
#: The digests a resumed run must share with the uninterrupted one.
COMPARED = ("weights", "optimizer", "step", "next_batches")
PICK = random.Random(21)  # the "random" steps, the same in every run of the suite
#: Steps that are not save steps (a kill there never interrupts a write).
BETWEEN = [s for s in range(EVERY + 1, STEPS) if s % EVERY]


def run(workdir: Path, n: int, ckpt: Path, **env: str) -> list[dict[str, Any]] | None:
    """The job on ``n`` workers to its end (its results), or, with ``KILL_RANK``,
    until that rank killed itself (then every worker is killed: None)."""
    full = {"CKPT": str(ckpt), "STEPS": str(STEPS), "EVERY": str(EVERY), "KEEP": str(KEEP)}
    full.update(env)
    with Cluster(workdir, n, HERE / "rank_worker.py", env=full) as cluster:
        if "KILL_RANK" not in env:
            return cluster.wait_ok(timeout=240)
        victim = cluster.procs[int(env["KILL_RANK"])]
        deadline = time.monotonic() + 240
        while victim.poll() is None:
            assert time.monotonic() < deadline, cluster.tails()
            time.sleep(0.05)
        assert victim.returncode == -9, cluster.tails()
        cluster.kill()  # the others wait in a collective for the dead rank
        return None


_references: dict[int, list[dict[str, Any]]] = {}


def uninterrupted(root: Path, n: int) -> list[dict[str, Any]]:
    """The uninterrupted run on ``n`` workers (run once per module)."""
    if n not in _references:
        ckpt = root / f"reference-{n}" / "ckpt"
        _references[n] = run(root / f"reference-{n}", n, ckpt)  # type: ignore[assignment]
        assert_layout(ckpt, n, kept=[30, 40, 50])
    return _references[n]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ranks")


def assert_layout(ckpt: Path, n: int, kept: list[int]) -> None:
    """Every kept step has its replicated part and one part per rank; nothing else is
    left (retention removed the rest, every rank its own parts)."""
    for style in STYLES:
        names = sorted(p.name for p in (ckpt / style).iterdir())
        index = [x for x in names if x.endswith(".index")]
        expected = [f"ckpt-{s}.index" for s in kept] + [
            f"ckpt-{s}.rank-{r:05d}-of-{n:05d}.index" for s in kept for r in range(n)
        ]
        assert sorted(index) == sorted(expected), (style, names)


def resume_and_compare(
    root: Path, name: str, n: int, *, kill_rank: int, kill_at: int, writing: bool = True
) -> list[dict[str, Any]]:
    """Kill ``kill_rank`` after step ``kill_at`` (``writing``: at its first save from
    there on whose write is in flight), start the job again, compare with the
    uninterrupted run; the resumed run's results."""
    ref = uninterrupted(root, n)
    work = root / name
    env = {"KILL_RANK": str(kill_rank), "KILL_AT": str(kill_at), "KILL_MARK": str(work / "mark")}
    if writing:
        env["KILL_IN_WRITE"] = "1"
    assert run(work / "killed", n, work / "ckpt", **env) is None
    last = json.loads((work / "mark").read_text())["step"] if writing else kill_at
    resumed = run(work / "resumed", n, work / "ckpt")
    assert resumed is not None
    for rank in range(n):
        for style in STYLES:
            got, want = resumed[rank][style], ref[rank][style]
            assert 0 < got["resumed_from"] <= last and got["resumed_from"] % EVERY == 0
            for key in COMPARED:
                assert got[key] == want[key], f"rank {rank}, {style}: {key} differs"
    # the replicated part is a plain TensorFlow checkpoint of the model and optimizer
    assert resumed[0]["plain_tf"] == {s: ref[0][s]["weights"] for s in STYLES}
    assert_layout(work / "ckpt", n, kept=[30, 40, 50])
    return resumed


def test_two_workers_resume_exactly_after_the_chief_dies_at_a_random_step(root) -> None:
    step = PICK.choice(BETWEEN)
    resumed = resume_and_compare(root, "chief", 2, kill_rank=0, kill_at=step, writing=False)
    assert {r[s]["resumed_from"] for r in resumed for s in STYLES} == {step // EVERY * EVERY}


def test_two_workers_resume_exactly_after_a_non_chief_dies_writing(root) -> None:
    resumed = resume_and_compare(root, "writing", 2, kill_rank=1, kill_at=PICK.choice([20, 30]))
    assert_killed_writing(root / "writing", resumed)


def assert_killed_writing(work: Path, resumed: list[dict[str, Any]]) -> None:
    """The rank died while a write of its style ``style`` was in flight: that style
    resumed from that step if the write still ended, else from the save before."""
    mark = json.loads((work / "mark").read_text())
    for r in resumed:
        assert r[mark["style"]]["resumed_from"] in (mark["step"] - EVERY, mark["step"])


def test_three_workers_resume_exactly_after_a_non_chief_dies_at_a_random_step(root) -> None:
    step = PICK.choice(BETWEEN)
    resumed = resume_and_compare(root, "three", 3, kill_rank=2, kill_at=step, writing=False)
    assert {r[s]["resumed_from"] for r in resumed for s in STYLES} == {step // EVERY * EVERY}


def test_three_workers_resume_exactly_after_the_chief_dies_writing(root) -> None:
    resumed = resume_and_compare(root, "three-w", 3, kill_rank=0, kill_at=PICK.choice([20, 30]))
    assert_killed_writing(root / "three-w", resumed)
