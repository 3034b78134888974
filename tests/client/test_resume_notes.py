"""What a run says about its resume, and the loop that forgets to ask for one.

Every run says once where it continues from (step, checkpoint, how long, which tier)
or that there was nothing to resume from: on stderr when the program has not set up
logging (Python's default shows warnings only), on the ``adaptd.client`` logger when
it logs at INFO, never both. ``step()`` or ``save()`` before
``restore_or_initialize()`` raises instead of training from step 0 over the newest
checkpoints. Real TensorFlow in this process, a one-variable state.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client import AdaptiveCheckpointer  # noqa: E402
from adaptd.client.restore import intact  # noqa: E402
from adaptd.client.restore import notes as resume_notes  # noqa: E402
from adaptd.tiers.replica import Replica  # noqa: E402

pytestmark = pytest.mark.tf

JOB = "notes"


def hook(directory: Path, v, **kw) -> AdaptiveCheckpointer:
    return AdaptiveCheckpointer(
        directory, job=JOB, policy="fixed:steps=1000", socket=f"ipc://{directory.parent}/none",
        daemon_timeout=0.2, handle_sigterm=False, v=v, **kw,
    )  # fmt: skip


def run(directory: Path, steps: int, **kw) -> int:
    """A run of ``steps`` steps (saved at close); returns the step it started from."""
    v = tf.Variable(0.0)
    with hook(directory, v, **kw) as ckptr:
        start = ckptr.restore_or_initialize()
        for _ in range(steps):
            v.assign_add(1.0)
            ckptr.step()
    return start


def said(capsys) -> list[str]:
    """The lines the hook put on stderr (TensorFlow's own go to fd 2, not here)."""
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("adaptd: ")]


SECONDS = r"\d+(\.\d+)? s"


def test_a_fresh_run_and_a_resumed_one_say_so_once_on_stderr(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(Path("ck"), 7) == 0  # a relative directory is shown absolute
    d = tmp_path / "ck"
    assert said(capsys) == [
        f"adaptd: starting at step 0: no checkpoint to resume from in {d}",
    ]
    assert run(Path("ck"), 3) == 7
    (line,) = said(capsys)
    assert re.fullmatch(
        rf"adaptd: resumed from step 7 \(ckpt-7, {SECONDS}, durable tier: {re.escape(str(d))}\)",
        line,
    ), line


def test_with_logging_at_info_the_line_is_a_log_record_not_a_print(
    tmp_path, capsys, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="adaptd.client")
    d = tmp_path / "ck"
    run(d, 2)
    run(d, 1)
    assert said(capsys) == []
    notes = [r.getMessage() for r in caplog.records if r.pathname == resume_notes.__file__]
    assert notes[0] == f"starting at step 0: no checkpoint to resume from in {d}"
    assert notes[1].startswith("resumed from step 2 (ckpt-2, ") and len(notes) == 2


def test_restore_from_names_the_destination_then_the_local_staging(tmp_path, capsys) -> None:
    first = tmp_path / "host1"
    run(first, 10)
    dest = tmp_path / "dest"
    Replica(str(dest / JOB)).upload(first, 10, JOB)
    new = tmp_path / "host2" / "ck"
    url = str(dest / "{job}")
    capsys.readouterr()
    assert run(new, 2, restore_from=url) == 10  # empty: pulled from the destination
    (line,) = said(capsys)
    assert re.fullmatch(
        rf"adaptd: resumed from step 10 \(ckpt-10, {SECONDS}, restore_from destination tier: "
        rf"{re.escape(str(dest / JOB))}\)",
        line,
    ), line
    assert run(new, 1, restore_from=url) == 12  # its own newer checkpoint: not pulled
    (line,) = said(capsys)
    assert line.startswith("adaptd: resumed from step 12 (ckpt-12, ")
    assert line.endswith(f", local staging tier: {new})")
    # a destination with nothing in it: a fresh start, and why
    empty = tmp_path / "empty"
    fresh = tmp_path / "host3" / "ck"
    run(fresh, 1, restore_from=str(empty / "{job}"))
    (line,) = said(capsys)
    assert line.startswith(
        f"adaptd: starting at step 0: no checkpoint to resume from in {fresh} "
        f"nor at {empty / JOB} ("
    ), line


MESSAGE = (
    "{call} before restore_or_initialize(): call ckptr.restore_or_initialize() once before "
    "the training loop and start the loop at the step it returns (it restores the newest "
    "checkpoint in {d}, or returns 0 when there is none); without it the run would train "
    "from step 0 and save over the newest checkpoints"
)


def test_step_or_save_before_restore_raises_naming_the_call_to_make(tmp_path, capsys) -> None:
    d = tmp_path / "ck"
    run(d, 5)  # a checkpoint a forgetful script would save over
    v = tf.Variable(0.0)
    ckptr = hook(d, v)
    try:
        with pytest.raises(RuntimeError) as exc:
            ckptr.step()
        assert str(exc.value) == MESSAGE.format(call="step()", d=d)
        with pytest.raises(RuntimeError) as exc:
            ckptr.step()  # every time, not only the first
        with pytest.raises(RuntimeError) as exc:
            ckptr.save()
        assert str(exc.value) == MESSAGE.format(call="save()", d=d)
        assert ckptr.restore_or_initialize() == 5  # nothing was started or saved meanwhile
        assert float(v.numpy()) == 5.0
        ckptr.step()
        assert ckptr.step_count == 6
    finally:
        ckptr.close()
    assert [r.step for r in ckptr.history] == [6]


def test_the_agreed_resume_names_the_rank_and_the_agreement() -> None:
    line = resume_notes.resumed(
        rank=1, world_size=2, step=160, checkpoint="/c/ckpt-160", seconds=0.25,
        tier=resume_notes.tier("s3://b/j", pulled=True), where="s3://b/j", agreed=True,
    )  # fmt: skip
    assert line == (
        "rank 1/2 resumed from step 160 (ckpt-160, 0.25 s, restore_from destination tier: "
        "s3://b/j); the step the job's 2 ranks agreed on"
    )
    assert resume_notes.fresh(rank=0, world_size=3, directory="/c") == (
        "rank 0/3 starting at step 0: no checkpoint to resume from in /c"
    )
    assert resume_notes.tier(None, pulled=False) == "durable"
    assert resume_notes.tier("/nfs/j", pulled=False) == "local staging"


def test_a_logger_at_info_with_nowhere_to_write_still_shows_the_line(monkeypatch, capsys) -> None:
    """``adaptd.client`` set to INFO without a handler anywhere: logging would hand the
    record to its last resort, which shows warnings only; the line goes to stderr."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # pytest's own, for this test
    client_log = logging.getLogger("adaptd.client")
    level = client_log.level
    client_log.setLevel(logging.INFO)  # (setLevel: the logger caches isEnabledFor)
    try:
        resume_notes.say("resumed from step 3")
    finally:
        client_log.setLevel(level)
    assert said(capsys) == ["adaptd: resumed from step 3"]


class _AgreedRestore:
    """The part of :class:`~adaptd.client.restore.job_restore.JobRestore` that ``restore_agreed``
    uses, with the agreement's outcome given (the agreement itself is tested on real
    workers in tests/multiworker/test_restore_agreement.py)."""

    def __init__(self, directory: Path, choice, restore_from: str | None) -> None:
        self.directory, self.choice, self.restore_from = directory, choice, restore_from
        self.rank, self.world_size = 1, 2
        self.confirmed: list[int] = []
        self.offerable = intact.Resume(None)  # nothing skipped

    def agree(self):
        return self.choice

    def fetch(self, choice) -> float:
        return 0.0

    def confirm(self, step: int, error: str = "") -> None:
        self.confirmed.append(step)


class _Part:
    """This rank's own part (client/rank_state.RankPart): which step it restored."""

    def __init__(self) -> None:
        self.restored: list[int] = []
        self.directory, self.rank, self.world_size = "/nonexistent", 1, 2  # no replay note

    def restore(self, step: int) -> None:
        self.restored.append(step)


class _State:
    def __init__(self) -> None:
        self.restored: list[str] = []

    def restore(self, prefix: str) -> None:
        self.restored.append(prefix)


def test_an_agreed_resume_says_the_rank_the_tier_and_the_agreement(tmp_path, capsys) -> None:
    from adaptd.client.restore.resume import restore_agreed
    from adaptd.core.agreement import RestoreChoice

    d = tmp_path / "rank1"
    pulled = RestoreChoice(step=40, source={0: "local", 1: "pull"})
    state, part = _State(), _Part()
    done = restore_agreed(_AgreedRestore(d, pulled, "s3://b/j"), state, part, tidy=False)
    assert done.start == 40 and state.restored == [f"{d}/ckpt-40"] and part.restored == [40]
    (line,) = said(capsys)
    assert re.fullmatch(
        rf"adaptd: rank 1/2 resumed from step 40 \(ckpt-40, {SECONDS}, restore_from "
        r"destination tier: s3://b/j\); the step the job's 2 ranks agreed on",
        line,
    ), line
    local = RestoreChoice(step=40, source={0: "local", 1: "local"})
    restore_agreed(_AgreedRestore(d, local, None), _State(), _Part(), tidy=False)
    assert said(capsys)[0].endswith(f"durable tier: {d}); the step the job's 2 ranks agreed on")
    nothing = _AgreedRestore(d, RestoreChoice(step=None), None)
    assert restore_agreed(nothing, _State(), _Part(), tidy=False).start == 0
    assert nothing.confirmed == [0]
    assert said(capsys) == [
        f"adaptd: rank 1/2 starting at step 0: no checkpoint to resume from in {d}"
    ]
