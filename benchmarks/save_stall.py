"""Stall per save: how long a save holds up the training loop.

For each state size, three ways of saving the same state are measured side by
side, each in a fresh worker process so they do not share caches or memory:

* ``sync``   — ``CheckpointManager.save()`` without async (the loop waits for the write);
* ``tf-async`` — raw TensorFlow: ``CheckpointManager.save()`` with
  ``CheckpointOptions(enable_async=True)``;
* ``adaptd`` — the adaptd hook, ``AdaptiveCheckpointer.step()`` with a fixed policy and
  its default writer priority (``writer_nice="auto"``: chosen before each save from the
  planned interval and the measured durable latency; the table says what it chose);
* ``adaptd-nice0``, ``adaptd-nice10``, ``adaptd-nice19`` — the same with that
  ``writer_nice`` fixed (0: TF's write thread left at normal priority).

The loop runs a training-like step (a matmul workload plus an optimizer-like
update of every state variable, so the state really changes each step). Per
iteration the wall time is recorded; the *stall* of one save is the sum over the
window that starts at the saving iteration of (iteration time − baseline), where
the baseline is the median iteration time with no save in sight. That counts the
time blocked in the save call and the extra time of the following steps (TF
defers its host copy into them, and the background write competes for CPU).
A save's window runs from the saving iteration until the write is durable, plus
``--settle`` steps. Steady state: one warm-up save is made and discarded first.

The machine's 1-minute load average is printed before and after each mode: other
work on the host competes with the writer too (a niced writer yields to it).

Usage::

    python benchmarks/save_stall.py                 # 256 MB and 1 GB, human table
    python benchmarks/save_stall.py --sizes 256 --saves 4
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

MODES = ("sync", "tf-async", "adaptd", "adaptd-nice0", "adaptd-nice10", "adaptd-nice19")


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


def worker(mode: str, mb: int, saves: int, interval: int, settle: int, directory: str) -> dict:
    tf, state, train_step = _build(mb)
    ckpt = tf.train.Checkpoint(state=state)
    manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=2)
    durable_at: dict[int, float] = {}
    save_called: dict[int, float] = {}
    hook = None
    if mode.startswith("adaptd"):
        from adaptd.client import AdaptiveCheckpointer

        hook = AdaptiveCheckpointer(
            directory,
            job=f"bench-{mb}",
            max_to_keep=2,
            policy=f"fixed:steps={interval}",
            socket=f"ipc://{directory}/no-daemon.sock",
            writer_nice=int(mode.removeprefix("adaptd-nice")) if "-nice" in mode else "auto",
            state=state,
        )
        hook.restore_or_initialize()

    def callback_for(step):
        def done(_path=None):
            durable_at[step] = time.perf_counter()

        return done

    for _ in range(10):  # trace and warm up
        train_step()
    total = interval * (saves + 1) + interval // 2
    times: list[float] = []
    nices: dict[int, int] = {}  # the writer's nice value at each of the hook's saves
    for step in range(1, total + 1):
        t0 = time.perf_counter()
        train_step()
        if hook is not None:
            hook.step()
            if step % interval == 0:
                nices[step] = hook.writer_nice or 0
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
        latency = {r.step: r.durable_s for r in hook.history if r.ok}
    else:
        ckpt.sync()
        latency = {s: durable_at[s] - save_called[s] for s in save_called if s in durable_at}
    # The baseline: the median iteration over the second half of each interval,
    # when the previous save has long been durable (checked below).
    quiet = [t for i, t in enumerate(times) if (i + 1) % interval > interval // 2]
    base = statistics.median(quiet)
    stalls, latencies, measured_nices = [], [], []
    for k in range(2, saves + 2):  # skip the warm-up save at step `interval`
        step = k * interval
        if step not in latency:
            raise RuntimeError(f"{mode}: the save at step {step} never became durable")
        if latency[step] > 0.45 * interval * base:
            raise RuntimeError(
                f"{mode}: save {step} took {latency[step]:.2f}s, too long for the quiet window; "
                f"raise --interval"
            )
        latencies.append(latency[step])
        if step in nices:
            measured_nices.append(nices[step])
        i, elapsed, stall = step - 1, 0.0, 0.0
        while elapsed < latency[step] and i < len(times):  # iterations while the write runs
            elapsed += times[i]
            stall += times[i] - base
            i += 1
        for t in times[i : i + settle]:  # and a few after it, for deferred work
            stall += t - base
        stalls.append(stall)
    return {
        "mode": mode,
        "mb": mb,
        "baseline_step_s": base,
        "stall_s": statistics.median(stalls),
        "stalls_s": stalls,
        "durable_s": statistics.median(latencies),
        "writer_nice": measured_nices if hook is not None else None,
        "interval_s": interval * base,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,1024", help="state sizes in MB, comma-separated")
    parser.add_argument("--saves", type=int, default=4, help="measured saves per mode")
    parser.add_argument("--interval", type=int, default=300, help="steps between saves")
    parser.add_argument("--settle", type=int, default=5, help="steps counted after durable")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mb", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        out = worker(args.worker, args.mb, args.saves, args.interval, args.settle, args.dir)
        print("RESULT " + json.dumps(out))
        return 0
    results = []
    failed = 0
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    for mb in sizes:
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="adaptd-bench-", dir=os.getcwd()) as d:
                print(f"… {mode} {mb} MB", file=sys.stderr, flush=True)
                cmd = [sys.executable, __file__, "--worker", mode, "--mb", str(mb),
                       "--saves", str(args.saves), "--interval", str(args.interval),
                       "--settle", str(args.settle), "--dir", d]  # fmt: skip
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
                load_before = os.getloadavg()[0]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                load = (load_before, os.getloadavg()[0])
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if proc.returncode or line is None:
                    # one mode failing (e.g. a write too slow for the quiet window) must not
                    # throw away the others: report it as a row and carry on
                    lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
                    why = lines[-1] if lines else f"exit {proc.returncode}"
                    print(f"worker {mode} {mb} MB failed: {why}", file=sys.stderr)
                    failed += 1
                    results.append({"mode": mode, "mb": mb, "error": why, "load": load})
                    continue
                results.append(dict(json.loads(line[7:]), load=load))
    sync = {r["mb"]: r["stall_s"] for r in results if r["mode"] == "sync" and "error" not in r}
    for r in results:
        if "error" not in r:
            r["vs_sync"] = r["stall_s"] / sync[r["mb"]] if sync.get(r["mb"]) else None
    if args.json:
        print(json.dumps({"machine": _machine(), "results": results}, indent=2))
        return 1 if failed else 0
    print(f"machine: {_machine()}")
    head = ("size", "mode", "step ms", "stall ms", "× sync", "× tf-async", "durable ms",
            "interval s", "writer nice", "load")  # fmt: skip
    print("{:>7} {:>13} {:>8} {:>9} {:>7} {:>10} {:>11} {:>10}  {:<11} {}".format(*head))
    tf_async = {
        r["mb"]: r["stall_s"] for r in results if r["mode"] == "tf-async" and "error" not in r
    }
    for r in results:
        load = "{:.2f}->{:.2f}".format(*r["load"])
        if "error" in r:
            print(f"{r['mb']:>5}MB {r['mode']:>13} failed: {r['error']} (load {load})")
            continue
        ratio = f"{r['vs_sync']:.2f}" if r["vs_sync"] is not None else "-"
        vs_tf = f"{r['stall_s'] / tf_async[r['mb']]:.2f}" if tf_async.get(r["mb"]) else "-"
        durable = f"{r['durable_s'] * 1e3:.0f}" if r["durable_s"] is not None else "-"
        nice = ",".join(str(n) for n in r["writer_nice"]) if r["writer_nice"] is not None else "-"
        print(
            f"{r['mb']:>5}MB {r['mode']:>13} {r['baseline_step_s'] * 1e3:>8.1f} "
            f"{r['stall_s'] * 1e3:>9.0f} {ratio:>7} {vs_tf:>10} {durable:>11} "
            f"{r['interval_s']:>10.1f}  {nice:<11} {load}"
        )
    return 1 if failed else 0


def _machine() -> str:
    import platform

    cpu = f"{platform.machine()} {os.cpu_count()} cores"
    return f"{platform.node()} {cpu}, Python {platform.python_version()}"


if __name__ == "__main__":
    raise SystemExit(main())
