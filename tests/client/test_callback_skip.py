"""What other Keras callbacks see when ``fit`` resumes inside an epoch (real Keras 3).

``fit`` cannot start an epoch at a batch other than 0, so the resumed epoch passes
through every batch index, as a ``BackupAndRestore`` run does; the batches trained
before the interruption are not trained again and reach the callbacks with empty
logs. This pins that sequence (documented in client/callback.py and docs/client.md).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from adaptd.client import AdaptiveCheckpointCallback  # noqa: E402

pytestmark = pytest.mark.tf

STEPS = 10  # batches per epoch: 80 rows, batch 8


class Recorder(keras.callbacks.Callback):
    """Every epoch and batch call, with whether the batch's logs were empty."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_begin(self, batch, logs=None):
        self.calls.append(("begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("end", batch, "loss" in (logs or {}), bool(logs)))

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(("epoch_end", epoch, "loss" in (logs or {})))


def fit(tmp_path, epochs: int, first: Recorder, last: Recorder):
    x = np.random.default_rng(3).normal(size=(80, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(1e-2), loss="mse")
    cb = AdaptiveCheckpointCallback(
        tmp_path / "ck", job="skip", policy="fixed:steps=7", socket=f"ipc://{tmp_path}/none",
        save_on_end=False, handle_sigterm=False, daemon_timeout=0.2,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no daemon: the fallback warning
        history = model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False,
                            callbacks=[first, cb, last])  # fmt: skip
    return model, cb, history


def test_after_a_resume_other_callbacks_see_every_batch_index_the_skipped_ones_with_empty_logs(
    tmp_path,
) -> None:
    _, cb1, _ = fit(tmp_path, 2, Recorder(), Recorder())  # saves at steps 7 and 14
    assert [r.step for r in cb1.checkpointer.history] == [7, 14]
    assert cb1.resume_epoch is None and cb1.resume_batch == 0  # a fresh start
    before, after = Recorder(), Recorder()  # listed before and after the adaptd callback
    model, cb, history = fit(tmp_path, 3, before, after)
    assert (cb.resumed_from, cb.resume_epoch, cb.resume_batch) == (14, 1, 4)
    expected = [("epoch_begin", 1)]
    for i in range(STEPS):
        trained = i >= 4  # batches 0-3 of epoch 1 were trained before the interruption
        expected += [("begin", i), ("end", i, trained, trained)]
    expected += [("epoch_end", 1, True), ("epoch_begin", 2)]
    for i in range(STEPS):
        expected += [("begin", i), ("end", i, True, True)]
    expected.append(("epoch_end", 2, True))
    assert before.calls == expected
    assert after.calls == expected  # the order in the list does not matter
    ends = [c for c in after.calls if c[0] == "end"]
    assert len(ends) == 20 and sum(c[2] for c in ends) == 16  # 16 batches trained
    assert int(model.optimizer.iterations.numpy()) == 30 == cb.checkpointer.step_count
    assert cb.skipped_batches == 4
    assert len(history.history["loss"]) == 2  # epochs 1 and 2, as BackupAndRestore's
