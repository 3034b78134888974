"""Threads a multi-worker job holds for its collectives' timeout: TensorFlow's own
per-collective timeout (what the hook set until issue 35) beside the hook's one
watchdog (client/save/collective_timeout.py) and no bound at all, side by side.

A job of two real ``MultiWorkerMirroredStrategy`` workers on localhost trains a small
dense model (steps of a few ms, one gradient all-reduce each) for ``--steps`` steps,
once per bound:

- ``tf``: ``CommunicationOptions(timeout_seconds=T)``, T = ``--timeout`` (120 s: the
  hook's default). TensorFlow 2.21 gives each collective a thread that sleeps out T;
- ``watchdog``: the hook's bound, :class:`~adaptd.client.save.collective_timeout.Watchdog`
  with the same T, fed the step count as the hook feeds it;
- ``none``: no bound.

Each worker prints its process's thread count and resident memory every second; the
table gives, per bound, the threads and RSS at the end (or at the last sample before
the worker died, and when), the threads' growth per second, the steps per second (the
watchdog's cost) and whether a worker died (thread creation failing aborts it:
"terminate called after throwing an instance of 'std::system_error' what(): Resource
temporarily unavailable").

The watchdog's cost on the training thread (a look a second at its stack) is measured
apart, in one process (``--ab``): calls of a ``tf.function`` holding a collective of a
group of one, in alternating windows with the watchdog on and off, so the two are
compared on the same process and machine state (steps per second of the two-worker
job vary by 20 % from one run to the next on a 2-core VM).

Usage::

    python benchmarks/collective_threads.py --steps 15000 [--bounds tf,watchdog,none] [--json]
    python benchmarks/collective_threads.py --ab 8

Needs TensorFlow. About a minute per bound at 15,000 steps on a 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BOUNDS = ("tf", "watchdog", "none")


def _status() -> tuple[int, float]:
    threads, rss = 0, 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return threads, rss


def task_main(index: int, ports: list[int], bound: str, steps_to_run: int, timeout: float) -> int:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index},
        }
    )
    import tensorflow as tf

    from adaptd.client.save.collective_timeout import Watchdog

    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=timeout if bound == "tf" else None
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
             tf.keras.layers.Dense(1)]
        )  # fmt: skip
        opt = tf.keras.optimizers.SGD(0.01)
    x = tf.random.stateless_normal((64, 32), seed=(1, index))
    y = tf.random.stateless_normal((64, 1), seed=(2, index))

    @tf.function
    def step() -> Any:
        def replica() -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(replica)

    steps = 0
    watchdog = None
    if bound == "watchdog":
        watchdog = Watchdog(timeout, position=lambda: steps, holding=lambda: False)
        watchdog.thread = threading.get_ident()
        watchdog.start()
    stop = threading.Event()
    step()  # the trace and the first all-reduce
    steps = 1
    t0 = time.monotonic()

    def sample() -> None:  # a line a second: what a worker that dies had reached
        while True:
            threads, rss = _status()
            print(json.dumps({"t": round(time.monotonic() - t0, 2), "threads": threads,
                              "rss_mb": round(rss, 1), "steps": steps}), flush=True)  # fmt: skip
            if stop.wait(1.0):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    while steps < steps_to_run:  # the same count on both workers: they end together
        step()
        steps += 1
    elapsed = time.monotonic() - t0
    stop.set()
    sampler.join()
    if watchdog is not None:
        watchdog.stop()
    print(json.dumps({"done": True, "steps_per_s": (steps - 1) / elapsed, "seconds": elapsed}),
          flush=True)  # fmt: skip
    return 0


def ab_main(windows: int, window_s: float = 4.0) -> dict[str, Any]:
    """Calls per second with the watchdog off and on, in alternating windows."""
    import tensorflow as tf

    from adaptd.client.save.collective_timeout import Watchdog

    @tf.function
    def step(x: Any) -> Any:
        return tf.raw_ops.CollectiveReduceV2(
            input=x, group_size=tf.constant(1), group_key=tf.constant(1),
            instance_key=tf.constant(1), ordering_token=[], merge_op="Add", final_op="Id",
        ) + 1  # fmt: skip

    x = tf.constant(1.0)
    for _ in range(100):
        step(x)
    done = [0]  # steps so far (the watchdog's position)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(windows):
        for mode in ("off", "on"):
            watchdog = None
            if mode == "on":
                watchdog = Watchdog(120.0, position=lambda: done[0], holding=lambda: False)
                watchdog.thread = threading.get_ident()
                watchdog.start()
            t0, calls = time.monotonic(), 0
            while time.monotonic() - t0 < window_s:
                step(x)
                done[0] += 1
                calls += 1
            rates[mode].append(calls / (time.monotonic() - t0))
            if watchdog is not None:
                watchdog.stop()
    off, on = sum(rates["off"]) / windows, sum(rates["on"]) / windows
    return {
        "windows": windows,
        "window_s": window_s,
        "calls_per_s": rates,
        "mean_off": round(off),
        "mean_on": round(on),
        "on_over_off": round(on / off, 3),
    }


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_bound(bound: str, steps: int, timeout: float) -> dict[str, Any]:
    ports = _free_ports(2)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, __file__, "--task-bound", bound, "--steps", str(steps),
           "--timeout", str(timeout), "--ports", ",".join(map(str, ports))]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*cmd, "--task", str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        outs.append((p.returncode, out, err))
    result: dict[str, Any] = {"bound": bound, "workers": []}
    for rc, out, err in outs:
        lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        samples = [ln for ln in lines if "threads" in ln]
        done = next((ln for ln in lines if ln.get("done")), None)
        w: dict[str, Any] = {"died": rc != 0 or done is None, "returncode": rc}
        if samples:
            first, last = samples[0], samples[-1]
            w.update(
                threads_start=first["threads"],
                threads_last=last["threads"],
                last_sample_s=last["t"],
                threads_per_s=round((last["threads"] - first["threads"]) / max(last["t"], 1), 1),
                rss_mb_start=first["rss_mb"],
                rss_mb_last=last["rss_mb"],
                steps_reached=last["steps"],
            )
        if done is not None:
            w["steps_per_s"] = round(done["steps_per_s"], 1)
        if w["died"]:
            w["stderr_tail"] = [ln for ln in err.splitlines() if ln.strip()][-2:]
        result["workers"].append(w)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=15_000, help="training steps per bound")
    parser.add_argument("--timeout", type=float, default=120.0, help="the bound T (seconds)")
    parser.add_argument("--bounds", default=",".join(BOUNDS), help="comma-separated, of " +
                        ", ".join(BOUNDS))  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--ab",
        type=int,
        metavar="WINDOWS",
        help="the watchdog's cost instead: WINDOWS pairs of 4 s windows",
    )
    parser.add_argument("--task", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--task-bound", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.task is not None:
        ports = [int(p) for p in args.ports.split(",")]
        return task_main(args.task, ports, args.task_bound, args.steps, args.timeout)
    if args.ab is not None:
        if args.ab < 1:
            parser.error(f"--ab must be >= 1 (got {args.ab})")
        out = ab_main(args.ab)
        if args.json:
            print(json.dumps(out, indent=1))
        else:
            print(f"{args.ab} pairs of {out['window_s']:g} s windows, one process: "
                  f"{out['mean_off']} calls/s off, {out['mean_on']} on "
                  f"({out['on_over_off']:.3f}x)")  # fmt: skip
        return 0
    bounds = [b.strip() for b in args.bounds.split(",") if b.strip()]
    bad = [b for b in bounds if b not in BOUNDS]
    if bad or not bounds:
        parser.error(f"--bounds: {bad or 'none given'} not among {', '.join(BOUNDS)}")
    if args.steps < 10 or not args.timeout > 0:
        parser.error(f"--steps must be >= 10 and --timeout > 0 (got {args.steps}, {args.timeout})")
    results = []
    for bound in bounds:
        print(f"… {bound}: {args.steps} steps", file=sys.stderr, flush=True)
        results.append(run_bound(bound, args.steps, args.timeout))
    if args.json:
        print(json.dumps({"steps": args.steps, "timeout": args.timeout, "runs": results},
                         indent=1))  # fmt: skip
        return 0
    print(f"two workers, {args.steps} steps each, bound T = {args.timeout:g} s")
    print(f"{'bound':<10} {'worker':>6} {'steps/s':>8} {'threads start→last':>19} "
          f"{'at':>6} {'threads/s':>9} {'RSS MB start→last':>18}  outcome")  # fmt: skip
    for r in results:
        for i, w in enumerate(r["workers"]):
            outcome = "ok"
            if w["died"]:
                outcome = f"died ({w['returncode']}): {' | '.join(w['stderr_tail'])[:90]}"
            print(f"{r['bound']:<10} {i:>6} {w.get('steps_per_s', '-'):>8} "
                  f"{w.get('threads_start', '-'):>9}→{w.get('threads_last', '-'):<9} "
                  f"{w.get('last_sample_s', '-'):>6} {w.get('threads_per_s', '-'):>9} "
                  f"{w.get('rss_mb_start', '-'):>8}→{w.get('rss_mb_last', '-'):<9} "
                  f"{outcome}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
