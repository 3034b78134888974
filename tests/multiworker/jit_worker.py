"""One worker of the just-in-time tests (tests/multiworker/test_just_in_time.py) and of
benchmarks/jit_failures.py: a real ``MultiWorkerMirroredStrategy`` job, each rank its
own shard of a shuffled pipeline, Adam, a save every ``EVERY`` steps, trained through
``AdaptiveCheckpointer``; it writes what it ended with to ``$RESULT`` as JSON.

Environment: ``CKPT``, ``STEPS``, ``EVERY``; ``FORM`` = ``with`` (the hook's ``with``
block sees the error) or ``explicit`` (the loop catches it and calls
``save_on_peer_failure``); ``KILL_RANK``/``KILL_AT``: that rank SIGKILLs itself once
step ``KILL_AT`` is done (``KILL_IN_WRITE=1``: at the first save call at or after it,
while its write is in flight; ``KILL_BEFORE_HOOK=1``: after step ``KILL_AT``'s training
and before its ``hook.step()``, so a save due there never starts; ``KILL_MARK``: a file
it first writes the step it completed to); ``STOP_RANK``/``STOP_AT``: it SIGSTOPs itself there
(``STOP_BEFORE_HOOK=1``: after the step's training, before its ``hook.step()``, so the
others' save there posts to a chief that never got to it);
``SLOW_RANK``/``SLOW_AT``/``SLOW_S``: it sleeps ``SLOW_S`` seconds before that step
(``HANG_MARK``: a file it first writes the step it completed and the time to, as a
stopping rank does);
``RAISE_RANK``/``RAISE_AT``: it raises ``ValueError`` in that step;
``EVAL_EVERY``/``EVAL_S``: every rank sleeps ``EVAL_S`` before each ``EVAL_EVERY``-th
step (an evaluation), ``FIRST_S``: before its first step (a slow first step);
``COLLECTIVE_TIMEOUT``: the hook's ``collective_timeout``; ``SOCKETS``: one daemon
endpoint per rank, comma-separated (each rank on its own "host"); ``SOCKET``: a daemon's
socket (default: none there); ``STALL_FLOOR``/``STALL_CAP``: the hook's
``stall_floor``/``stall_cap`` (hang detection, tests/multiworker/test_hang.py).

Result: the digests of the weights, the optimizer's variables, the hook's step and the
rank's next three batches; the step resumed from; the just-in-time outcome (None: no
peer failure reached the hook); the error that ended the run and when it was raised,
seconds after the last completed step.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

import tensorflow as tf
from rank_worker import mirrored_train  # this script's folder is on the path

from adaptd.client import AdaptiveCheckpointer
from adaptd.client.agreement import ranks

STEPS = int(os.environ.get("STEPS", "16"))
EVERY = int(os.environ.get("EVERY", "5"))
BATCH = 16
SEED = 5


def env_int(name: str) -> int:
    return int(os.environ.get(name, "-1"))


def digest(values: Any) -> str:
    h = hashlib.sha256()
    for v in values:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def rows(world: int, rank: int) -> tf.data.Dataset:
    def row(k: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = tf.random.stateless_normal([8], seed=tf.stack([k, tf.constant(3, tf.int64)]))
        return x, tf.reduce_sum(x, keepdims=True)

    ds = tf.data.Dataset.range(512).shard(world, rank).map(row)
    return ds.shuffle(256, seed=SEED, reshuffle_each_iteration=True).repeat().batch(BATCH)


def main() -> int:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank, world = ranks.resolve()
    with strategy.scope():
        tf.keras.utils.set_random_seed(SEED)
        model = tf.keras.Sequential(
            [tf.keras.Input((8,)), tf.keras.layers.Dense(16, "relu"), tf.keras.layers.Dense(1)]
        )
        opt = tf.keras.optimizers.Adam(0.01)
        opt.build(model.trainable_variables)
    it = iter(rows(world, rank))
    timeout = os.environ.get("COLLECTIVE_TIMEOUT")
    floor, cap = os.environ.get("STALL_FLOOR"), os.environ.get("STALL_CAP")
    hook = AdaptiveCheckpointer(
        os.environ["CKPT"], job="jit", policy=f"fixed:steps={EVERY}", max_to_keep=3,
        socket=os.environ["SOCKETS"].split(",")[rank] if os.environ.get("SOCKETS")
        else os.environ.get("SOCKET", f"ipc://{os.environ['CKPT']}-none.sock"),
        daemon_timeout=0.5, stall_floor=float(floor) if floor else None,
        stall_cap=float(cap) if cap else None,
        handle_sigterm=False, save_on_close=False,
        collective_timeout=float(timeout) if timeout else None,
        model=model, optimizer=opt, data_iterator=it,
    )  # fmt: skip

    train = mirrored_train(strategy, model, opt)

    def me(name: str) -> bool:
        return rank == env_int(f"{name}_RANK")

    in_write = bool(os.environ.get("KILL_IN_WRITE"))
    before_hook = bool(os.environ.get("KILL_BEFORE_HOOK"))
    stop_before_hook = bool(os.environ.get("STOP_BEFORE_HOOK"))

    def die(step: int) -> None:
        if os.environ.get("KILL_MARK"):  # first the step it completed, then the kill
            with open(os.environ["KILL_MARK"], "w") as f:
                json.dump({"step": step}, f)
        os.kill(os.getpid(), signal.SIGKILL)

    def mark(step: int) -> None:
        """``$HANG_MARK``: when this rank hung (stopped or began to sleep) and the step it
        had completed, for the test or benchmark to read."""
        if os.environ.get("HANG_MARK"):
            with open(os.environ["HANG_MARK"], "w") as f:
                json.dump({"step": step, "at": time.time()}, f)

    result: dict[str, Any] = {
        "rank": rank, "error": None, "raised_after_s": None, "failed_after_s": None, "step_s": []
    }  # fmt: skip
    last = time.monotonic()

    def loop() -> None:
        try:
            steps()
        except Exception:
            # when the loop's own code raised (a collective's timeout, say), counted from
            # the end of the last step: ``failed_after_s`` adds the hook's exit (its
            # just-in-time save), which a loaded machine can make seconds longer
            result["raised_after_s"] = time.monotonic() - last
            raise

    def steps() -> None:
        nonlocal last
        start = hook.restore_or_initialize()
        result["resumed_from"] = start
        for step in range(start + 1, STEPS + 1):
            if step == start + 1 and os.environ.get("FIRST_S"):
                time.sleep(float(os.environ["FIRST_S"]))
            if env_int("EVAL_EVERY") > 0 and step % env_int("EVAL_EVERY") == 0:
                time.sleep(float(os.environ["EVAL_S"]))
            if me("SLOW") and step == env_int("SLOW_AT"):
                result["hung_at"] = time.time()
                mark(step - 1)
                time.sleep(float(os.environ["SLOW_S"]))
            x, y = next(it)
            if me("RAISE") and step == env_int("RAISE_AT"):
                raise ValueError(f"rank {rank} fails at step {step} by itself")
            train(x, y)
            if me("KILL") and step == env_int("KILL_AT") and before_hook:
                die(step)  # its step done, its hook not told: a save due here never starts
            if me("STOP") and step == env_int("STOP_AT") and stop_before_hook:
                mark(step)
                os.kill(os.getpid(), signal.SIGSTOP)
            hook.step()
            result["step_s"].append(time.monotonic() - last)
            last = time.monotonic()
            if me("KILL") and step >= env_int("KILL_AT") and (not in_write or hook.save_in_flight):
                die(step)
            if me("STOP") and step == env_int("STOP_AT") and not stop_before_hook:
                mark(step)
                os.kill(os.getpid(), signal.SIGSTOP)

    try:
        if os.environ.get("FORM", "with") == "with":
            with hook:
                loop()
        else:
            try:
                loop()
            except Exception as exc:
                hook.save_on_peer_failure(exc)  # None: not a peer's failure, nothing done
                raise
            hook.close()
    except Exception as exc:
        result["error"] = type(exc).__name__
        result["message"] = str(exc)[:2000]
        result["failed_after_s"] = time.monotonic() - last
    jit = hook.just_in_time
    result["jit"] = None if jit is None else {
        "step": jit.step, "saved": jit.saved, "reason": jit.reason, "seconds": jit.seconds,
    }  # fmt: skip
    result["history"] = [(r.step, r.reason, r.ok) for r in hook.history]
    abort = hook.aborted
    result["aborted"] = abort and {"reason": abort.reason, "culprit": abort.culprit}
    result["ended_at"] = time.time()  # the JIT save (if any) was durable before this
    if result["error"] is None:
        nxt = [t for _ in range(3) for t in next(it)]
        result.update(
            weights=digest(model.weights), optimizer=digest(opt.variables),
            step=hook.step_count, next_batches=digest(nxt),
        )  # fmt: skip
    with open(os.environ["RESULT"], "w") as f:
        json.dump(result, f)
    return 3 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
