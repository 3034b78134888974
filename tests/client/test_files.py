"""Leftovers of interrupted writes and checkpoint sizes (real files)."""

from __future__ import annotations

from adaptd.client.save import files


def test_orphans_removed_and_checkpoints_kept(tmp_path):
    # What a write killed mid-way leaves (TF's names), next to good checkpoints
    (tmp_path / "ckpt-40_temp").mkdir()
    (tmp_path / "ckpt-40_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x" * 10)
    (tmp_path / "checkpoint.tmp6f1c2b9d0e").write_text("model_checkpoint_path: ...")
    for name in ("ckpt-30.index", "ckpt-30.data-00000-of-00001", "checkpoint"):
        (tmp_path / name).write_bytes(b"ok")
    assert [p.name for p in files.orphans(tmp_path)] == ["checkpoint.tmp6f1c2b9d0e", "ckpt-40_temp"]
    removed = files.remove_orphans(tmp_path)
    assert len(removed) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint",
        "ckpt-30.data-00000-of-00001",
        "ckpt-30.index",
    ]
    assert files.orphans(tmp_path / "missing") == []


def test_checkpoint_bytes_counts_index_and_shards(tmp_path):
    (tmp_path / "ckpt-5.index").write_bytes(b"i" * 100)
    (tmp_path / "ckpt-5.data-00000-of-00002").write_bytes(b"d" * 1000)
    (tmp_path / "ckpt-5.data-00001-of-00002").write_bytes(b"d" * 24)
    (tmp_path / "ckpt-50.index").write_bytes(b"x" * 7)  # another checkpoint: not counted
    assert files.checkpoint_bytes(str(tmp_path / "ckpt-5")) == 1124


def test_remove_checkpoint_removes_only_that_one(tmp_path):
    for name in ("ckpt-5.index", "ckpt-5.data-00000-of-00001", "ckpt-50.index"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "ckpt-5_temp").mkdir()
    files.remove_checkpoint(str(tmp_path / "ckpt-5"))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-50.index"]
