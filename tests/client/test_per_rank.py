"""A rank's own state, in one process: which trackables are per-rank
(client/save/per_rank.py), one rank's part written, tidied and restored
(client/save/rank_state.py), ``adaptd verify`` of a step with parts, and a single process
refusing a multi-worker job's checkpoints. The real multi-worker job is in
tests/multiworker/test_rank_state.py."""

from __future__ import annotations

from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.checkpoints import rank_parts  # noqa: E402
from adaptd.client import AdaptiveCheckpointer, WorldSizeChanged  # noqa: E402
from adaptd.client.restore import verify  # noqa: E402
from adaptd.client.save import per_rank  # noqa: E402
from adaptd.client.save.rank_state import PartMismatch, RankPart  # noqa: E402

pytestmark = pytest.mark.tf


def shuffled() -> tf.data.Dataset:
    return tf.data.Dataset.range(100).shuffle(32, seed=5).repeat().batch(3)


def take(it, n: int) -> list[list[int]]:
    return [next(it).numpy().tolist() for _ in range(n)]


def test_iterators_and_generators_of_the_rank_are_per_rank_the_mirrored_state_is_not() -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored_gen = tf.random.Generator.from_seed(1)
        weights = tf.Variable(1.0)
    state = per_rank.prepared(
        {
            "it": iter(shuffled()),
            "dist": iter(strategy.experimental_distribute_dataset(shuffled())),
            "rng": tf.random.Generator.from_seed(2),  # outside the scope: this rank's own
            "mirrored_rng": mirrored_gen,
            "weights": weights,
            "counter": tf.Variable(0),
        }
    )
    replicated, own = per_rank.split(state, per_rank.check_names(("counter",), state))
    assert sorted(own) == ["counter", "dist", "it", "rng"]
    assert sorted(replicated) == ["mirrored_rng", "weights"]
    assert isinstance(own["dist"], list) and isinstance(own["dist"][0], tf.data.Iterator)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("counter", "a collection of the trackables' keywords"),
        (("nope",), "per_rank names 'nope', which is not one of the state's keywords"),
        (3, "a collection"),
    ],
)
def test_per_rank_names_are_checked_when_the_hook_is_built(tmp_path, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        AdaptiveCheckpointer(
            tmp_path, job="j", socket=f"ipc://{tmp_path}/none.sock", handle_sigterm=False,
            per_rank=value, counter=tf.Variable(0),
        )  # fmt: skip


def part(directory: Path, rank: int = 1, keep: int | None = 3):
    it = iter(shuffled())
    rng = tf.random.Generator.from_seed(7)
    return RankPart({"it": it, "rng": rng}, rank=rank, world_size=2, directory=directory,
                    keep=keep), it, rng  # fmt: skip


def test_a_ranks_part_is_written_alone_and_restores_its_position(tmp_path) -> None:
    mine, it, rng = part(tmp_path)
    take(it, 5)
    prefix = mine.start(40)
    assert Path(prefix).name == "ckpt-40.rank-00001-of-00002"
    assert (tmp_path / rank_parts.pending_name(40, 1, 2)).exists()  # until it is written
    after = take(it, 12), rng.normal([3]).numpy().tolist()
    error, nbytes = mine.finish()
    assert not error and nbytes > 0
    names = rank_parts.listing(tmp_path)
    assert not any(n.endswith(".pending") for n in names)  # removed once written
    assert rank_parts.status(names, 40).parts == (1,)

    again, it2, rng2 = part(tmp_path)
    again.restore(40)
    assert (take(it2, 12), rng2.normal([3]).numpy().tolist()) == after


def test_a_part_under_another_ranks_name_is_refused(tmp_path) -> None:
    mine, _, _ = part(tmp_path, rank=1)
    mine.start(40)
    assert mine.finish()[0] == ""
    theirs = tmp_path / rank_parts.part_name(40, 0, 2)
    for f in tmp_path.glob("ckpt-40.rank-00001-of-00002.*"):
        f.rename(tmp_path / f.name.replace("rank-00001", "rank-00000"))
    assert Path(f"{theirs}.index").exists()
    rank0, _, _ = part(tmp_path, rank=0)
    with pytest.raises(PartMismatch, match="holds the part of step 40, rank 1 of 2"):
        rank0.restore(40)


def test_a_rank_without_shared_storage_keeps_its_newest_parts(tmp_path) -> None:
    mine, it, _ = part(tmp_path, keep=2)
    for step in (10, 20, 30, 40, 50):
        next(it)
        mine.start(step)
        assert mine.finish()[0] == ""
    held = sorted({p[0] for p in map(rank_parts.part_of, rank_parts.listing(tmp_path)) if p})
    assert held == [30, 40, 50]  # keep + 1: no replicated part ever appears here


def write_step(directory: Path, step: int, world: int, ranks=None) -> None:
    """A real step of a job of ``world`` ranks: its replicated part and the ranks' parts."""
    tf.train.Checkpoint(w=tf.Variable(tf.ones([50]))).write(str(directory / f"ckpt-{step}"))
    for r in range(world) if ranks is None else ranks:
        part_ckpt = tf.train.Checkpoint(it=iter(shuffled()))
        part_ckpt.write(str(directory / rank_parts.part_name(step, r, world)))
    (directory / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')


def test_verify_checks_every_ranks_part_of_the_step(tmp_path) -> None:
    write_step(tmp_path, 8, 2)
    report = verify.verify(tmp_path)
    assert report.ok and report.world_size == 2 and report.parts == 2
    from adaptd.commands.verify import render

    assert ", 2 of 2 rank parts" in render(report)
    # one rank's part cut short, another's gone
    data = tmp_path / f"{rank_parts.part_name(8, 0, 2)}.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-10])
    (tmp_path / f"{rank_parts.part_name(8, 1, 2)}.index").unlink()
    report = verify.verify(tmp_path)
    kinds = {p.kind for p in report.problems}
    assert kinds == {verify.TRUNCATED, verify.MISSING_PART}, report.problems
    text = " ".join(p.message for p in report.problems)
    assert "ckpt-8.rank-00000-of-00002.data-00000-of-00001 is truncated" in text
    assert "rank(s) 1 of 2 have no complete part" in text


def test_a_resume_never_takes_a_ranks_part_for_a_checkpoint_of_its_own(tmp_path) -> None:
    write_step(tmp_path, 8, 2)
    (tmp_path / "checkpoint").unlink()  # no state file: every numbered checkpoint counts
    assert [p.name for p in verify.candidates(tmp_path)] == ["ckpt-8"]
    assert verify.find(tmp_path)[0] == tmp_path / "ckpt-8"


def test_a_single_process_refuses_a_multi_worker_jobs_checkpoint(tmp_path) -> None:
    write_step(tmp_path, 8, 2)
    hook = AdaptiveCheckpointer(
        tmp_path, job="j", socket=f"ipc://{tmp_path}/none.sock", handle_sigterm=False,
        daemon_timeout=0.2, w=tf.Variable(tf.zeros([50])), it=iter(shuffled()),
    )  # fmt: skip
    try:
        with pytest.raises(WorldSizeChanged, match=r"by 2 worker\(s\); this job has 1"):
            hook.restore_or_initialize()
    finally:
        hook.close()


def test_a_single_process_resumes_a_distributed_iterator_exactly(tmp_path) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])

    def run(steps: int) -> tuple[int, list[list[int]]]:
        it = iter(strategy.experimental_distribute_dataset(shuffled()))
        hook = AdaptiveCheckpointer(
            tmp_path, job="j", policy="fixed:steps=10", socket=f"ipc://{tmp_path}/none.sock",
            handle_sigterm=False, daemon_timeout=0.2, save_on_close=False, data_iterator=it,
        )  # fmt: skip
        start = hook.restore_or_initialize()
        for _ in range(start, steps):
            next(it)
            hook.step()
        hook.close()
        return start, take(it, 5)

    assert run(25)[0] == 0  # saves at 10 and 20, then ends without a final save
    resumed = run(40)
    assert resumed[0] == 20
    (tmp_path / "checkpoint").unlink()  # start over: the uninterrupted run
    for f in tmp_path.glob("ckpt-*"):
        f.unlink()
    assert run(40) == (0, resumed[1])


def test_a_part_that_cannot_be_written_fails_the_save_and_nothing_is_replicated(tmp_path) -> None:
    from adaptd.client.save.costs import Baseline, StepClock
    from adaptd.client.save.saves import Saves
    from adaptd.client.save.state import CheckpointState
    from adaptd.client.save.targets import Durable
    from adaptd.client.save.writer import Writer
    from adaptd.core.estimators import JobTracker

    state = CheckpointState({"w": tf.Variable(1.0)})
    durable = Durable(state.checkpoint, tmp_path / "ck", max_to_keep=3)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    mine = RankPart({"it": iter(shuffled())}, rank=0, world_size=2, directory=blocker / "ck",
                    keep=3)  # fmt: skip
    saves = Saves(state, durable, Writer(state.checkpoint, None), job="j", rank=0, part=mine)
    saves.start(JobTracker("j", world_size=2), StepClock(0, 0.0), Baseline(0, 0.0))
    saves.save(10, "test", None)
    report = saves.wait(11, 30)
    saves.stop()
    assert report is not None and not report.ok and saves.failed == 1
    assert "a-file" in report.error  # the part's directory cannot be made
    assert not (tmp_path / "ck" / "ckpt-10.index").exists()  # no replicated part alone
