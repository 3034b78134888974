"""A resumed ``model.fit`` ends bit for bit where an uninterrupted one ends.

The model (tests/client/fit_script.py) draws randomness from a ``Dropout`` and a
``GaussianNoise`` layer (Keras ``SeedGenerator`` states, checkpointed by the hook
under ``adaptd_keras_seeds``) and a ``tf.random.Generator`` given as ``rng=``; the
input is shuffled. Each resume lands inside an epoch (a save every 7 steps, 10 batches
an epoch), so the callback's skip of the batches trained before is part of what is
compared. Final weights, optimizer variables and generator state are compared as
bytes.

Where ``fit`` itself cannot reproduce the order (``tf.data``'s default
``reshuffle_each_iteration=True``: a new process's dataset restarts its sequence of
epoch orders), the last test pins what differs (docs/client.md, "model.fit").
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from . import fit_script  # noqa: E402
from .test_resume import read_until  # noqa: E402  (one reader of a job's lines, with a deadline)

SCRIPT = Path(__file__).with_name("fit_script.py")

pytestmark = [pytest.mark.slow, pytest.mark.tf]


# ------------------------------------------------------------------ in-process


def cut_back_to(src: Path, dst: Path, step: int) -> None:
    """``dst``: the checkpoints of ``src`` as a run killed right after the save of
    ``step`` became durable leaves them (later checkpoints gone, the state file
    naming ``ckpt-<step>``)."""
    shutil.copytree(src, dst)
    kept = []
    for f in dst.iterdir():
        m = re.match(r"ckpt-(\d+)\.", f.name)
        if m and int(m.group(1)) > step:
            f.unlink()
        elif m and f.name.endswith(".index"):
            kept.append(int(m.group(1)))
    assert step in kept, f"no checkpoint of step {step} in {sorted(kept)}"
    lines = [f'model_checkpoint_path: "ckpt-{step}"']
    lines += [f'all_model_checkpoint_paths: "ckpt-{s}"' for s in sorted(kept)]
    (dst / "checkpoint").write_text("\n".join(lines) + "\n")


def resumed(tmp_path: Path, ref_dir: Path, kind: str, step: int):
    d = tmp_path / f"cut{step}"
    cut_back_to(ref_dir, d, step)
    return fit_script.run(d, kind)


def test_fit_resumed_inside_an_epoch_equals_an_uninterrupted_fit(tmp_path, capsys) -> None:
    """NumPy input shuffled by ``fit``: resume at step 14 (epoch 1, batch 4)."""
    ref, cb = fit_script.run(tmp_path / "ref", "arrays-shuffled")
    assert [r.step for r in cb.checkpointer.history] == [7, 14, 21, 28, 30]
    state, cb = resumed(tmp_path, tmp_path / "ref", "arrays-shuffled", 14)
    assert (cb.resumed_from, cb.resume_epoch, cb.resume_batch) == (14, 1, 4)
    assert cb.skipped_batches == 4
    assert len(state) == len(ref)
    assert state == ref


def test_tf_data_reshuffled_each_epoch_is_exact_only_within_the_first_epoch(tmp_path) -> None:
    """``reshuffle_each_iteration=True``: a resume inside epoch 0 is exact (the new
    process's dataset gives epoch 0's order, then epoch 1's ...); a resume in epoch 1
    trains epoch 1 in epoch 0's order, so the result differs. If this starts to
    hold, update docs/client.md ("model.fit")."""
    ref, _ = fit_script.run(tmp_path / "ref", "dataset-reshuffled")
    state, cb = resumed(tmp_path, tmp_path / "ref", "dataset-reshuffled", 7)
    assert (cb.resume_epoch, cb.resume_batch) == (0, 7)
    assert state == ref
    state, cb = resumed(tmp_path, tmp_path / "ref", "dataset-reshuffled", 14)
    assert (cb.resume_epoch, cb.resume_batch) == (1, 4)
    assert state != ref


# ------------------------------------------------------------------ subprocess


def start(ckpt: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("ADAPTD_SOCKET", None)
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(ckpt), str(out), "--input", "dataset", *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def test_fit_sigkilled_after_a_save_then_rerun_equals_an_uninterrupted_fit(tmp_path) -> None:
    """Shuffled ``tf.data`` input (one order every epoch): the job is SIGKILLed while
    it waits after the save of step 14, then the same script is run again. The
    uninterrupted run is this process's, made while the first job starts."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "resumed.bin"
    first = start(ckpt, out, "--hold-at", "14")
    try:
        expected, _ = fit_script.run(tmp_path / "ref", "dataset")
        lines = read_until(first, r"held 14 .*")
        assert lines[0] == "start 0 epoch None batch 0"
        assert "saved 7 ok=True" in lines
        first.send_signal(signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL
    finally:
        first.kill()
        first.wait(30)
    assert 'model_checkpoint_path: "ckpt-14"' in (ckpt / "checkpoint").read_text()

    again = start(ckpt, out)
    try:
        lines = read_until(again, "done")
        assert lines[0] == "start 14 epoch 1 batch 4"
        assert again.wait(60) == 0
    finally:
        again.kill()
        again.wait(30)
    assert out.read_bytes() == expected
