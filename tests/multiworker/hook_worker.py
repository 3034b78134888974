"""One worker of tests/multiworker/test_hook.py: a real 2-worker
``MultiWorkerMirroredStrategy`` job trained with a custom loop through
``AdaptiveCheckpointer``, writing what it saw to ``$RESULT`` as JSON.

Environment: ``CKPT`` (the shared checkpoint directory), ``STEPS``, ``SEED``;
``PLAN_CHANGES=1``: the embedded policy changes its plan at random every
``decide_interval``; ``SIGTERM_AT``/``SIGKILL_AT`` with ``SIGNAL_RANK``: that rank
signals itself at that step; ``SOCKET``: the daemon's endpoint (default: none there),
``SOCKETS``: one endpoint per rank, comma-separated (each rank on its own "host");
``DAEMON_TIMEOUT``: the hook's (default 0.5 s); ``WIDTH``: the hidden layer's width
(the state's size); ``FREE=1``: steps without a collective (no weight update), so the
ranks run free of each other except for an all-reduce at each step ``k`` with ``k %
SYNC_EVERY == SYNC_AT``, each step taking at least ``STEP_S`` (its "compute");
``NO_STRATEGY=1``: independent processes of one job, no ``tf.distribute`` (TF_CONFIG
only names the ranks), each saving under ``$CKPT/rank<r>``; ``SLOW_SCRATCH`` with
``SLOW_RANK``: that rank's host-local copies go there (a slow disk).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import time
from typing import Any

import tensorflow as tf

from adaptd.client import AdaptiveCheckpointer
from adaptd.client.agreement import ranks
from adaptd.core.snapshot import Decision

STEPS = int(os.environ.get("STEPS", "300"))
SEED = int(os.environ.get("SEED", "12"))
WIDTH = int(os.environ.get("WIDTH", "16"))
FREE = bool(os.environ.get("FREE"))
SYNC_EVERY = int(os.environ.get("SYNC_EVERY", "0"))
SYNC_AT = int(os.environ.get("SYNC_AT", "0"))
STEP_S = float(os.environ.get("STEP_S", "0"))
NO_STRATEGY = bool(os.environ.get("NO_STRATEGY"))


class RandomPlans:
    """A policy whose every decision is a new random grid (seeded: the same on every
    rank, though only the chief's counts)."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def decide(self, snapshot: Any, state: Any) -> Decision:
        every = self.rng.randint(3, 25)
        return Decision(
            next_step=state.step + every, every_steps=every, reason="random", policy="random"
        )


def main() -> int:
    if os.environ.get("ADAPTD_TEST_LOG"):
        import logging

        logging.basicConfig(
            level=os.environ["ADAPTD_TEST_LOG"],
            format="%(relativeCreated)d %(threadName)s %(message)s",
        )
    # NO_STRATEGY=1: independent processes of one job (rank and world size from
    # TF_CONFIG, no coordination service): the daemon's rounds agree for them
    strategy = None if NO_STRATEGY else tf.distribute.MultiWorkerMirroredStrategy()
    rank, _ = ranks.resolve()
    if os.environ.get("SLOW_SCRATCH") and rank == int(os.environ.get("SLOW_RANK", "1")):
        os.environ["ADAPTD_SCRATCH"] = os.environ["SLOW_SCRATCH"]
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        tf.keras.utils.set_random_seed(SEED)
        model = tf.keras.Sequential(
            [tf.keras.Input((8,)), tf.keras.layers.Dense(WIDTH, "relu"), tf.keras.layers.Dense(1)]
        )
        opt = tf.keras.optimizers.Adam(0.01)
        opt.build(model.trainable_variables)

    @tf.function
    def train_step(step: tf.Tensor) -> Any:
        def replica() -> Any:
            seed = tf.stack([tf.cast(step, tf.int32), tf.constant(SEED)])
            x = tf.random.stateless_normal((16, 8), seed=seed)
            y = tf.reduce_sum(x, axis=1, keepdims=True)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            if FREE:  # updating mirrored variables is a collective
                return loss
            grads = tape.gradient(loss, model.trainable_variables)
            if strategy is not None:
                grads = tf.distribute.get_replica_context().all_reduce("sum", grads)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return replica() if strategy is None else strategy.run(replica)

    def one() -> Any:
        return tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0))

    @tf.function
    def sync() -> Any:
        assert strategy is not None
        return strategy.run(one)

    policy: Any = (
        RandomPlans(SEED)
        if os.environ.get("PLAN_CHANGES")
        else (os.environ.get("POLICY", "fixed:steps=40") or None)
    )
    results: dict[str, Any] = {"rank": rank}
    socket = os.environ.get("SOCKET", f"ipc://{os.environ['CKPT']}-none.sock")
    if os.environ.get("SOCKETS"):
        socket = os.environ["SOCKETS"].split(",")[rank]
    # independent processes each write their own checkpoints (with tf.distribute the
    # workers other than the chief write to host-local scratch)
    ckpt = f"{os.environ['CKPT']}/rank{rank}" if NO_STRATEGY else os.environ["CKPT"]
    hook = AdaptiveCheckpointer(
        ckpt, job="mw", policy=policy, socket=socket,
        decide_interval=0.01, daemon_timeout=float(os.environ.get("DAEMON_TIMEOUT", "0.5")),
        model=model, optimizer=opt,
    )  # fmt: skip

    def write(code: int | None = None) -> None:
        a = hook._authority
        # the in-band agreement's ranks, or the daemon's rounds (NO_STRATEGY)
        agreement = getattr(a, "agreement", None) or getattr(a, "rounds", None)
        weights = b"".join(v.numpy().tobytes() for v in model.weights)
        results.update(
            steps=hook.step_count,
            saved=[r.step for r in hook.history if r.ok],
            reasons=[r.reason for r in hook.history if r.ok],
            costs=[r.blocking_s + r.extra_step_s for r in hook.history if r.ok],
            blocking=[r.blocking_s for r in hook.history if r.ok],
            paths=[r.path for r in hook.history],
            failed=hook.failed_saves,
            kind=a.kind,
            rounds=[[r.round, r.action, r.at_step, r.commit] for r in agreement.rounds]
            if agreement
            else [],
            applied=[[x.round, x.action, x.at_step, x.step] for x in agreement.applied]
            if agreement
            else [],
            broken=getattr(agreement, "broken", ""),
            weights=hashlib.sha256(weights).hexdigest(),
            exit=code,
        )
        with open(os.environ["RESULT"], "w") as f:
            json.dump(results, f)

    def on_term(signum: int, frame: Any) -> None:  # runs once the hook re-delivers it
        write(signum)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    start = hook.restore_or_initialize()
    results["resumed_from"] = start
    sig_rank = int(os.environ.get("SIGNAL_RANK", "1"))
    term_at = int(os.environ.get("SIGTERM_AT", "0"))
    kill_at = int(os.environ.get("SIGKILL_AT", "0"))
    for step in range(start, STEPS):
        began = time.monotonic()
        train_step(tf.constant(step, tf.int64))
        if strategy is not None and SYNC_EVERY and (step + 1) % SYNC_EVERY == SYNC_AT:
            sync()
        if STEP_S:  # the step's "compute"
            time.sleep(max(0.0, STEP_S - (time.monotonic() - began)))
        hook.step()
        if rank == sig_rank and step + 1 == term_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if rank == sig_rank and step + 1 == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    hook.close()
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
