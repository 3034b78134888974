"""A small, deterministic training job with the hook, run as a subprocess by the tests.

    python train_script.py CKPT_DIR OUT_FILE --steps N [--policy SPEC] [--socket EP]
                           [--pad-mb M] [--step-sleep S] [--timings FILE] [--stop-file F]

Prints ``step N`` after each step, ``requested N`` right after the step whose
boundary started a save, ``inflight N`` when a save's write is in flight right after
the step, ``start N`` after restoring, ``saved N ok=...`` when a save report arrives,
``mode daemon|embedded N`` when the plan's source changes, and writes the final
model, optimizer and RNG state as raw bytes to OUT_FILE. ``--timings FILE`` also
writes each step's wall time and the time spent in ``ckptr.step()`` (float64 pairs);
``--stop-file F`` ends the loop (``stopped N``) at the first step after F exists;
``--freeze-at-inflight N`` stops the whole process (SIGSTOP, every thread at once) right
after printing ``inflight N``, so that a test's SIGKILL finds that write unfinished
however late the test is scheduled;
``--local-tier DIR`` gives the hook a local tier (``saved N ok=True tier=local`` for a
save made there only, ``tier local`` after a restore from it).
Keras model with Dropout, Adam, a shuffled tf.data pipeline and a tf.random.Generator.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from adaptd.client import AdaptiveCheckpointer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("ckpt_dir")
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--policy", default="fixed:steps=5")
    p.add_argument("--socket", default=None)
    p.add_argument("--pad-mb", type=float, default=0.0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--job", default="train-script")
    p.add_argument("--max-to-keep", type=int, default=5, help="0: keep every checkpoint")
    p.add_argument("--timings", default=None)
    p.add_argument("--stop-file", default=None, help="end the loop once this file exists")
    p.add_argument(
        "--freeze-at-inflight", type=int, default=None, help="SIGSTOP itself at inflight N"
    )
    p.add_argument("--local-tier", default=None, help="the hook's local_tier (two tiers)")
    p.add_argument("--local-tier-memory", type=float, default=0.25)
    p.add_argument("--local-tier-disk", default=None)
    p.add_argument(
        "--writer-nice", default="auto", help="the hook's writer_nice: auto, 0-19, or none"
    )
    args = p.parse_args(argv)

    tf.config.experimental.enable_op_determinism()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras.utils.set_random_seed(1234)

    rng = np.random.default_rng(7)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(256, seed=5, reshuffle_each_iteration=True)
        .repeat()
        .batch(16)
    )
    it = iter(ds)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(1),
        ]
    )
    opt = keras.optimizers.Adam(1e-2)
    gen = tf.random.Generator.from_seed(99)
    extra = {}
    if args.pad_mb:
        # bulk state so that a write takes long enough to be killed mid-way
        n = int(args.pad_mb * 1e6 / 4)
        extra["pad"] = tf.Variable(tf.zeros([n], tf.float32), trainable=False)

    @tf.function
    def train_step(xb, yb):
        noise = gen.normal(tf.shape(xb), stddev=0.01)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb + noise, training=True) - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    nice = args.writer_nice
    writer_nice = None if nice == "none" else nice if nice == "auto" else int(nice)
    ckptr = AdaptiveCheckpointer(
        args.ckpt_dir,
        job=args.job,
        policy=args.policy,
        socket=args.socket,
        daemon_timeout=1.0,
        max_to_keep=args.max_to_keep or None,
        writer_nice=writer_nice,
        local_tier=args.local_tier,
        local_tier_memory=args.local_tier_memory,
        local_tier_disk=args.local_tier_disk,
        model=model,
        optimizer=opt,
        data_iterator=it,
        rng=gen,
        **extra,
    )
    start = ckptr.restore_or_initialize()
    print(f"start {start}", flush=True)
    if ckptr.resumed_tier:
        print(f"tier {ckptr.resumed_tier}", flush=True)
    reported = 0
    mode = None
    timings = []
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        xb, yb = next(it)
        train_step(xb, yb)
        if args.pad_mb and ckptr.save_in_flight:
            extra["pad"].assign_add(tf.ones_like(extra["pad"]))  # keep the pad moving
        due = ckptr.next_save
        t1 = time.perf_counter()
        ckptr.step()
        t2 = time.perf_counter()
        if due is not None and due.step == step + 1:
            print(f"requested {step + 1}", flush=True)
        print(f"step {step + 1}", flush=True)
        if ckptr.mode != mode:
            mode = ckptr.mode
            print(f"mode {mode} {step + 1}", flush=True)
        if ckptr.save_in_flight:
            print(f"inflight {step + 1}", flush=True)
            if args.freeze_at_inflight == step + 1:
                os.kill(os.getpid(), signal.SIGSTOP)  # the writer stops with the rest
        while reported < len(ckptr.history):
            r = ckptr.history[reported]
            tier = f" tier={r.tier}" if r.tier else ""
            print(f"saved {r.step} ok={r.ok}{tier}", flush=True)
            reported += 1
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.timings:
            timings.append((time.perf_counter() - t0, t2 - t1))
        if args.stop_file and os.path.exists(args.stop_file):
            print(f"stopped {step + 1}", flush=True)
            break
    ckptr.close()
    if args.timings:
        np.asarray(timings, dtype=np.float64).tofile(args.timings)
    state = [v.numpy() for v in model.weights] + [v.numpy() for v in opt.variables]
    state.append(gen.state.numpy())
    with open(args.out, "wb") as f:
        for a in state:
            f.write(np.ascontiguousarray(a).tobytes())
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
