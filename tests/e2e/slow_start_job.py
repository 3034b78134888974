"""A real TensorFlow custom loop whose first step is slow, as every real job's is.

    python slow_start_job.py CKPT_DIR SOCKET --first-step-s 3 --step-s 0.02 --run-s 10

The first step traces the ``tf.function`` and then waits ``--first-step-s`` more (an
XLA compile, stood in for by time); every later step trains and takes about
``--step-s``. After ``--run-s`` seconds of fast steps the loop ends and the hook is
closed. Prints one JSON line per save (``{"event": "save", "step", "t", "reason",
"ok"}``, ``t`` in seconds since the first fast step) and ``{"event": "done", ...}``
with the steps run and the mean fast step time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import tensorflow as tf

from adaptd.client import AdaptiveCheckpointer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("ckpt_dir")
    p.add_argument("socket")
    p.add_argument("--first-step-s", type=float, default=3.0)
    p.add_argument("--step-s", type=float, default=0.02)
    p.add_argument("--run-s", type=float, default=10.0)
    p.add_argument("--job", default="slow-start")
    args = p.parse_args(argv)

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32), keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(1e-3)
    x = tf.random.stateless_normal([16, 8], seed=[1, 2])
    y = tf.random.stateless_normal([16, 1], seed=[3, 4])

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    ckptr = AdaptiveCheckpointer(
        args.ckpt_dir, job=args.job, socket=args.socket, daemon_timeout=5.0,
        max_to_keep=None, model=model, optimizer=opt,
    )  # fmt: skip
    ckptr.restore_or_initialize()
    train_step()  # the first step: tracing...
    time.sleep(args.first_step_s)  # ...and the compile it stands for
    ckptr.step()
    t0 = time.perf_counter()
    steps = 0
    seen = 0
    while time.perf_counter() - t0 < args.run_s:
        s0 = time.perf_counter()
        train_step()
        left = args.step_s - (time.perf_counter() - s0)
        if left > 0:
            time.sleep(left)  # the rest of a 20 ms step's compute
        ckptr.step()
        steps += 1
        for r in ckptr.history[seen:]:
            print(json.dumps({"event": "save", "step": r.step, "reason": r.reason, "ok": r.ok,
                              "t": time.perf_counter() - t0}), flush=True)  # fmt: skip
        seen = len(ckptr.history)
    fast_s = time.perf_counter() - t0
    ckptr.close()
    for r in ckptr.history[seen:]:
        print(json.dumps({"event": "save", "step": r.step, "reason": r.reason, "ok": r.ok,
                          "t": time.perf_counter() - t0}), flush=True)  # fmt: skip
    print(json.dumps({"event": "done", "steps": steps + 1, "fast_s": fast_s,
                      "step_s": fast_s / max(1, steps)}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
