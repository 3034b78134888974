"""``adaptd verify``: real checkpoints written by TensorFlow, then damaged on disk.

Each damage is what storage really does to a checkpoint: a write cut short
(truncated shard), bit rot (flipped bytes), a shard lost in a copy, a broken
index, a directory with nothing in it. Every case must fail with the right kind
and a message naming the file; good checkpoints (plain, sharded, written by
``AdaptiveCheckpointer``) must pass.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client.restore import verify  # noqa: E402

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parents[2]


def _variables(seed: int) -> dict[str, tf.Variable]:
    g = tf.random.Generator.from_seed(seed)
    return {
        "w": tf.Variable(g.normal([64, 32])),  # 8 KiB of float32: the tensor we damage
        "b": tf.Variable(g.normal([32])),
        "names": tf.Variable(tf.constant(["alpha", "beta"])),  # a string tensor
    }


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Good checkpoints, written once per module; tests damage copies."""
    root = tmp_path_factory.mktemp("ckpts")
    out: dict[str, Path] = {}

    # CheckpointManager: three checkpoints ckpt-1..3 and a `checkpoint` state file
    ck = tf.train.Checkpoint(**_variables(1))
    mgr = tf.train.CheckpointManager(ck, root / "managed", max_to_keep=None)
    for _ in range(3):
        mgr.save()
    out["managed"] = root / "managed"

    # several data shards (TensorFlow splits the 8 KiB tensor into slices)
    opts = tf.train.CheckpointOptions(
        experimental_sharding_callback=tf.train.experimental.MaxShardSizePolicy(max_shard_size=3000)
    )
    tf.train.Checkpoint(**_variables(2)).write(str(root / "sharded" / "ckpt-7"), options=opts)
    out["sharded"] = root / "sharded"

    # the hook's own checkpoints (global step variable, no daemon)
    from adaptd.client import AdaptiveCheckpointer

    v = tf.Variable(tf.zeros([16]))
    with warnings.catch_warnings(), AdaptiveCheckpointer(
        root / "hook", job="verify-test", policy="fixed:steps=3", max_to_keep=None,
        socket=f"ipc://{root}/none.sock", daemon_timeout=0.2, handle_sigterm=False, v=v,
    ) as ckptr:  # fmt: skip
        ckptr.restore_or_initialize()
        deadline = time.monotonic() + 30
        warnings.simplefilter("ignore", RuntimeWarning)  # "no daemon": intended here
        while ckptr.stats["saves"] < 2:  # then close() waits for one still in flight
            assert time.monotonic() < deadline, "the hook did not save twice in 30 s"
            v.assign_add(tf.ones([16]))
            ckptr.step()
    out["hook"] = root / "hook"
    return out


@pytest.fixture
def ckpts(originals: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """Fresh copies of the good checkpoints for one test to damage."""
    return {k: Path(shutil.copytree(v, tmp_path / k)) for k, v in originals.items()}


def _data(prefix: Path) -> list[Path]:
    return sorted(prefix.parent.glob(f"{prefix.name}.data-*"))


def _kinds(report: verify.Report) -> list[str]:
    return [p.kind for p in report.problems]


def _w_range(prefix: Path) -> tuple[int, int]:
    """Offset and size of tensor ``w`` in its data shard, from the index itself."""
    from tensorflow.core.protobuf import tensor_bundle_pb2

    for key, value in verify.read_index(f"{prefix}.index"):
        if key == b"w/.ATTRIBUTES/VARIABLE_VALUE":
            e = tensor_bundle_pb2.BundleEntryProto.FromString(value)
            return e.offset, e.size
    raise AssertionError("no entry for w in the index")


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``adaptd verify ARGS`` as a user runs it: TF_CPP_MIN_LOG_LEVEL not set."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "verify", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        check=False,
    )


# --------------------------------------------------------------------------- good


def test_crc32c_matches_the_standard_check_value() -> None:
    # RFC 3720 (iSCSI) check value of CRC-32C over "123456789"
    assert verify.crc32c(b"123456789") == 0xE3069283
    assert verify.crc32c(b"") == 0


def test_directory_means_the_latest_checkpoint_and_every_tensor_is_read(ckpts) -> None:
    r = verify.verify(ckpts["managed"])
    assert r.ok, r.problems
    assert Path(r.prefix).name == "ckpt-3"
    # w, b, names, save_counter and the object graph
    assert r.tensors == r.tensors_read == 5
    assert r.shards == 1
    assert r.data_bytes == sum(f.stat().st_size for f in _data(Path(r.prefix)))
    assert r.data_bytes > 64 * 32 * 4
    assert r.step is None  # no adaptd step variable in a plain checkpoint


def test_an_explicit_prefix_or_index_file_is_that_checkpoint(ckpts) -> None:
    for path in (ckpts["managed"] / "ckpt-1", ckpts["managed"] / "ckpt-1.index"):
        r = verify.verify(path)
        assert r.ok, r.problems
        assert Path(r.prefix).name == "ckpt-1"


def test_sharded_checkpoint_passes(ckpts) -> None:
    r = verify.verify(ckpts["sharded"])
    assert r.ok, r.problems
    assert r.shards == len(_data(Path(r.prefix))) >= 3
    assert r.tensors == r.tensors_read


def test_adaptive_checkpointer_checkpoint_reports_its_step(ckpts) -> None:
    r = verify.verify(ckpts["hook"])
    assert r.ok, r.problems
    # the directory's latest is the newest save; its name and the stored step agree
    assert r.step is not None and r.step >= 6
    assert Path(r.prefix).name == f"ckpt-{r.step}"


def test_state_file_naming_a_lost_checkpoint_falls_back_with_a_note(ckpts) -> None:
    d = ckpts["managed"]
    (d / "ckpt-3.index").unlink()
    r = verify.verify(d)
    assert r.ok, r.problems
    assert Path(r.prefix).name == "ckpt-2"
    assert any("ckpt-3" in n and "no index" in n for n in r.notes)


# --------------------------------------------------------------------------- damaged


def test_truncated_data_shard(ckpts) -> None:
    prefix = ckpts["managed"] / "ckpt-3"
    (shard,) = _data(prefix)
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size - 100)
    r = verify.verify(prefix)
    assert _kinds(r) == ["truncated"]
    msg = r.problems[0].message
    assert shard.name in msg and str(size - 100) in msg and str(size) in msg


def test_flipped_bytes_in_the_data_are_a_checksum_failure(ckpts) -> None:
    prefix = ckpts["managed"] / "ckpt-3"
    (shard,) = _data(prefix)
    offset, size = _w_range(prefix)
    with shard.open("r+b") as f:
        f.seek(offset + size // 2)
        byte = f.read(1)
        f.seek(offset + size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    r = verify.verify(prefix)
    assert _kinds(r) == ["corrupted"]
    assert "w/.ATTRIBUTES/VARIABLE_VALUE" in r.problems[0].message
    assert r.tensors_read == r.tensors - 1


def test_deleted_shard_of_a_sharded_checkpoint(ckpts) -> None:
    prefix = ckpts["sharded"] / "ckpt-7"
    shards = _data(prefix)
    shards[1].unlink()
    r = verify.verify(prefix)
    assert "missing_shard" in _kinds(r)
    assert shards[1].name in r.problems[0].message


def test_a_directory_whose_only_checkpoint_lost_a_shard_has_none(ckpts) -> None:
    d = ckpts["sharded"]
    _data(d / "ckpt-7")[0].unlink()
    r = verify.verify(d)
    assert _kinds(r) == ["no_checkpoint"]
    assert r.prefix is None


def test_corrupted_index(ckpts) -> None:
    prefix = ckpts["managed"] / "ckpt-3"
    index = Path(f"{prefix}.index")
    data = bytearray(index.read_bytes())
    data[20] ^= 0x55  # inside the first data block
    index.write_bytes(bytes(data))
    r = verify.verify(prefix)
    assert _kinds(r)[0] == "unreadable_index"
    assert "checksum mismatch" in r.problems[0].message
    assert "ckpt-3.index" in r.problems[0].message


def test_index_that_is_not_a_table(ckpts) -> None:
    prefix = ckpts["managed"] / "ckpt-2"
    Path(f"{prefix}.index").write_bytes(b"\x00" * 10)
    r = verify.verify(prefix)
    assert _kinds(r)[0] == "unreadable_index"
    assert "shorter than a table footer" in r.problems[0].message


def test_a_shard_larger_than_the_index_expects(ckpts) -> None:
    prefix = ckpts["managed"] / "ckpt-1"
    (shard,) = _data(prefix)
    with shard.open("ab") as f:
        f.write(b"\x00" * 64)
    r = verify.verify(prefix)
    assert _kinds(r) == ["oversized"]
    assert "64 more" in r.problems[0].message


def test_empty_directory_and_missing_prefix(tmp_path: Path) -> None:
    r = verify.verify(tmp_path)
    assert _kinds(r) == ["no_checkpoint"]
    assert str(tmp_path) in r.problems[0].message
    r = verify.verify(tmp_path / "ckpt-9")
    assert _kinds(r) == ["no_checkpoint"]
    assert "ckpt-9.index does not exist" in r.problems[0].message


# --------------------------------------------------------------------------- the real CLI


@pytest.mark.slow
def test_cli_good_checkpoint_exits_0_with_a_summary(ckpts) -> None:
    p = _cli(ckpts["hook"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("OK ")
    assert "tensors read" in p.stdout and "step " in p.stdout


@pytest.mark.slow
def test_cli_says_nothing_alarming_from_tensorflows_start_up(tmp_path: Path) -> None:
    """A checkpoint with a ``tf.data`` iterator makes TensorFlow set up its devices; on
    a host without a GPU that logged "E0000 ... failed call to cuInit: ... CUDA error"
    to a user who had asked whether the checkpoint was good."""
    it = iter(tf.data.Dataset.range(10))
    next(it)
    tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]), it=it).write(str(tmp_path / "ckpt-1"))
    p = _cli(tmp_path / "ckpt-1")
    assert p.returncode == 0 and p.stdout.startswith("OK "), p.stderr
    assert not re.search(r"^E\d{4} ", p.stderr, re.M), p.stderr


@pytest.mark.slow
def test_cli_truncated_json_and_empty_directory_exit_1(ckpts, tmp_path: Path) -> None:
    prefix = ckpts["managed"] / "ckpt-3"
    (shard,) = _data(prefix)
    with shard.open("r+b") as f:
        f.truncate(10)
    p = _cli(prefix, "--json")
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is False
    assert [x["kind"] for x in out["problems"]] == ["truncated"]
    assert out["prefix"] == str(prefix)

    empty = tmp_path / "empty"
    empty.mkdir()
    p = _cli(empty)
    assert p.returncode == 1
    assert p.stdout.startswith("FAIL: no complete checkpoint")


# --------------------------------------------------------------------------- resume's check


def test_the_quick_check_reads_the_index_and_finds_what_sizes_show(ckpts) -> None:
    """What restore_or_initialize() runs at every start: no tensor is read in full."""
    prefix = ckpts["managed"] / "ckpt-3"
    quick = verify.verify(prefix, read_tensors=False)
    assert quick.ok and quick.tensors_read == 1 < quick.tensors  # the object graph only
    (data,) = _data(prefix)
    offset, _ = _w_range(prefix)
    raw = bytearray(data.read_bytes())
    raw[offset + 100] ^= 0xFF  # a flipped byte: only reading the tensor finds it...
    data.write_bytes(bytes(raw))
    assert verify.verify(prefix, read_tensors=False).ok
    assert _kinds(verify.verify(prefix)) == [verify.CORRUPTED]  # ...as the restore does
    os.truncate(data, data.stat().st_size - 100)  # a cut-short file: the sizes show it
    assert _kinds(verify.verify(prefix, read_tensors=False)) == [verify.TRUNCATED]


def test_candidates_are_the_state_files_checkpoints_newest_first(ckpts) -> None:
    d = ckpts["managed"]
    names = lambda: [p.name for p in verify.candidates(d)]  # noqa: E731
    assert names() == ["ckpt-3", "ckpt-2", "ckpt-1"]
    (d / "ckpt-3.index").unlink()  # damaged ones are candidates too: verify says why
    assert names() == ["ckpt-3", "ckpt-2", "ckpt-1"]
    for f in d.glob("ckpt-2.*"):  # a checkpoint never finished: newer than the latest
        shutil.copy(f, d / f.name.replace("ckpt-2", "ckpt-9"))
    assert names() == ["ckpt-3", "ckpt-2", "ckpt-1"]
    (d / "checkpoint").unlink()  # without a state file: every numbered one
    assert names() == ["ckpt-9", "ckpt-3", "ckpt-2", "ckpt-1"]
    assert verify.candidates(d / "nowhere") == []
