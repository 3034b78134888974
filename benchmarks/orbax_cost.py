"""Per-step cost of adaptd's Orbax ``SavePolicy.should_save`` when no save is due.

The same loop is timed side by side with and without the policy's call, in one process,
interleaved over several rounds; the cost per step is the difference of the medians
divided by the number of steps (as benchmarks/hook_cost.py does for the TensorFlow
hook). Both loops set the step on the same step record, so only the call differs; the
context is Orbax's own ``DecisionContext``. The policy runs without a daemon (its
embedded fallback) and, separately, connected to a real ``adaptd serve``, so the
socket polls and the batched step reports are counted. For scale, the last line times
Orbax's own ``CheckpointManager.save`` at a step where nothing is saved (what every
step of an Orbax loop costs before any policy is asked), with Orbax's
``FixedIntervalPolicy`` and with adaptd's.

Usage::

    python benchmarks/orbax_cost.py                 # 1,000,000 steps x 7 rounds
    python benchmarks/orbax_cost.py --steps 200000 --rounds 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


class _Step:
    """What Orbax passes as ``step`` (a ``CheckpointInfo``); only ``.step`` is read."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step = 0


def _loop_plain(n: int, info: _Step, start: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + n):
        info.step = i
    return time.perf_counter() - t0


def _loop_policy(n: int, info: _Step, start: int, should_save, previous, context) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + n):
        info.step = i
        should_save(info, previous, context=context)
    return time.perf_counter() - t0


def _measure(policy, steps: int, rounds: int, context) -> dict:
    info, previous = _Step(), []
    plain, policed = [], []
    start = 1
    for _ in range(rounds):
        plain.append(_loop_plain(steps, info, start))
        policed.append(_loop_policy(steps, info, start, policy.should_save, previous, context))
        start += steps
    per_step = (statistics.median(policed) - statistics.median(plain)) / steps
    return {
        "per_step_us": per_step * 1e6,
        "plain_loop_us": statistics.median(plain) / steps * 1e6,
        "policy_loop_us": statistics.median(policed) / steps * 1e6,
    }


def _manager_saves(directory: Path, policies: dict, steps: int, rounds: int) -> dict:
    """Seconds per ``manager.save`` at steps where nothing is saved, one manager per
    policy, their rounds interleaved (median of ``rounds``; a first round warms up)."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    args = ocp.args.StandardSave({"w": jnp.zeros(4)})
    managers = {
        name: ocp.CheckpointManager(
            directory / name, options=ocp.CheckpointManagerOptions(save_decision_policy=p)
        )
        for name, p in policies.items()
    }
    times: dict[str, list[float]] = {name: [] for name in policies}
    step = 1
    for r in range(rounds + 1):
        for name, manager in managers.items():
            t0 = time.perf_counter()
            for i in range(step, step + steps):
                manager.save(i, args=args)
            if r:  # the first round warms up (the policy's start, Orbax's caches)
                times[name].append((time.perf_counter() - t0) / steps)
        step += steps
    for manager in managers.values():
        manager.close()
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--manager-steps", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from orbax.checkpoint import options as options_lib
    from orbax.checkpoint.checkpoint_managers import save_decision_policy as sdp

    from adaptd.client.orbax import SavePolicy
    from adaptd.commands._spawn import running_daemon

    context = sdp.DecisionContext(
        is_saving_in_progress=False,
        reached_preemption=False,
        multiprocessing_options=options_lib.MultiprocessingOptions(),
    )
    never = "fixed:steps=1000000000"  # no save is ever due
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="adaptd-orbax-") as d:
        sock = Path(d) / "adaptd.sock"
        alone = SavePolicy(job="bench-a", policy=never, socket=sock)
        results["no daemon (embedded policy)"] = _measure(alone, args.steps, args.rounds, context)
        alone.close()
        with running_daemon(sock):
            linked = SavePolicy(job="bench-b", policy=never, socket=sock)
            results["daemon connected"] = _measure(linked, args.steps, args.rounds, context)
            linked.close()
        ours = SavePolicy(job="bench-c", policy=never, socket=sock)
        policies = {"fixed_interval_us": sdp.FixedIntervalPolicy(10**9), "adaptd_us": ours}
        manager = {
            name: seconds * 1e6
            for name, seconds in _manager_saves(
                Path(d), policies, args.manager_steps, args.rounds
            ).items()
        }
        ours.close()
    if args.json:
        out = {"steps": args.steps, "rounds": args.rounds, "results": results}
        print(json.dumps({**out, "manager_save_no_save": manager}))
        return 0
    print(f"{args.steps:,} steps x {args.rounds} rounds, medians")
    print(f"{'case':<28} {'policy µs/step':>15} {'loop+policy µs':>15} {'bare loop µs':>13}")
    for case, r in results.items():
        print(
            f"{case:<28} {r['per_step_us']:>15.3f} {r['policy_loop_us']:>15.3f}"
            f" {r['plain_loop_us']:>13.3f}"
        )
    print(
        f"for scale: Orbax's manager.save() at a step it does not save: "
        f"{manager['fixed_interval_us']:.1f} µs with FixedIntervalPolicy, "
        f"{manager['adaptd_us']:.1f} µs with adaptd's SavePolicy "
        f"({args.manager_steps:,} steps x {args.rounds} rounds, median)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
