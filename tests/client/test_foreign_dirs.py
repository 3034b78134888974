"""Checkpoint directories written by other tools, and a ``checkpoint`` state file that
points outside its directory (issue 26): refused with a message naming the field and
the value, and nothing lost (no file in either directory changed).

Before the fix a state file naming ``/elsewhere/ckpt-9`` (or ``../other/ckpt-9``) was
followed: the run restored another run's checkpoint, and the CheckpointManager would
have deleted the checkpoints listed there when it rotated; and any file with
``_temp`` in its name (``notes_temp.txt``) was deleted as a leftover of a killed save.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client import (  # noqa: E402
    AdaptiveCheckpointer,
    ForeignStateFile,
    NoIntactCheckpoint,
)
from adaptd.client.restore import verify  # noqa: E402
from adaptd.client.save import files  # noqa: E402

pytestmark = pytest.mark.tf


def hook(d: Path, tmp: Path, value: float = 0.0, **kw) -> AdaptiveCheckpointer:
    return AdaptiveCheckpointer(
        d, job="foreign", policy="fixed:steps=5", socket=f"ipc://{tmp}/none.sock",
        daemon_timeout=0.2, handle_sigterm=False, save_on_close=False, max_to_keep=2,
        v=tf.Variable(value), **kw,
    )  # fmt: skip


def run(d: Path, tmp: Path, steps: int, value: float = 0.0) -> None:
    ckptr = hook(d, tmp, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ckptr.restore_or_initialize()
        for _ in range(steps):
            ckptr.step()
    ckptr.close()


def snapshot(*dirs: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns)
        for d in dirs
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("model_checkpoint_path", "{other}/ckpt-10"),
        ("model_checkpoint_path", "../other/ckpt-10"),
        ("all_model_checkpoint_paths", "../other/ckpt-5"),
    ],
    ids=["absolute-elsewhere", "dot-dot", "listed-elsewhere"],
)
def test_a_state_file_pointing_outside_is_refused_and_nothing_changes(
    tmp_path: Path, field: str, path: str
) -> None:
    other, mine = tmp_path / "other", tmp_path / "mine"
    run(other, tmp_path, 10, value=99.0)  # another run: ckpt-5, ckpt-10
    run(mine, tmp_path, 5)  # this run: ckpt-5
    named = path.format(other=other)
    state = mine / "checkpoint"
    lines = {"model_checkpoint_path": "ckpt-5", "all_model_checkpoint_paths": "ckpt-5"}
    lines[field] = named
    state.write_text("".join(f'{k}: "{v}"\n' for k, v in lines.items()))
    before = snapshot(other, mine)
    ckptr = hook(mine, tmp_path)
    with pytest.raises(ForeignStateFile) as info:
        ckptr.restore_or_initialize()
    ckptr.close()
    message = str(info.value)
    assert field in message and named in message and str(state) in message, message
    assert float(ckptr.checkpoint.v) == 0.0  # nothing restored from elsewhere
    assert snapshot(other, mine) == before  # nothing written, nothing deleted
    notes = verify.verify(mine).notes  # adaptd verify ignores it and says why
    assert any("outside the directory" in n for n in notes), notes


def test_files_of_other_tools_in_the_directory_are_left_alone(tmp_path: Path) -> None:
    d = tmp_path / "ckpts"
    d.mkdir()
    theirs = {
        "notes_temp.txt": b"a user's notes",  # '_temp' in the name: not ours
        "model.h5": b"\x89HDF\r\n",  # a Keras file
        "weights.ckpt": b"not a checkpoint",
        "README": b"kept",
    }
    for name, data in theirs.items():
        (d / name).write_bytes(data)
    (d / "orbax").mkdir()
    (d / "orbax" / "5_temp").mkdir()  # another tool's own folder
    run(d, tmp_path, 10)  # saves, rotates (max_to_keep=2)
    run(d, tmp_path, 5)  # resumes from the newest
    for name, data in theirs.items():
        assert (d / name).read_bytes() == data, name
    assert (d / "orbax" / "5_temp").is_dir()
    assert files.orphans(d) == []


def test_a_directory_of_another_tools_numbered_files_is_damage_not_a_crash(
    tmp_path: Path,
) -> None:
    """``ckpt-7.index`` that is not TensorFlow's (another tool's name clash): reported
    as damaged, with what is wrong, and left where it is."""
    d = tmp_path / "ckpts"
    d.mkdir()
    (d / "ckpt-7.index").write_bytes(b"an index of some other format")
    (d / "ckpt-7.data-00000-of-00001").write_bytes(os.urandom(64))
    before = snapshot(d)
    ckptr = hook(d, tmp_path)
    with pytest.raises(NoIntactCheckpoint) as info:
        ckptr.restore_or_initialize()
    ckptr.close()
    assert "ckpt-7" in str(info.value) and "1 found, all damaged" in str(info.value)
    assert snapshot(d) == before
