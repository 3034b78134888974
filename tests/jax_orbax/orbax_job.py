"""A small JAX training job that checkpoints with Orbax under adaptd's ``SavePolicy``.

Deterministic (JAX on CPU): the state after step ``s`` is a function of ``s`` alone, so
a run resumed from a finalized step holds exactly what the uninterrupted run held at
that step. Prints one JSON line per event on stdout: ``start`` (where it resumed, the
restored state's digest), ``step`` (each step's digest), ``end`` (the save reports).
With ``--processes 2 --process-id I --port P`` it is process I of a two-process
``jax.distributed`` job (CPU collectives over gloo): the state is one array sharded
over the two processes, and each step takes a cross-process mean.

    python orbax_job.py --dir D --job J --steps 200 [--socket S] [--policy SPEC]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--socket", default=None)
    ap.add_argument("--policy", default=None)
    ap.add_argument("--policy-1", default=None, help="process 1's own spec (default: --policy)")
    ap.add_argument("--daemon-timeout", type=float, default=5.0)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--sync", action="store_true", help="Orbax's synchronous saves")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--no-policy", action="store_true", help="Orbax's defaults, no adaptd")
    args = ap.parse_args(argv)

    import jax

    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=args.processes,
            process_id=args.process_id,
            initialization_timeout=60,
        )
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from adaptd.client.orbax import SavePolicy

    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    size = 8 * len(jax.devices())

    def initial() -> dict:
        w = jax.make_array_from_callback(
            (size,), sharding, lambda idx: np.arange(size, dtype=np.float32)[idx] / size
        )
        return {"w": w}

    @jax.jit
    def train(state: dict, step: jax.Array) -> dict:
        w = state["w"]
        noise = jnp.sin(jnp.arange(size, dtype=jnp.float32) * 0.37 + step * 0.11)
        w = w * 0.99 + 0.01 * noise + 0.001 * jnp.mean(w)  # the mean: a cross-process reduction
        return {"w": w}

    def digest(state: dict) -> str:
        h = hashlib.sha256()
        for shard in sorted(state["w"].addressable_shards, key=lambda s: str(s.index)):
            h.update(np.asarray(shard.data).tobytes())
        return h.hexdigest()[:16]

    policy = None
    if not args.no_policy:
        policy = SavePolicy(
            job=args.job, directory=args.dir, socket=args.socket,
            policy=args.policy_1 if args.process_id == 1 and args.policy_1 else args.policy,
            daemon_timeout=args.daemon_timeout,
        )  # fmt: skip
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=policy, max_to_keep=3, enable_async_checkpointing=not args.sync
    )
    manager = ocp.CheckpointManager(os.path.abspath(args.dir), options=options)
    state = initial()
    start = manager.latest_step() or 0
    if start:
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
        state = manager.restore(start, args=ocp.args.StandardRestore(abstract))
    emit({"event": "start", "step": start, "digest": digest(state), "pid": os.getpid()})
    for step in range(start + 1, args.steps + 1):
        state = train(state, jnp.float32(step))
        jax.block_until_ready(state)
        emit({"event": "step", "step": step, "digest": digest(state)})
        manager.save(step, args=ocp.args.StandardSave(state))
        if args.step_sleep:
            time.sleep(args.step_sleep)
    manager.wait_until_finished()
    reports = []
    if policy is not None:
        policy.close()
        reports = [
            {"step": r.step, "blocking_s": r.blocking_s, "durable_s": r.durable_s,
             "bytes": r.bytes, "extra_step_s": r.extra_step_s, "ok": r.ok, "reason": r.reason}
            for r in policy.reports
        ]  # fmt: skip
    emit({"event": "end", "steps": manager.all_steps(), "reports": reports,
          "endpoint": policy.endpoint if policy else ""})  # fmt: skip
    manager.close()
    return 0


def emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
