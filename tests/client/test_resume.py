"""Seamless resume across processes: SIGKILL at several steps (one during an async
write), SIGTERM preemption. Real TensorFlow in real subprocesses."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
import weakref
from pathlib import Path

import pytest
from faults.zygote import Child, Zygote

SCRIPT = Path(__file__).with_name("train_script.py")
pytestmark = [pytest.mark.slow, pytest.mark.tf]
# bytes read past a match of read_until, per process (a Child or a Popen)
_PENDING: weakref.WeakKeyDictionary[object, bytes] = weakref.WeakKeyDictionary()


def start(zygote: Zygote, ckpt: Path, out: Path, *extra: str) -> Child:
    """``python train_script.py CKPT OUT EXTRA...``, forked from the session's zygote
    (tests/faults/zygote.py: a job's results are a started job's); its stdout is read
    as a ``Popen``'s, its stderr discarded, ``$ADAPTD_SOCKET`` unset."""
    return zygote.spawn([ckpt, out, *extra], script=SCRIPT, stderr=False, reader=False)


def read_until(proc: Child | subprocess.Popen, pattern: str, timeout: float = 120.0) -> list[str]:
    """Lines of ``proc`` up to and including the first matching ``pattern``.

    Reads the pipe's bytes itself (``os.read``), not through the text stream: a line
    that the stream's buffer already held would wait for a ``select`` that no further
    output wakes (a job that stopped itself after printing it). What was read past the
    match is kept for the next call and for :func:`read_rest`."""
    fd = proc.stdout.fileno()
    buf = _PENDING.pop(proc, b"")
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            lines.append(raw.decode("utf-8", "replace").strip())
            if re.fullmatch(pattern, lines[-1]):
                _PENDING[proc] = buf
                return lines
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    proc.kill()
    proc.wait(30)
    raise AssertionError(f"{pattern!r} not seen; got {lines[-20:]}")


def read_rest(proc: Child | subprocess.Popen) -> str:
    """Everything ``proc`` printed after what :func:`read_until` returned, to EOF."""
    return _PENDING.pop(proc, b"").decode("utf-8", "replace") + proc.stdout.read()


def kill_at(zygote: Zygote, ckpt: Path, out: Path, pattern: str, *extra: str) -> list[str]:
    proc = start(zygote, ckpt, out, *extra)
    lines = read_until(proc, pattern)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    return lines


def latest_step(ckpt: Path) -> int | None:
    state = ckpt / "checkpoint"
    if not state.exists():
        return None
    m = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state.read_text(), re.M)
    return int(m.group(1)) if m else None


def test_resume_after_sigkill_is_bit_identical(tmp_path, zygote):
    steps = "40"
    common = ["--steps", steps, "--policy", "fixed:steps=5", "--socket", f"ipc://{tmp_path}/none"]
    ref_out = tmp_path / "ref.bin"
    ref = start(zygote, tmp_path / "ref", ref_out, *common)  # runs alongside the killed chain

    ckpt, out = tmp_path / "ckpt", tmp_path / "resumed.bin"
    pad = ["--pad-mb", "64"]  # a write takes long enough to be killed mid-way

    lines = kill_at(zygote, ckpt, out, r"saved 10 ok=True", *common, *pad)
    assert lines[0] == "start 0"
    first = latest_step(ckpt)
    assert first is not None and first >= 10

    # killed right after the save of step 25 returned: its write is in flight, and the
    # job stopped itself there (SIGSTOP), so the write cannot finish before the SIGKILL
    # however late this test reads the line (under load it once did: step 25 was latest)
    freeze = ["--freeze-at-inflight", "25"]
    lines = kill_at(zygote, ckpt, out, r"inflight 25", *common, *pad, *freeze)
    assert lines[0] == f"start {first}"
    second = latest_step(ckpt)
    assert second is not None and first <= second < 25, "a killed write must not become latest"
    leftovers = sorted(p.name for p in ckpt.iterdir() if "_temp" in p.name)

    lines = kill_at(zygote, ckpt, out, r"step 33", *common, *pad)
    assert lines[0] == f"start {second}"
    # leftovers of the killed write were removed at start
    assert not [p for p in ckpt.iterdir() if p.name in leftovers]
    third = latest_step(ckpt)

    last = start(zygote, ckpt, out, *common, *pad)
    rest = read_until(last, "done")
    assert rest[0] == f"start {third}"
    assert last.wait(60) == 0
    assert latest_step(ckpt) == 40

    read_until(ref, "done")
    assert ref.wait(60) == 0
    assert out.read_bytes() == ref_out.read_bytes()


def test_sigterm_saves_at_the_next_step_then_exits(tmp_path, zygote):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.bin"
    args = ["--steps", "100000", "--policy", "fixed:steps=100000", "--step-sleep", "0.01",
            "--socket", f"ipc://{tmp_path}/none"]  # fmt: skip
    proc = start(zygote, ckpt, out, *args)
    lines = read_until(proc, r"step 7")
    proc.send_signal(signal.SIGTERM)
    rest = read_rest(proc)
    assert proc.wait(60) == -signal.SIGTERM  # the signal took effect after the save
    steps = [int(m) for m in re.findall(r"^step (\d+)$", rest, re.M)] or [7]
    saved = latest_step(ckpt)
    # saved at the step boundary right after the signal, and nothing ran after it
    assert saved == steps[-1] + 1 or saved == steps[-1], (saved, steps)
    assert (ckpt / f"ckpt-{saved}.index").exists()
    assert lines[0] == "start 0"
    again = start(zygote, ckpt, out, "--steps", str(saved + 2), *args[2:4], *args[6:])
    resumed = read_until(again, "done")
    assert resumed[0] == f"start {saved}"
    assert again.wait(60) == 0
