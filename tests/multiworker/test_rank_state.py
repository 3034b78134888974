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
from pathlib import Path
from typing import Any

import pytest
from faults.zygote import Zygote

from multiworker.rank_jobs import COMPARED, EVERY, STEPS, STYLES, run

pytestmark = [pytest.mark.slow, pytest.mark.tf]

PICK = random.Random(21)  # the "random" steps, the same in every run of the suite
#: Steps that are not save steps (a kill there never interrupts a write).
BETWEEN = [s for s in range(EVERY + 1, STEPS) if s % EVERY]


_references: dict[int, list[dict[str, Any]]] = {}


def uninterrupted(root: Path, zygote: Zygote, n: int) -> list[dict[str, Any]]:
    """The uninterrupted run on ``n`` workers (run once per module)."""
    if n not in _references:
        ckpt = root / f"reference-{n}" / "ckpt"
        _references[n] = run(root / f"reference-{n}", n, ckpt, zygote)  # type: ignore[assignment]
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
    root: Path,
    zygote: Zygote,
    name: str,
    n: int,
    *,
    kill_rank: int,
    kill_at: int,
    writing: bool = True,
) -> list[dict[str, Any]]:
    """Kill ``kill_rank`` after step ``kill_at`` (``writing``: at its first save from
    there on whose write is in flight), start the job again, compare with the
    uninterrupted run; the resumed run's results."""
    ref = uninterrupted(root, zygote, n)
    work = root / name
    env = {"KILL_RANK": str(kill_rank), "KILL_AT": str(kill_at), "KILL_MARK": str(work / "mark")}
    if writing:
        env["KILL_IN_WRITE"] = "1"
    assert run(work / "killed", n, work / "ckpt", zygote, **env) is None
    last = json.loads((work / "mark").read_text())["step"] if writing else kill_at
    resumed = run(work / "resumed", n, work / "ckpt", zygote)
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


# Two workers (the chief SIGKILLed, a worker killed in its write) are cells of the crash
# matrix (test_crash_matrix.py, the plain input); here three workers and every input style.
@pytest.mark.parametrize(("n", "victim"), [(3, 2)], ids=["3w-rank2"])
def test_resume_is_exact_after_a_rank_dies_at_a_random_step(root, zygote, n, victim) -> None:
    step = PICK.choice(BETWEEN)
    resumed = resume_and_compare(root, zygote, f"random-{n}", n, kill_rank=victim, kill_at=step,
                                 writing=False)  # fmt: skip
    assert {r[s]["resumed_from"] for r in resumed for s in STYLES} == {step // EVERY * EVERY}


@pytest.mark.parametrize(("n", "victim"), [(3, 0)], ids=["3w-chief"])
def test_resume_is_exact_after_a_rank_dies_while_its_write_is_in_flight(
    root, zygote, n, victim
) -> None:
    work = root / f"writing-{n}"
    resumed = resume_and_compare(
        root, zygote, work.name, n, kill_rank=victim, kill_at=PICK.choice([20, 30])
    )
    # the style whose write was in flight resumes from that step if the write still
    # ended, else from the save before
    mark = json.loads((work / "mark").read_text())
    step = mark["step"]
    for r in resumed:
        got = r[mark["style"]]
        assert got["resumed_from"] in (step - EVERY, step)
        if got["resumed_from"] < step:  # skipped, and the daemon is told why
            assert f"skipped damaged ckpt-{step} (step {step} is not complete" in got["skipped"]
            assert f"resumed from ckpt-{step - EVERY}" in got["skipped"]
