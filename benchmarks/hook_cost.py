"""Per-step cost of ``AdaptiveCheckpointer.step()`` when no save is due.

The same loop is timed side by side with and without the hook, in one process,
interleaved over several rounds; the cost per step is the difference of the
medians divided by the number of steps. The hook runs without a daemon (its
embedded fallback) and, separately, connected to a real ``adaptd serve``, so the
time-budgeted socket poll and the batched step reports are both counted.

Usage::

    python benchmarks/hook_cost.py            # 1,000,000 steps x 7 rounds
    python benchmarks/hook_cost.py --steps 200000 --rounds 5 --json
    python benchmarks/hook_cost.py --world-size 2     # rank 0 of a 2-rank job
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def _loop_plain(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - t0


def _loop_hook(n: int, step) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - t0


def _measure(ckptr, steps: int, rounds: int) -> dict:
    plain, hooked = [], []
    for _ in range(rounds):
        plain.append(_loop_plain(steps))
        hooked.append(_loop_hook(steps, ckptr.step))
    per_step = (statistics.median(hooked) - statistics.median(plain)) / steps
    return {
        "per_step_us": per_step * 1e6,
        "plain_loop_us": statistics.median(plain) / steps * 1e6,
        "hook_loop_us": statistics.median(hooked) / steps * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="run the hook as rank 0 of this many ranks (> 1 without tf.distribute: the "
        "daemon's agreement rounds, whose per-step path is the same one compare)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    from adaptd.client import AdaptiveCheckpointer

    try:
        from adaptd.commands._spawn import running_daemon
    except ImportError:  # a revision before issue 22's folders (benchmarks/side_by_side.py)
        from adaptd.spawn import running_daemon  # type: ignore[no-redef]

    results = {}
    ranks = {"rank": 0, "world_size": args.world_size} if args.world_size > 1 else {}
    with tempfile.TemporaryDirectory(prefix="adaptd-hook-") as d:
        never = "fixed:steps=1000000000"  # no save is ever due
        sock = Path(d) / "adaptd.sock"
        var = tf.Variable(1.0)
        with AdaptiveCheckpointer(
            Path(d) / "a", job="bench-a", policy=never, socket=f"ipc://{sock}", v=var, **ranks
        ) as ckptr:
            ckptr.restore_or_initialize()
            results["no daemon (embedded policy)"] = _measure(ckptr, args.steps, args.rounds)
        with (
            running_daemon(sock),
            AdaptiveCheckpointer(
                Path(d) / "b", job="bench-b", policy=never, socket=f"ipc://{sock}", v=var, **ranks
            ) as ckptr,
        ):
            ckptr.restore_or_initialize()
            results["daemon connected"] = _measure(ckptr, args.steps, args.rounds)
    if args.json:
        out = {"steps": args.steps, "rounds": args.rounds, "world_size": args.world_size}
        print(json.dumps({**out, "results": results}))
        return 0
    print(f"{args.steps:,} steps x {args.rounds} rounds, world size {args.world_size}, medians")
    print(f"{'case':<28} {'hook µs/step':>13} {'loop+hook µs':>13} {'bare loop µs':>13}")
    for case, r in results.items():
        print(
            f"{case:<28} {r['per_step_us']:>13.3f} {r['hook_loop_us']:>13.3f}"
            f" {r['plain_loop_us']:>13.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
