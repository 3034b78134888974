"""Resume from the newest checkpoint that is whole (issue 11).

A run saves at 21, 28 and 35 with real TensorFlow; then the newest checkpoint is
damaged the ways disks and people damage files, and the next run must resume from
28 with a warning naming ckpt-35 and why, or, with nothing intact, stop with a
typed error that says what was found.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client import AdaptiveCheckpointer, NoIntactCheckpoint  # noqa: E402
from adaptd.protocol import job as protocol  # noqa: E402

from .conftest import FakeDaemon  # noqa: E402

pytestmark = pytest.mark.tf

SIZE = 20_000  # floats: the data shard is nearly all this one tensor


def hook(d: Path, socket: str, **kw) -> AdaptiveCheckpointer:
    v = tf.Variable(tf.zeros([SIZE]))
    return AdaptiveCheckpointer(
        d, job="resume", policy="fixed:steps=7", socket=socket, daemon_timeout=0.2,
        handle_sigterm=False, max_to_keep=3, save_on_close=False, v=v,
    )  # fmt: skip


@pytest.fixture
def ckpts(tmp_path: Path) -> Path:
    """ckpt-21, ckpt-28, ckpt-35 of a run whose variable holds its step count."""
    d = tmp_path / "ckpts"
    ckptr = hook(d, f"ipc://{tmp_path}/none.sock")
    ckptr.restore_or_initialize()
    v = ckptr.checkpoint.v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(35):
            v.assign_add(tf.ones([SIZE]))
            ckptr.step()
    ckptr.close()
    assert sorted(p.name for p in d.glob("*.index")) == [
        "ckpt-21.index", "ckpt-28.index", "ckpt-35.index"
    ]  # fmt: skip
    return d


def resume(d: Path, socket: str) -> tuple[AdaptiveCheckpointer, int, list[str]]:
    ckptr = hook(d, socket)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        start = ckptr.restore_or_initialize()
    texts = [str(w.message) for w in caught if "damaged" in str(w.message)]
    return ckptr, start, texts


def data(d: Path, n: int) -> Path:
    return d / f"ckpt-{n}.data-00000-of-00001"


def truncate(d: Path, n: int) -> None:
    f = data(d, n)
    os.truncate(f, f.stat().st_size - 100)


def flip(d: Path, n: int) -> None:
    f = data(d, n)
    with open(f, "r+b") as fh:
        fh.seek(f.stat().st_size // 2)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (truncate, "truncated"),
        (flip, "corrupted"),  # found by TensorFlow's CRC32C check as it restores
        (lambda d, n: (d / f"ckpt-{n}.index").unlink(), "ckpt-35.index does not exist"),
        (lambda d, n: data(d, n).unlink(), "missing_shard"),
    ],
    ids=["truncated-data", "flipped-byte", "missing-index", "missing-data"],
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_next_intact_one(
    ckpts: Path, tmp_path: Path, damage, why: str
) -> None:
    damage(ckpts, 35)
    ckptr, start, texts = resume(ckpts, f"ipc://{tmp_path}/none.sock")
    try:
        assert start == 28
        assert float(ckptr.checkpoint.v[0]) == 28.0  # the state of step 28, not a mix
        assert len(texts) == 1 and "ckpt-35" in texts[0] and why in texts[0], texts
        assert "resumed from ckpt-28" in texts[0]
        assert [d.name for d in ckptr.resume.skipped] == ["ckpt-35"]
    finally:
        ckptr.close()


def test_with_nothing_intact_the_run_stops_with_what_was_found(ckpts: Path, tmp_path) -> None:
    truncate(ckpts, 35)
    flip(ckpts, 28)
    (ckpts / "ckpt-21.index").unlink()
    ckptr = hook(ckpts, f"ipc://{tmp_path}/none.sock")
    with pytest.raises(NoIntactCheckpoint) as info:
        ckptr.restore_or_initialize()
    msg = str(info.value)
    assert "3 found, all damaged" in msg
    for name, why in (("ckpt-35", "truncated"), ("ckpt-28", "corrupted"), ("ckpt-21", "index")):
        assert name in msg and why in msg, msg
    assert [d.name for d in info.value.damaged] == ["ckpt-35", "ckpt-28", "ckpt-21"]
    ckptr.close()


def test_a_checkpoint_of_another_model_is_still_an_error_not_damage(ckpts, tmp_path) -> None:
    other = AdaptiveCheckpointer(
        ckpts, job="resume", socket=f"ipc://{tmp_path}/none.sock", daemon_timeout=0.2,
        handle_sigterm=False, save_on_close=False, w=tf.Variable(tf.zeros([3])),
    )  # fmt: skip
    with pytest.raises(AssertionError):
        other.restore_or_initialize()
    assert other.resume.skipped == ()
    other.close()


def test_the_fallback_is_reported_to_the_daemon_in_hello(ckpts, tmp_path, ipc_endpoint) -> None:
    truncate(ckpts, 35)
    daemon = FakeDaemon(ipc_endpoint)
    try:
        ckptr = hook(ckpts, ipc_endpoint)
        daemon.wait_connected()  # the Hello leaves at once from restore_or_initialize()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            start = ckptr.restore_or_initialize()
        hello = daemon.wait_for(protocol.Hello)
        assert start == 28 and hello.resumed_from == 28
        assert "ckpt-35" in hello.restore_fallback and "truncated" in hello.restore_fallback
        ckptr.close()
    finally:
        daemon.close()


def test_a_skipped_damaged_checkpoint_is_moved_aside_and_retention_keeps_good_ones(
    ckpts: Path, tmp_path: Path, caplog
) -> None:
    """Issue 26: the damaged ckpt-35 stayed in the directory and in the state file, so
    the CheckpointManager counted it among the ``max_to_keep`` and deleted good ones
    before it. It is moved to ``damaged/`` (logged), out of the state file, and the
    next saves rotate only intact checkpoints."""
    truncate(ckpts, 35)
    socket = f"ipc://{tmp_path}/none.sock"
    with caplog.at_level("WARNING", logger="adaptd.client"):
        ckptr, start, _ = resume(ckpts, socket)
    try:
        assert start == 28
        assert not list(ckpts.glob("ckpt-35.*"))  # out of the directory...
        aside = sorted(p.name for p in (ckpts / "damaged").iterdir())
        assert aside == ["ckpt-35.data-00000-of-00001", "ckpt-35.index"]  # ...kept aside
        assert "ckpt-35" in caplog.text and "damaged" in caplog.text
        state = tf.train.get_checkpoint_state(str(ckpts))
        listed = [Path(p).name for p in state.all_model_checkpoint_paths]
        assert "ckpt-35" not in listed and Path(state.model_checkpoint_path).name == "ckpt-28"
        v = ckptr.checkpoint.v
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for _ in range(6):  # three steps a call: saves at 37 and 43, never 35 again
                v.assign_add(tf.ones([SIZE]))
                ckptr.step(3)
    finally:
        ckptr.close()
    kept = sorted(int(p.name[5:-6]) for p in ckpts.glob("ckpt-*.index"))
    assert kept == [28, 37, 43], kept  # the three newest intact ones (max_to_keep=3)
    again, start, texts = resume(ckpts, socket)
    again.close()
    assert start == 43 and texts == []
