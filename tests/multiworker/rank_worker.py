"""One worker of tests/multiworker/test_rank_state.py: a real ``MultiWorkerMirroredStrategy``
job whose ranks each read their own shard of a shuffled pipeline, trained through
``AdaptiveCheckpointer``, writing what it ended with to ``$RESULT`` as JSON.

One process trains one model per input style named in ``INPUTS`` (comma-separated),
in lock step, each with its own hook, job and checkpoint directory ``$CKPT/<style>``:

``plain``     ``it = iter(ds.shard(n, rank).shuffle(...).repeat().batch(32))`` on each
              worker, with a per-rank ``tf.random.Generator`` adding noise to the input
``distribute`` ``iter(strategy.experimental_distribute_dataset(ds))``
``function``  ``iter(strategy.distribute_datasets_from_function(fn))``

Environment: ``CKPT``, ``STEPS`` (default 50), ``EVERY`` (steps between saves, default
10); ``KILL_RANK`` and ``KILL_AT``: that rank SIGKILLs itself after step ``KILL_AT``;
with ``KILL_IN_WRITE=1`` instead right after the first save call at or after ``KILL_AT``
returned while that save's write is in flight, in whichever style it is first so
(``$KILL_MARK`` is written first: that step and style). The result of each style: the
digests of the model's weights, of the optimizer's variables (slots and iteration
count), the hook's step and the rank's next three batches after the last step, and
the step it resumed from; rank 0 adds the weights plain TensorFlow reads back.

The crash matrix (tests/multiworker/test_crash_matrix.py) adds: ``KILL_SIGNAL``
(default ``SIGKILL``; ``SIGSTOP``: the rank stops itself and the test reaps it);
``KILL_IN_ROUND=1``: after step ``KILL_AT`` the next rank asks for a save (one agreement
round) and ``KILL_RANK`` kills itself as it reads that round's proposal, before its
acknowledgement; ``COLLECTIVE_TIMEOUT``: the strategy's collective timeout in seconds
(``CommunicationOptions``, as a user sets it); ``SOCKETS``: each rank's daemon,
comma-separated (default: none there); ``HOLD_AT`` with ``HOLD_FILE``: after that step
every rank writes ``HOLD_FILE.<rank>`` and waits (at most 60 s) for ``HOLD_FILE.go``
(the test injects a fault while no collective is in flight); ``STEP_S``: each step takes
at least that long (time for a fault to be noticed mid-run).
``POLICY`` replaces the policy (default ``fixed:steps=$EVERY``); the hook's other
settings from the environment apply too (``ADAPTD_LOCAL_TIER``: two tiers).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import tensorflow as tf

from adaptd.client import AdaptiveCheckpointer
from adaptd.client.agreement import ranks

STEPS = int(os.environ.get("STEPS", "50"))
EVERY = int(os.environ.get("EVERY", "10"))
KEEP = int(os.environ.get("KEEP", "3"))
INPUTS = os.environ.get("INPUTS", "plain,distribute,function").split(",")
ROWS = 1024
BATCH = 32  # per worker
SEED = 9


def rows() -> tf.data.Dataset:
    """ROWS labelled rows, each a pure function of its index."""

    def row(k: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = tf.random.stateless_normal([8], seed=tf.stack([k, tf.constant(7, tf.int64)]))
        return x, tf.reduce_sum(x, keepdims=True)

    return tf.data.Dataset.range(ROWS).map(row)


def shuffled(ds: tf.data.Dataset, batch: int) -> tf.data.Dataset:
    return ds.shuffle(2048, seed=SEED, reshuffle_each_iteration=True).repeat().batch(batch)


def build() -> tuple[Any, Any]:
    model = tf.keras.Sequential(
        [tf.keras.Input((8,)), tf.keras.layers.Dense(16, "relu"), tf.keras.layers.Dense(1)]
    )
    opt = tf.keras.optimizers.Adam(0.01)
    opt.build(model.trainable_variables)
    return model, opt


def digest(values: Any) -> str:
    h = hashlib.sha256()
    for v in values:
        h.update(v.numpy().tobytes() if hasattr(v, "numpy") else bytes(v))
    return h.hexdigest()


def mirrored_train(strategy: Any, model: Any, opt: Any) -> Any:
    """One training step of ``model`` on every replica: the gradients all-reduced (the
    step's one collective, before the update), then applied."""

    @tf.function
    def train(x: Any, y: Any) -> None:
        def replica(x: Any, y: Any) -> None:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            grads = tf.distribute.get_replica_context().all_reduce("sum", grads)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        strategy.run(replica, args=(x, y))

    return train


class Trainee:
    """One model with its optimizer, its input of one style and its hook."""

    def __init__(self, style: str, strategy: Any, rank: int, world: int) -> None:
        self.style, self.strategy = style, strategy
        self.directory = f"{os.environ['CKPT']}/{style}"
        with strategy.scope():
            tf.keras.utils.set_random_seed(SEED)
            self.model, self.opt = build()
        extra: dict[str, Any] = {}
        self.rng = None
        if style == "plain":
            self.it = iter(shuffled(rows().shard(world, rank), BATCH))
            self.rng = tf.random.Generator.from_seed(100 + rank)  # per rank, outside scope
            extra["rng"] = self.rng
        elif style == "distribute":
            ds = shuffled(rows(), BATCH * world)
            self.it = iter(strategy.experimental_distribute_dataset(ds))
        elif style == "function":

            def fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
                shard = rows().shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
                return shuffled(shard, ctx.get_per_replica_batch_size(BATCH * world))

            self.it = iter(strategy.distribute_datasets_from_function(fn))
        else:
            raise SystemExit(f"unknown input style {style!r}")
        socket = f"ipc://{os.environ['CKPT']}-none.sock"
        if os.environ.get("SOCKETS"):
            socket = os.environ["SOCKETS"].split(",")[rank]
        self.hook = AdaptiveCheckpointer(
            self.directory, job=f"ranks-{style}", max_to_keep=KEEP,
            policy=os.environ.get("POLICY", f"fixed:steps={EVERY}"),
            socket=socket, daemon_timeout=0.5,
            handle_sigterm=False, save_on_close=False,
            model=self.model, optimizer=self.opt, data_iterator=self.it, **extra,
        )  # fmt: skip
        self.train = mirrored_train(strategy, self.model, self.opt)

    def batch(self) -> tuple[Any, Any]:
        x, y = next(self.it)
        if self.rng is not None:
            x = x + 0.01 * self.rng.normal(tf.shape(x))
        return x, y

    def step(self) -> None:
        self.train(*self.batch())
        self.hook.step()

    def result(self) -> dict[str, Any]:
        local = self.strategy.experimental_local_results
        nxt = [t for _ in range(3) for part in self.batch() for t in local(part)]
        return {
            "weights": digest(self.model.weights),
            "optimizer": digest(self.opt.variables),
            "step": self.hook.step_count,
            "next_batches": digest(nxt),
            "resumed_from": self.hook.resumed_from,
            "skipped": self.hook.resume.describe(),  # what the daemon is told (Hello)
        }

    def plain_tf(self) -> str:
        """The weights a plain ``tf.train.Checkpoint`` (no strategy, no adaptd) reads
        from the newest checkpoint."""
        model, opt = build()
        ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
        ckpt.restore(tf.train.latest_checkpoint(self.directory)).assert_existing_objects_matched()
        return digest(model.weights)


def strategy_of_the_job() -> Any:
    if not os.environ.get("COLLECTIVE_TIMEOUT"):
        return tf.distribute.MultiWorkerMirroredStrategy()
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=float(os.environ["COLLECTIVE_TIMEOUT"])
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def die(sig: int) -> None:
    os.kill(os.getpid(), sig)
    if sig == signal.SIGSTOP:  # stopped until the test reaps us; never go on
        time.sleep(3600)


def die_in_the_next_round(hook: Any, sig: int) -> None:
    """Die as this rank reads the next round's proposal (before acknowledging it)."""
    agreement = hook._authority.agreement  # the in-band agreement's rank side

    def acknowledge(proposal: Any) -> Any:
        die(sig)

    agreement.acknowledge = acknowledge


def hold(step: int, rank: int) -> None:
    """Tell the test this rank finished ``step``; wait (bounded) for its go-ahead."""
    base = os.environ["HOLD_FILE"]
    Path(f"{base}.{rank}").write_text(str(step))
    deadline = time.monotonic() + 60
    while not Path(f"{base}.go").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: no go-ahead within 60 s after step {step}")
        time.sleep(0.01)


def main() -> int:
    strategy = strategy_of_the_job()
    rank, world = ranks.resolve()
    trainees = [Trainee(style, strategy, rank, world) for style in INPUTS]
    # each style is a job of its own: one may resume from an older step than another
    # (its part of the newer step was still being written when a rank died)
    starts = [t.hook.restore_or_initialize() for t in trainees]
    victim_rank = int(os.environ.get("KILL_RANK", "-1"))
    victim = rank == victim_rank
    kill_at = int(os.environ.get("KILL_AT", "0")) if victim else 0
    sig = getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL"))
    in_write = bool(os.environ.get("KILL_IN_WRITE"))
    in_round = bool(os.environ.get("KILL_IN_ROUND"))
    asks_at = int(os.environ.get("KILL_AT", "0")) if rank == (victim_rank + 1) % world else 0
    hold_at = int(os.environ.get("HOLD_AT", "0"))
    step_s = float(os.environ.get("STEP_S", "0"))
    for step in range(min(starts), STEPS):
        done = step + 1
        began = time.monotonic()
        for t, start in zip(trainees, starts, strict=True):
            if step >= start:
                t.step()
            if in_write and kill_at and done >= kill_at and t.hook.save_in_flight:
                with open(os.environ["KILL_MARK"], "w") as f:  # first, then the kill
                    json.dump({"step": done, "style": t.style}, f)
                die(sig)
        if step_s:
            time.sleep(max(0.0, step_s - (time.monotonic() - began)))
        if in_round and done == kill_at:
            for t in trainees:
                die_in_the_next_round(t.hook, sig)
        if in_round and done == asks_at:
            for t in trainees:
                t.hook.request_save("crash matrix: a round")
        if kill_at and not in_write and not in_round and done >= kill_at:
            die(sig)
        if done == hold_at:
            hold(done, rank)
    for t in trainees:
        t.hook.close()
    results: dict[str, Any] = {"rank": rank, **{t.style: t.result() for t in trainees}}
    if rank == 0:
        results["plain_tf"] = {t.style: t.plain_tf() for t in trainees}
    with open(os.environ["RESULT"], "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
