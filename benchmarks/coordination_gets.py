"""What a timed-out get costs TensorFlow's coordination service, and its client.

A job of two real ``MultiWorkerMirroredStrategy`` workers on localhost: task 0 hosts the
coordination service, task 1 is its client. Task 1 makes ``--gets`` gets of a key that
is there (each returns at once), then as many 1 ms gets of a key that is *not* there
(each times out), then writes that key and makes as many timed-out gets of a second
missing key. After each batch both processes report their resident memory; the
figures are the growth per get, on each side, side by side:

- a get of a key that is there: the baseline (nothing kept);
- a timed-out get of a missing key: what the service and the client keep until the
  key is written (the agreement's watchers waited for the next proposal this way, two
  gets a second per rank, until issue 35's ticks: docs/scale.md);
- the same after the first key was written: whether writing the key gave the memory
  back for reuse (the second batch growing far less than the first says it did).

Between the second and third batch the first missing key is written and both sides
report again (``written``): what a timed-out get costs for good once its key was
written. The client also counts its Python objects (``tracemalloc``, after a
``gc.collect()``): each timed-out get leaves 88 bytes of them for good, its key
written or not, where a get of a present key leaves none (issue 35: why the agreement's
idle waits end at a write, not at a deadline).

It also counts the 1 ms gets of the present key that timed out: a busy host's
(``--hogs K`` runs K CPU-bound processes beside the two tasks) say how often the
chief's 1 ms tries miss mail that is there (client/agreement/mailbox.py).

Usage::

    python benchmarks/coordination_gets.py --gets 10000 [--hogs 4] [--json]

Needs TensorFlow. About 30 s at 10,000 gets.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

PRESENT, MISSING, LATER = "bench/present", "bench/missing", "bench/later"


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def task_main(index: int, ports: list[int], gets: int) -> int:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index},
        }
    )
    import tensorflow as tf
    from tensorflow.python.eager import context

    tf.distribute.MultiWorkerMirroredStrategy()
    ctx = context.context()

    def wait(key: str) -> str:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                return ctx.get_config_key_value(key, 10_000)
            except tf.errors.DeadlineExceededError:
                continue
        raise SystemExit(f"task {index}: {key} never came")

    timed_out: dict[str, int] = {}

    def batch(key: str, timeout_ms: int) -> float:
        t0 = time.monotonic()
        for _ in range(gets):
            try:
                ctx.get_config_key_value(key, timeout_ms)
            except tf.errors.DeadlineExceededError:
                timed_out[key] = timed_out.get(key, 0) + 1
        return time.monotonic() - t0

    phases = ("start", "present", "missing", "written", "later")
    if index == 0:  # the service: its memory at each phase the client marks
        for phase in phases:
            wait(f"bench/phase/{phase}")
            ctx.set_config_key_value(f"bench/service/{phase}", repr(_rss_mb()))
        wait("bench/over")
        return 0
    ctx.set_config_key_value(PRESENT, "x")
    out: dict[str, Any] = {"client": {}, "service": {}, "seconds": {}, "python_bytes": {}}
    tracemalloc.start(1)

    def mark(phase: str) -> None:
        gc.collect()
        out["python_bytes"][phase] = tracemalloc.get_traced_memory()[0]
        out["client"][phase] = _rss_mb()
        ctx.set_config_key_value(f"bench/phase/{phase}", "1")
        out["service"][phase] = float(wait(f"bench/service/{phase}"))

    mark("start")
    out["seconds"]["present"] = batch(PRESENT, 1)
    mark("present")
    out["seconds"]["missing"] = batch(MISSING, 1)
    mark("missing")
    ctx.set_config_key_value(MISSING, "written at last")
    mark("written")
    out["seconds"]["later"] = batch(LATER, 1)
    mark("later")
    ctx.set_config_key_value("bench/over", "1")
    out["present_timed_out"] = timed_out.get(PRESENT, 0)
    print(json.dumps(out), flush=True)
    return 0


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gets", type=int, default=10_000, help="gets per batch")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--hogs", type=int, default=0,
        help="CPU-bound processes to run beside the two tasks (a busy host: how often a "
        "1 ms get of a key that is there times out)",
    )  # fmt: skip
    parser.add_argument("--task", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gets < 100:
        parser.error(f"--gets must be at least 100 (got {args.gets}): the figures are per get")
    if args.task is not None:
        return task_main(args.task, [int(p) for p in args.ports.split(",")], args.gets)
    ports = _free_ports(2)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, __file__, "--gets", str(args.gets), "--ports", ",".join(map(str, ports))]
    if args.hogs < 0:
        parser.error(f"--hogs must be 0 or more (got {args.hogs})")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    procs = [
        subprocess.Popen([*cmd, "--task", str(i)], env=env, stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        for p in procs + hogs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        print(f"a task failed: exit codes {[p.returncode for p in procs]}", file=sys.stderr)
        return 1
    data = json.loads(outs[1].strip().splitlines()[-1])
    per_get = {
        side: {
            batch: round((data[side][batch] - data[side][prev]) * 1024 / args.gets, 2)
            for prev, batch in (("start", "present"), ("present", "missing"), ("written", "later"))
        }
        for side in ("client", "service")
    }
    # what stays once the missing key was written: from before its batch to after the write
    for side in ("client", "service"):
        per_get[side]["kept after the write"] = round(
            (data[side]["written"] - data[side]["present"]) * 1024 / args.gets, 2
        )
    py = data["python_bytes"]
    py_per_get = {
        "present": round((py["present"] - py["start"]) / args.gets, 1),
        "missing, once written": round((py["written"] - py["present"]) / args.gets, 1),
        "later": round((py["later"] - py["written"]) / args.gets, 1),
    }
    result = {"gets": args.gets, "hogs": args.hogs, "kb_per_get": per_get,
              "client_python_bytes_per_get": py_per_get, "rss_mb": data,
              "seconds": data["seconds"],
              "present_timed_out": data["present_timed_out"]}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.gets} gets per batch; KB of resident memory per get (1 ms timeout)")
    print(f"{'batch':<46} {'client':>8} {'service':>8}")
    rows = (
        ("present", "a key that is there"),
        ("missing", "a missing key (each times out)"),
        ("kept after the write", "the missing key's, once it was written"),
        ("later", "another missing key, once the first was written"),
    )
    for batch, what in rows:
        c, s = per_get["client"][batch], per_get["service"][batch]
        print(f"{what:<46} {c:>8.2f} {s:>8.2f}")
    print("client's Python objects kept per get (bytes, after gc): "
          + ", ".join(f"{k} {v:g}" for k, v in py_per_get.items()))  # fmt: skip
    print(f"1 ms gets of the key that is there that timed out: {data['present_timed_out']} of "
          f"{args.gets} ({args.hogs} CPU hogs beside)")  # fmt: skip
    base = max(0.01, per_get["service"]["present"])
    print(f"service: a timed-out get keeps {per_get['service']['missing'] / base:.0f}x what a get "
          f"of a present key does (floor 0.01 KB)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
