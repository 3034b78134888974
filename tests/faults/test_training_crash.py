"""SIGKILL of the training process at 20 seeded points in one chain of resumes.

One real training job (tests/client/train_script.py: Keras model with Dropout, Adam,
a shuffled tf.data pipeline, a tf.random.Generator, 16 MB of extra state so that a
write lasts long enough to be hit) is killed with SIGKILL, resumed in a new process,
killed again, and so on, 20 times; the last resume runs to the end. Each kill point
is an event the job prints (a save requested, a write in flight, a save reported, a
step, the restore), chosen by a seeded RNG. Afterwards the final weights, optimizer
slots and RNG state must equal, byte for byte, those of one uninterrupted run, and no
leftover of a killed write may remain.

Each process is forked from a zygote that has TensorFlow imported (zygote.py), so a
resume costs about a second instead of a TensorFlow import.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from adaptd.client.save import files

from .conftest import TRAIN_SCRIPT, on_disk, state
from .zygote import Zygote

pytestmark = [pytest.mark.slow, pytest.mark.tf]

SEED = 20260601
KILLS = 20
STEPS = 200
EVERY = 5
DEADLINE = 60.0
#: event -> (weight in the schedule, most occurrences to let pass before the kill)
EVENTS = {
    "requested": (5, 1),  # right after the step that started a save
    "inflight": (4, 4),  # while a save is in flight (copied, queued or being written)
    "write": (5, 0),  # while TensorFlow writes the files: ckpt-N_temp/ exists
    "saved": (2, 1),  # right after a save was reported complete
    "step": (2, 9),  # anywhere
    "start": (2, 0),  # right after the restore, before the first step
}


@dataclass(frozen=True)
class Kill:
    event: str
    nth: int  # kill at the (nth + 1)-th line of this event in the process's output


def schedule(seed: int = SEED, n: int = KILLS) -> list[Kill]:
    rng = random.Random(seed)
    kinds = list(EVENTS)
    weights = [EVENTS[k][0] for k in kinds]
    out = []
    for _ in range(n):
        kind = rng.choices(kinds, weights)[0]
        out.append(Kill(kind, rng.randint(0, EVENTS[kind][1])))
    return out


def wait_write(child, ckpt: Path) -> str:
    """Poll (with a deadline) until a write's ``ckpt-N_temp`` folder exists: the files
    are being written right now (for 50-100 ms of a save's life here)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(ckpt):
                if entry.name.endswith("_temp"):
                    return entry.name
        if child.poll() is not None:
            break
        time.sleep(0.0005)  # the poll period, not a wait for the write
    raise AssertionError(f"no write began; the job said {child.log.lines[-5:]}")


def wait_nth(child, prefix: str, nth: int) -> str:
    """The (nth + 1)-th output line starting with ``prefix``."""
    after = 0
    for _ in range(nth + 1):
        line = child.log.wait_for(prefix, timeout=DEADLINE, after=after)
        after = child.log.lines.index(line, after) + 1
    return line


def test_sigkill_at_20_seeded_points_then_resume_is_bit_identical(
    zygote: Zygote, tmp_path: Path
) -> None:
    args = ["--steps", str(STEPS), "--policy", f"fixed:steps={EVERY}",
            "--socket", f"ipc://{tmp_path}/none"]  # fmt: skip
    ref_out = tmp_path / "ref.bin"
    ref = zygote.spawn([tmp_path / "ref", ref_out, *args], script=TRAIN_SCRIPT)

    ckpt, out = tmp_path / "ckpt", tmp_path / "resumed.bin"
    job = [ckpt, out, *args, "--pad-mb", "16"]
    outcomes: list[str] = []
    reported = 0  # the newest save any process reported complete
    prev_latest = None
    for i, kill in enumerate(schedule()):
        child = zygote.spawn(job, script=TRAIN_SCRIPT)
        if kill.event == "write":
            line = wait_write(child, ckpt)
        else:
            line = wait_nth(child, f"{kill.event} ", kill.nth)
        child.kill()
        assert child.wait() == -signal.SIGKILL, f"kill {i} at {line!r}: the job had ended"
        lines = child.log.lines
        # it resumed from the newest checkpoint the state file named before it started,
        # and said so once (client/restore/notes.py)
        assert lines[0] == f"start {prev_latest or 0}", (i, lines[:3])
        said = (
            f"adaptd: resumed from step {prev_latest} (ckpt-{prev_latest}, "
            if prev_latest
            else f"adaptd: starting at step 0: no checkpoint to resume from in {ckpt}"
        )
        resume = [n for n in child.log.notes if n.startswith(("adaptd: resumed", "adaptd: start"))]
        assert len(resume) == 1 and resume[0].startswith(said), child.log.notes
        latest, listed = state(ckpt)
        saved = [int(m.group(1)) for ln in lines if (m := re.fullmatch(r"saved (\d+) ok=True", ln))]
        reported = max([reported, *saved])
        requested = [int(m.group(1)) for ln in lines if (m := re.fullmatch(r"requested (\d+)", ln))]
        # a save reported complete is never lost; a killed write never becomes latest
        assert (latest or 0) >= reported, (i, latest, reported)
        assert latest is None or (ckpt / f"ckpt-{latest}.index").exists()
        leftovers = files.orphans(ckpt)
        stray = on_disk(ckpt) - listed
        # leftovers belong to the one write this kill interrupted: they never pile up
        steps_left = {
            int(m.group(1)) for p in leftovers if (m := re.match(r"ckpt-(\d+)_temp", p.name))
        }
        assert len(steps_left | stray) <= 1, (i, leftovers, stray)
        in_flight = bool(requested) and (latest or 0) < requested[-1]
        outcomes.append(
            f"{kill.event}#{kill.nth} at {line!r}: latest {latest}, "
            f"{'save in flight' if in_flight else 'no save in flight'}"
            f"{', leftovers ' + str([p.name for p in leftovers]) if leftovers else ''}"
            f"{', stray ' + str(sorted(stray)) if stray else ''}"
        )
        prev_latest = latest

    last = zygote.spawn(job, script=TRAIN_SCRIPT)
    assert last.wait(DEADLINE * 3) == 0, last.log.text()[-2000:]
    assert last.log.lines[0] == f"start {prev_latest or 0}"
    assert ref.wait(DEADLINE * 3) == 0, ref.log.text()[-2000:]
    assert out.read_bytes() == ref_out.read_bytes(), "\n".join(outcomes)

    # nothing of a killed write remains, and every checkpoint file on disk is listed
    latest, listed = state(ckpt)
    assert latest == STEPS
    assert files.orphans(ckpt) == []
    assert on_disk(ckpt) == listed, sorted(on_disk(ckpt) - listed)
    # the schedule really hit saves in flight (the point of the exercise)
    hit = sum("no save in flight" not in o for o in outcomes)
    mid = sum("leftovers" in o for o in outcomes)
    print("\n".join(outcomes), f"\n{hit}/{KILLS} kills with a save in flight, {mid} mid-write")
    assert hit >= 4 and mid >= 1, "\n".join(outcomes)


def test_a_saved_iterator_is_its_state_at_the_save_call_not_when_written() -> None:
    """The finding above, deterministic: a save requested one step before an epoch
    boundary and written after the loop crossed it. The checkpoint must hold the
    iterator as it was at the save call; TF's own host copy (a second iterator that
    shares the shuffle seed generator) held the next epoch's seed."""
    tf = pytest.importorskip("tensorflow")
    import numpy as np

    from adaptd.client.save import async_fixes

    def dataset():
        x = np.arange(64, dtype="float32")  # 4 batches per epoch
        return (
            tf.data.Dataset.from_tensor_slices(x)
            .shuffle(64, seed=5, reshuffle_each_iteration=True)
            .repeat()
            .batch(16)
        )

    def batches(state, n: int = 8) -> list[list[float]]:
        other = iter(dataset())  # its own dataset: its own seed generator
        other._restore_from_tensors(state)
        return [next(other).numpy().tolist() for _ in range(n)]

    it = iter(dataset())
    assert async_fixes.fix_async_copies([it]) == 1
    object_map: dict = {}
    copy = tf.function(lambda: it._copy_trackable_to_cpu(object_map))  # as TF's _copy_to_cpu
    for save in range(2):  # the first save copies eagerly, later ones in a tf.function
        for _ in range(3):
            next(it)  # one batch before the epoch boundary
        if save == 0:
            it._copy_trackable_to_cpu(object_map)
        else:
            copy()
        after_save = [next(it).numpy().tolist() for _ in range(8)]  # crosses the boundary
        written = object_map[it]._serialize_to_tensors()  # what the async thread writes
        assert batches(written) == after_save, f"save {save}"
