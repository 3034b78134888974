"""The training job that ``adaptd demo`` runs (and kills, and resumes).

A small but real Keras 3 model — Dense layers with Dropout, Adam, a shuffled
``tf.data`` pipeline with a ``tf.random.Generator`` adding input noise — trained
with a custom loop and the adaptd hook. It prints one JSON object per line on
stdout (``start``, ``progress``, ``plan``, ``save``, ``done``) for the demo to
render; logs go to stderr.

Run by hand::

    python -m adaptd.client.demo_job --dir /tmp/ck --steps 500 --policy fixed:steps=100
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = [
    "build",
    "main",
]

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _emit_save(r) -> None:
    _emit(
        event="save", step=r.step, ok=r.ok, blocking_s=r.blocking_s, durable_s=r.durable_s,
        extra_step_s=r.extra_step_s, bytes=r.bytes, error=r.error,
    )  # fmt: skip


def build(seed: int, batch: int = 256, features: int = 128, width: int = 512):
    """Model, optimizer, data iterator and generator; deterministic for a seed."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    rng = tf.random.Generator.from_seed(seed)
    x = tf.random.stateless_normal([8192, features], seed=[seed, 1])
    w_true = tf.random.stateless_normal([features, 1], seed=[seed, 2])
    y = tf.cast(tf.matmul(x, w_true) + 0.1 * tf.sin(x[:, :1] * 3.0) > 0.0, tf.float32)
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(8192, seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch, drop_remainder=True)
    )
    iterator = iter(data)
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dropout(0.2, seed=seed),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dropout(0.2, seed=seed + 1),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def train_step(inputs):
        xb, yb = inputs
        xb = xb + 0.01 * rng.normal(tf.shape(xb))
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return model, optimizer, iterator, rng, train_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="checkpoint directory")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--socket", default=None, help="daemon socket (default: adaptd's)")
    parser.add_argument("--policy", default=None, help="policy spec (default: the daemon's)")
    parser.add_argument("--job", default="demo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=10, help="progress event every N steps")
    args = parser.parse_args(argv)

    from adaptd.client import AdaptiveCheckpointer

    model, optimizer, iterator, rng, train_step = build(args.seed)
    ckptr = AdaptiveCheckpointer(
        args.dir,
        job=args.job,
        max_to_keep=3,
        policy=args.policy,
        socket=args.socket,
        model=model,
        optimizer=optimizer,
        data_iterator=iterator,
        rng=rng,
    )
    start = ckptr.restore_or_initialize()
    _emit(event="start", step=start, pid=os.getpid())
    seen_saves = 0
    plan_key = None
    t0 = time.perf_counter()
    loss = None
    with ckptr:
        for step in range(start, args.steps):
            loss = train_step(next(iterator))
            ckptr.step()
            n = step + 1
            if n % args.every == 0 or n == args.steps:
                due = ckptr.next_save
                key = (ckptr.mode, due.reason if due else None)
                if key != plan_key:
                    plan_key = key
                    _emit(
                        event="plan",
                        step=n,
                        mode=ckptr.mode,
                        next_step=due.step if due else None,
                        reason=due.reason if due else "no save planned",
                    )
                for r in ckptr.history[seen_saves:]:
                    _emit_save(r)
                seen_saves = len(ckptr.history)
                _emit(event="progress", step=n, loss=float(loss))
    # close() (by the with block) waited for the last save: report it too
    for r in ckptr.history[seen_saves:]:
        _emit_save(r)
    elapsed = time.perf_counter() - t0
    done = args.steps - start
    _emit(
        event="done",
        step=args.steps,
        loss=float(loss) if loss is not None else None,
        step_time_s=elapsed / done if done else None,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
