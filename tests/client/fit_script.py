"""A small, seeded ``model.fit`` job with the adaptd callback, for the Keras resume tests.

    python fit_script.py CKPT_DIR OUT_FILE --input KIND [--epochs E] [--hold-at N]

Also imported by tests/client/test_keras_resume_exact.py, which runs :func:`run`
in-process. The model draws randomness three ways: a ``Dropout`` and a
``GaussianNoise`` layer (Keras ``SeedGenerator``s) and a ``tf.random.Generator``
passed to the callback as ``rng=``. ``KIND`` is the input (see :data:`INPUTS`).
Prints ``start N epoch E batch B`` when ``fit`` begins (the step, epoch and batch it
resumed at), ``step N`` after each trained batch and ``saved N ok=...`` when a save report
arrives. ``--hold-at N``: after step N, waits until its save is durable, prints
``held N`` and blocks on stdin, so a test can SIGKILL it with that checkpoint the
newest. Writes the final weights, optimizer variables and generator state as raw
bytes to OUT_FILE, and prints ``done``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from adaptd.client import AdaptiveCheckpointCallback

ROWS, BATCH = 80, 8  # 10 batches per epoch
POLICY = "fixed:steps=7"  # saves at 7, 14, 21, ...: most inside an epoch

#: Inputs: how ``fit`` gets its batches.
INPUTS = (
    # NumPy arrays, fit(shuffle=True): with a global seed set Keras draws the same
    # permutation every epoch (each epoch's fresh iterator restarts its random op)
    "arrays-shuffled",
    "dataset",  # tf.data, shuffle(seed=, reshuffle_each_iteration=False): one order
    "dataset-reshuffled",  # tf.data, shuffle(seed=, reshuffle_each_iteration=True)
)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    return x, y


def _input(kind: str) -> dict[str, Any]:
    """``fit``'s input arguments for ``kind``."""
    x, y = _data()
    if kind == "arrays-shuffled":
        return {"x": x, "y": y, "batch_size": BATCH, "shuffle": True}
    if kind in ("dataset", "dataset-reshuffled"):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
            ROWS, seed=5, reshuffle_each_iteration=kind == "dataset-reshuffled"
        )
        return {"x": ds.batch(BATCH), "shuffle": False}  # a Dataset is shuffled by itself
    raise ValueError(f"input must be one of {INPUTS}, got {kind!r}")


class _GeneratorNoise(keras.layers.Layer):
    """Adds noise drawn from a ``tf.random.Generator`` the layer does not own (so the
    generator is checkpointed only because the callback is given it as ``rng=``)."""

    def __init__(self, draw: Any) -> None:
        super().__init__()
        self._draw = draw

    def call(self, x: Any, training: bool = False) -> Any:
        return x + self._draw(tf.shape(x)) if training else x


def build() -> tuple[keras.Model, tf.random.Generator]:
    keras.utils.set_random_seed(1234)
    gen = tf.random.Generator.from_seed(99)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            _GeneratorNoise(lambda shape: gen.normal(shape, stddev=0.05)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.GaussianNoise(0.05),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model, gen


def state_bytes(model: keras.Model, gen: tf.random.Generator) -> bytes:
    """Weights, optimizer variables (slots, iterations) and the generator's state."""
    arrays = [v.numpy() for v in model.weights]
    arrays += [v.numpy() for v in model.optimizer.variables]
    arrays.append(gen.state.numpy())
    return b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)


class _Hold(keras.callbacks.Callback):
    """After step ``at``: wait until that step's save is durable, say so, block."""

    def __init__(self, cb: AdaptiveCheckpointCallback, at: int) -> None:
        super().__init__()
        self._cb, self._at = cb, at

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        ckptr = self._cb.checkpointer
        if ckptr is None or ckptr.step_count != self._at:
            return
        deadline = time.monotonic() + 60
        while ckptr.save_in_flight or ckptr.latest_checkpoint is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the save of step {self._at} not durable within 60 s")
            time.sleep(0.01)
        print(f"held {self._at} {ckptr.latest_checkpoint}", flush=True)
        sys.stdin.readline()  # until the test kills us (or closes stdin)
        raise SystemExit("held: stdin closed")


class _Report(keras.callbacks.Callback):
    def __init__(self, cb: AdaptiveCheckpointCallback) -> None:
        super().__init__()
        self._cb, self._reported = cb, 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        cb = self._cb
        where = f"epoch {cb.resume_epoch} batch {cb.resume_batch}"
        print(f"start {cb.resumed_from} {where}", flush=True)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        ckptr = self._cb.checkpointer
        if not logs or ckptr is None:
            return  # a batch trained before the resume
        print(f"step {ckptr.step_count}", flush=True)
        while self._reported < len(ckptr.history):
            r = ckptr.history[self._reported]
            print(f"saved {r.step} ok={r.ok}", flush=True)
            self._reported += 1


def run(
    ckpt_dir: str | Path,
    kind: str,
    *,
    epochs: int = 3,
    hold_at: int | None = None,
    socket: str | None = None,
) -> tuple[bytes, AdaptiveCheckpointCallback]:
    """One ``fit`` with the callback (every checkpoint kept); ``hold_at``: see ``--hold-at``.
    Returns :func:`state_bytes` at the end and the callback."""
    model, gen = build()
    cb = AdaptiveCheckpointCallback(
        ckpt_dir,
        job="fit-exact",
        max_to_keep=None,
        policy=POLICY,
        socket=socket or f"ipc://{ckpt_dir}.nodaemon",
        handle_sigterm=False,
        daemon_timeout=0.2,
        rng=gen,
    )
    callbacks: list[keras.callbacks.Callback] = [cb, _Report(cb)]
    if hold_at is not None:
        callbacks.append(_Hold(cb, hold_at))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no daemon: the fallback warning
        model.fit(**_input(kind), epochs=epochs, verbose=0, callbacks=callbacks)
    return state_bytes(model, gen), cb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("ckpt_dir")
    p.add_argument("out")
    p.add_argument("--input", choices=INPUTS, required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hold-at", type=int, default=None)
    args = p.parse_args(argv)
    state, _ = run(args.ckpt_dir, args.input, epochs=args.epochs, hold_at=args.hold_at)
    Path(args.out).write_bytes(state)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
