"""``close()`` saves the last step of a run that advanced since its last save.

Issue 11: with the default policy the first save is planned 300 s after the start, so
a user's first 90-second trial of the README's loop left ``ckpts/`` empty. Real
TensorFlow, no daemon (the embedded policy), tiny state.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client import AdaptiveCheckpointer  # noqa: E402
from adaptd.client.checkpointer import FINAL_SAVE_REASON  # noqa: E402
from adaptd.client.save.saver import final_reason  # noqa: E402
from adaptd.client.save.sigterm import SIGTERM_REASON  # noqa: E402

pytestmark = pytest.mark.tf


def hook(tmp_path: Path, v, **kw) -> AdaptiveCheckpointer:
    kw.setdefault("policy", "default")
    return AdaptiveCheckpointer(
        tmp_path / "ckpts", job="trial", socket=f"ipc://{tmp_path}/none.sock",
        daemon_timeout=0.2, handle_sigterm=False, v=v, **kw,
    )  # fmt: skip


def train(ckptr: AdaptiveCheckpointer, v, steps: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "no daemon": expected here
        for _ in range(steps):
            v.assign_add(1.0)
            ckptr.step()


def saved_steps(tmp_path: Path) -> list[int]:
    return sorted(int(p.name[5:-6]) for p in (tmp_path / "ckpts").glob("ckpt-*.index"))


def test_a_short_first_run_under_the_default_policy_leaves_its_last_step(tmp_path) -> None:
    v = tf.Variable(0.0)
    ckptr = hook(tmp_path, v)
    assert ckptr.restore_or_initialize() == 0
    train(ckptr, v, 20)
    assert ckptr.history == []  # the default's first save is minutes away
    ckptr.close()
    assert [(r.step, r.reason, r.ok) for r in ckptr.history] == [(20, FINAL_SAVE_REASON, True)]
    assert saved_steps(tmp_path) == [20]
    # and the next run continues from it
    again = hook(tmp_path, tf.Variable(0.0))
    assert again.restore_or_initialize() == 20
    again.close()  # no step since the restore: nothing more to save
    assert again.history == [] and saved_steps(tmp_path) == [20]


def test_save_on_close_off_saves_nothing_more(tmp_path) -> None:
    v = tf.Variable(0.0)
    ckptr = hook(tmp_path, v, save_on_close=False)
    ckptr.restore_or_initialize()
    train(ckptr, v, 5)
    ckptr.close()
    assert ckptr.history == [] and saved_steps(tmp_path) == []


def test_a_step_already_saved_is_not_saved_again(tmp_path) -> None:
    v = tf.Variable(0.0)
    ckptr = hook(tmp_path, v, policy="fixed:steps=5")
    ckptr.restore_or_initialize()
    train(ckptr, v, 10)  # the plan saved 5 and 10
    ckptr.close()
    assert [r.step for r in ckptr.history] == [5, 10]


def test_leaving_a_with_block_on_an_exception_does_not_save_the_broken_step(tmp_path) -> None:
    v = tf.Variable(0.0)
    with pytest.raises(ZeroDivisionError), hook(tmp_path, v) as ckptr:
        ckptr.restore_or_initialize()
        train(ckptr, v, 7)
        1 / 0  # noqa: B018 - the training step that failed
    assert ckptr.history == [] and saved_steps(tmp_path) == []
    with hook(tmp_path, v) as ok:  # a clean exit saves
        ok.restore_or_initialize()
        train(ok, v, 3)
    assert [r.step for r in ok.history] == [3]


@pytest.mark.parametrize(
    ("step", "last", "signaled", "on_close", "reason"),
    [
        (20, None, False, True, FINAL_SAVE_REASON),  # advanced, never saved
        (20, 10, False, True, FINAL_SAVE_REASON),  # advanced since the last save
        (20, 20, False, True, None),  # already saved
        (0, None, False, True, None),  # a fresh run that took no step
        (20, 10, False, False, None),  # save_on_close=False
        (20, 10, True, False, SIGTERM_REASON),  # SIGTERM saves the interrupted step...
        (20, 20, True, True, None),  # ...unless it is saved
        (0, None, True, False, SIGTERM_REASON),  # even step 0 of a fresh run
    ],
)
def test_what_the_end_of_a_run_saves(step, last, signaled, on_close, reason) -> None:
    """The one rule for the end of a run (``save.saver.final_reason``): an exception
    saves nothing (the hook never asks), SIGTERM and a clean close save a step not saved."""
    assert final_reason(step, last, signaled=signaled, save_on_close=on_close) == reason
