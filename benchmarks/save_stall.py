"""Stall per save: how long a save holds up the training loop.

For each state size, three ways of saving the same state are measured side by
side, each in a fresh worker process so they do not share caches or memory:

* ``sync``   — ``CheckpointManager.save()`` without async (the loop waits for the write);
* ``tf-async`` — raw TensorFlow: ``CheckpointManager.save(options=CheckpointOptions(enable_async=True))``;
* ``adaptd`` — the adaptd hook, ``AdaptiveCheckpointer.step()`` with a fixed policy.

The loop runs a training-like step (a matmul workload plus an optimizer-like
update of every state variable, so the state really changes each step). Per
iteration the wall time is recorded; the *stall* of one save is the sum over the
window that starts at the saving iteration of (iteration time − baseline), where
the baseline is the median iteration time with no save in sight. That counts the
time blocked in the save call and the extra time of the following steps (TF
defers its host copy into them, and the background write competes for CPU).
Steady state: one warm-up save is made and discarded first.

Usage::

    python benchmarks/save_stall.py                 # 256 MB and 1 GB, human table
    python benchmarks/save_stall.py --sizes 64 --saves 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("sync", "tf-async", "adaptd")


def _build(mb: int):
    import tensorflow as tf

    tf.random.set_seed(0)
    per_var = 16 * 2**20 // 4  # 16 MiB float32 variables
    n_vars = max(1, mb // 16)
    state = tf.Module()
    state.vars = [tf.Variable(tf.random.uniform([per_var]), name=f"w{i}") for i in range(n_vars)]
    a = tf.Variable(tf.random.uniform([384, 384]))

    @tf.function
    def train_step():
        x = a
        for _ in range(8):
            x = tf.tanh(tf.matmul(x, a))
        delta = tf.reduce_mean(x) * 1e-6
        for v in state.vars:
            v.assign_add(tf.fill(tf.shape(v), delta))
        return delta

    return tf, state, train_step


def worker(mode: str, mb: int, saves: int, interval: int, window: int, directory: str) -> dict:
    tf, state, train_step = _build(mb)
    ckpt = tf.train.Checkpoint(state=state)
    manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=2)
    durable_at: dict[int, float] = {}
    save_called: dict[int, float] = {}
    hook = None
    if mode == "adaptd":
        from adaptd.client import AdaptiveCheckpointer

        hook = AdaptiveCheckpointer(
            directory,
            job=f"bench-{mb}",
            max_to_keep=2,
            policy=f"fixed:steps={interval}",
            socket=f"ipc://{directory}/no-daemon.sock",
            state=state,
        )
        hook.restore_or_initialize()

    def callback_for(step):
        def done(_path=None):
            durable_at[step] = time.perf_counter()

        return done

    for _ in range(10):  # trace and warm up
        train_step()
    total = interval * (saves + 1) + window
    times: list[float] = []
    for step in range(1, total + 1):
        t0 = time.perf_counter()
        train_step()
        if hook is not None:
            hook.step()
        elif step % interval == 0:
            save_called[step] = time.perf_counter()
            if mode == "sync":
                manager.save(checkpoint_number=step)
                durable_at[step] = time.perf_counter()
            else:
                opts = tf.train.CheckpointOptions(
                    enable_async=True, experimental_write_callbacks=[callback_for(step)]
                )
                manager.save(checkpoint_number=step, options=opts)
        times.append(time.perf_counter() - t0)
    if hook is not None:
        hook.close()
        reports = [r for r in hook.reports if r.ok]
        latencies = [r.durable_s for r in reports[1:]]
    else:
        ckpt.sync() if hasattr(ckpt, "sync") else None
        latencies = [durable_at[s] - save_called[s] for s in sorted(save_called)[1:] if s in durable_at]
    # baseline: iterations well after the previous save and before the next one
    quiet = [
        times[i]
        for i in range(len(times))
        if window <= (i + 1) % interval < interval - 1 and i + 1 > interval
    ] or times[:interval]
    base = statistics.median(quiet)
    stalls = []
    for k in range(2, saves + 2):  # skip the warm-up save at step `interval`
        start = k * interval - 1  # index of the saving iteration
        stalls.append(sum(t - base for t in times[start : start + window]))
    return {
        "mode": mode,
        "mb": mb,
        "baseline_step_s": base,
        "stall_s": statistics.median(stalls),
        "stalls_s": stalls,
        "durable_s": statistics.median(latencies) if latencies else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,1024", help="state sizes in MB, comma-separated")
    parser.add_argument("--saves", type=int, default=4, help="measured saves per mode")
    parser.add_argument("--interval", type=int, default=40, help="steps between saves")
    parser.add_argument("--window", type=int, default=25, help="steps counted after each save")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mb", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.window >= args.interval - 2:
        parser.error(f"--window ({args.window}) must be below --interval - 2 ({args.interval - 2})")
    if args.worker:
        out = worker(args.worker, args.mb, args.saves, args.interval, args.window, args.dir)
        print("RESULT " + json.dumps(out))
        return 0
    results = []
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    for mb in sizes:
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="adaptd-bench-", dir=os.getcwd()) as d:
                print(f"… {mode} {mb} MB", file=sys.stderr, flush=True)
                cmd = [sys.executable, __file__, "--worker", mode, "--mb", str(mb),
                       "--saves", str(args.saves), "--interval", str(args.interval),
                       "--window", str(args.window), "--dir", d]  # fmt: skip
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if proc.returncode or line is None:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    print(f"worker {mode} {mb} MB failed (exit {proc.returncode})", file=sys.stderr)
                    return 1
                results.append(json.loads(line[7:]))
    sync = {r["mb"]: r["stall_s"] for r in results if r["mode"] == "sync"}
    for r in results:
        r["vs_sync"] = r["stall_s"] / sync[r["mb"]] if sync.get(r["mb"]) else None
    if args.json:
        print(json.dumps({"machine": _machine(), "results": results}, indent=2))
        return 0
    print(f"machine: {_machine()}")
    print(f"{'size':>7} {'mode':>9} {'step ms':>8} {'stall ms':>9} {'× sync':>7} {'durable ms':>11}")
    for r in results:
        ratio = f"{r['vs_sync']:.2f}" if r["vs_sync"] is not None else "-"
        durable = f"{r['durable_s'] * 1e3:.0f}" if r["durable_s"] is not None else "-"
        print(
            f"{r['mb']:>5}MB {r['mode']:>9} {r['baseline_step_s'] * 1e3:>8.1f} "
            f"{r['stall_s'] * 1e3:>9.0f} {ratio:>7} {durable:>11}"
        )
    return 0


def _machine() -> str:
    import platform

    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"


if __name__ == "__main__":
    raise SystemExit(main())
