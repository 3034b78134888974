"""The per-rank part layout (adaptd/checkpoints/rank_parts.py): names, when a step is complete for
the job, which parts a rank may delete. Pure: tables of file names in, answers out."""

from __future__ import annotations

import pytest

from adaptd.checkpoints import rank_parts as rp


def bundle(prefix: str, shards: int = 1) -> set[str]:
    return {f"{prefix}.index"} | {f"{prefix}.data-{i:05d}-of-{shards:05d}" for i in range(shards)}


def step(n: int, world: int, ranks: tuple[int, ...] | None = None, main: bool = True) -> set[str]:
    """The files of step ``n`` of a job of ``world`` ranks: its replicated part (unless
    not ``main``) and the parts of ``ranks`` (default: all)."""
    names = bundle(f"ckpt-{n}", 2) if main else set()
    for r in range(world) if ranks is None else ranks:
        names |= bundle(rp.part_name(n, r, world)) if world > 1 else set()
    return names


def test_names_hold_the_step_the_rank_and_the_world_size() -> None:
    assert rp.part_name(50, 1, 3) == "ckpt-50.rank-00001-of-00003"
    assert rp.pending_name(50, 1, 3) == "ckpt-50.rank-00001-of-00003.pending"
    assert rp.part_of("ckpt-50.rank-00001-of-00003.data-00000-of-00001") == (50, 1, 3)
    assert rp.part_of("ckpt-50.rank-00001-of-00003.pending") == (50, 1, 3)
    assert rp.part_of("ckpt-50.index") is None and rp.part_of("ckpt-50.rank-1-of-3.index") is None
    assert rp.step_of("ckpt-50.index") == rp.step_of("ckpt-50.rank-00002-of-00003.index") == 50
    assert rp.step_of("checkpoint") is None and rp.step_of("ckpt-50.manifest.json") is None


@pytest.mark.parametrize(
    ("names", "world", "complete", "why"),
    [
        # a single process's step: no part at all
        (bundle("ckpt-7", 2), 1, True, ""),
        (bundle("ckpt-7", 2) - {"ckpt-7.data-00001-of-00002"}, 1, False, "replicated part"),
        (step(7, 3), 3, True, ""),
        # one rank's part is not there (yet): incomplete, naming it
        (step(7, 3, (0, 2)), 3, False, "rank(s) 1 of 3 have no complete part"),
        # its index not written yet: TF writes it last
        (step(7, 2) - {"ckpt-7.rank-00001-of-00002.index"}, 2, False, "rank(s) 1 of 2"),
        # the replicated part landed, no rank's part did, but their markers say how many
        (
            bundle("ckpt-7", 2) | {rp.pending_name(7, r, 2) for r in range(2)},
            2,
            False,
            "rank(s) 0, 1 of 2 have no complete part",
        ),
        # every part, no replicated part (still being written by the chief)
        (step(7, 2, main=False), 2, False, "its replicated part ckpt-7 is missing"),
        (step(7, 2) | step(7, 3, main=False), 3, False, "several world sizes (2, 3)"),
    ],
)
def test_a_step_is_complete_only_with_every_ranks_part(names, world, complete, why) -> None:
    got = rp.status(names, 7)
    assert (got.world, got.complete) == (world, complete)
    assert why in got.why and bool(got.why) == (not complete)


def test_the_status_lists_the_whole_parts_and_the_missing_ranks() -> None:
    got = rp.status(step(7, 4, (0, 3)) | step(8, 4), 7)
    assert got.parts == (0, 3) and got.missing == (1, 2) and got.replicated


def test_files_of_a_step_put_data_before_indexes_and_leave_markers_out() -> None:
    names = step(5, 2) | step(6, 2) | {rp.pending_name(5, 1, 2), "checkpoint"}
    files = rp.files_of(names, 5)
    assert set(files) == step(5, 2)
    assert all(not f.endswith(".index") for f in files[:4])
    assert all(f.endswith(".index") for f in files[4:])
    assert rp.steps(names) == [6, 5]


def own(*steps: int) -> set[str]:
    """Rank 1's parts of ``steps`` (of 2 ranks) alone: its directory on its own host."""
    return set().union(*(step(n, 2, (1,), main=False) for n in steps))


@pytest.mark.parametrize(
    ("names", "ranks", "keep", "stale"),
    [
        # the manager dropped ckpt-10: its parts go, the chief removes every rank's
        (step(10, 2, main=False) | step(20, 2) | step(30, 2), (0, 1), 2, [(10, 0), (10, 1)]),
        # ... a rank other than the chief only its own
        (step(10, 2, main=False) | step(20, 2), (1,), 2, [(10, 1)]),
        # the newest step's replicated part is still being written: its parts stay
        (step(10, 2) | step(20, 2, main=False), (0, 1), 2, []),
        # a failed replicated part, then a newer one: the failed step's parts go
        (step(10, 2) | step(20, 2, main=False) | step(30, 2), (1,), 5, [(20, 1)]),
        # a rank's own directory, no replicated part ever (no shared storage): keep + 1
        (own(1, 2, 3, 4), (1,), 2, [(1, 1)]),
        (own(1, 2), (1,), None, []),
        # another world size's parts are not this job's to delete
        (step(10, 3, main=False) | step(20, 2), (0, 1), 2, []),
    ],
)
def test_which_parts_a_rank_may_delete(names, ranks, keep, stale) -> None:
    assert rp.stale_parts(names, ranks, 2, keep) == stale


def test_the_world_size_refusal_names_both_sizes_and_what_to_do() -> None:
    text = rp.world_changed(40, "/ckpt", 2, 3)
    assert "ckpt-40 in /ckpt was written by 2 worker(s); this job has 3 worker(s)" in text
    assert "Restart it with 2 worker(s), or move those checkpoints aside" in text
    assert "plain TensorFlow still reads the model and optimizer from ckpt-40" in text
    assert "a single process (no per-rank parts)" in rp.world_changed(40, "/ckpt", 1, 2)


def test_step_bytes_count_the_replicated_part_and_every_part(tmp_path) -> None:
    for name in step(3, 2) | {rp.pending_name(3, 0, 2), "ckpt-4.index"}:
        (tmp_path / name).write_bytes(b"x" * 10)
    assert rp.step_bytes(tmp_path, 3) == 10 * len(step(3, 2))
    assert rp.step_bytes(tmp_path / "absent", 3) == 0


def test_a_replay_note_stands_for_a_part_while_the_part_it_names_is_whole() -> None:
    """A just-in-time step's parts are replay notes (client/save/just_in_time.py): rank
    r's part of 12 is its part of 10 plus two steps' batches, or a fresh input (base 0)."""
    note = rp.replay_name(12, 1, 2, 10)
    assert note == "ckpt-12.rank-00001-of-00002.replay-from-10"
    assert rp.part_of(note) == (12, 1, 2) and rp.step_of(note) == 12
    jit = bundle("ckpt-12", 1) | {rp.replay_name(12, r, 2, 10) for r in range(2)}
    assert rp.status(step(10, 2) | jit, 12).complete
    assert rp.replay_base(step(10, 2) | jit, 12, 1, 2) == 10
    # the base part gone (or never whole): the step is not complete, and says whose part
    gone = step(10, 2, ranks=(0,)) | jit
    st = rp.status(gone, 12)
    assert not st.complete and st.missing == (1,) and not rp.written(gone, 12, 0, 2)
    # a note from step 0 needs no part; a note from the step itself or later counts for nothing
    fresh = bundle("ckpt-4", 1) | {rp.replay_name(4, r, 2, 0) for r in range(2)}
    assert rp.status(fresh, 4).complete
    assert not rp.status(
        bundle("ckpt-4", 1) | {rp.replay_name(4, r, 2, 4) for r in range(2)}, 4
    ).complete


def test_a_part_a_kept_replay_note_starts_from_is_not_stale() -> None:
    """ckpt-10's replicated part rotated out while ckpt-12 (just in time) replays from its
    parts: they stay; once ckpt-12 is gone too they go."""
    names = (
        step(10, 2, main=False)
        | bundle("ckpt-12")
        | {rp.replay_name(12, r, 2, 10) for r in range(2)}
    )
    names |= step(15, 2)
    assert rp.stale_parts(names, range(2), 2, 3) == []
    without = {n for n in names if not n.startswith("ckpt-12.index")}
    assert (10, 0) in rp.stale_parts(without, range(2), 2, 3)
