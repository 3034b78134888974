"""The GPU check of issue 33: Orbax saves of a 1 GB and an 8 GB state, async vs sync,
adaptd's per-step cost, and an NVML fixture, on a host with JAX and Orbax (no
TensorFlow, no network needed).

For each size and mode, a JAX state of that many bytes (float32 arrays of 256 MiB at
most, on the default device: the GPU where there is one) is trained for ``--steps``
steps of a cheap jitted update, saved through Orbax's ``CheckpointManager`` at the
steps adaptd's ``SavePolicy`` plans (``fixed:steps=K``, no daemon: its embedded
policy). Measured per save, side by side in one run:

* ``stall_s``: how long ``manager.save()`` blocked the loop at a save step (what a
  training step loses), async (``enable_async_checkpointing=True``, Orbax's default)
  and sync;
* ``finalize_s``: from the save call until Orbax's commit (async: the background write
  and commit; ``wait_until_finished`` after the last save);
* adaptd's own reports of the same saves (``blocking_s``, ``durable_s``, ``bytes``), to
  compare its seam measurement with the loop's;
* the mean step time without saves.

Then the policy's per-step cost when no save is due (benchmarks/orbax_cost.py, no
daemon and with a real ``adaptd serve``) and an NVML fixture
(scripts/record_nvml_fixture.py; on a host without a driver it records that).

Usage (about 3-6 minutes on an H100 host with a local NVMe disk)::

    python benchmarks/gpu_check.py --out gpu-check/            # 1 GB and 8 GB
    python benchmarks/gpu_check.py --small --out /tmp/check    # 1 MiB and 8 MiB, CPU: seconds

Writes ``gpu_check.json`` (every figure) and ``nvml_fixture.json`` into ``--out`` and
prints a table. ``--dir`` is where the checkpoints go (default: a temporary directory
under ``--out``; each case's directory is removed after it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
MIB = 1 << 20
#: Largest single array (bytes): the state is a dict of arrays this big at most.
CHUNK = 256 * MIB


def state_of(nbytes: int):
    """A dict of float32 arrays holding ``nbytes`` in all, on the default device."""
    import jax
    import jax.numpy as jnp

    arrays = {}
    left, i = nbytes, 0
    while left > 0:
        n = min(left, CHUNK) // 4
        key = jax.random.PRNGKey(i)
        arrays[f"a{i:03d}"] = jax.random.normal(key, (n,), dtype=jnp.float32)
        left -= n * 4
        i += 1
    jax.block_until_ready(arrays)
    return arrays


def run_case(nbytes: int, asynchronous: bool, steps: int, every: int, base: Path) -> dict:
    """One size and mode: the loop's step time, and each save's stall and commit."""
    import jax
    import orbax.checkpoint as ocp

    from adaptd.client.orbax import SavePolicy

    @jax.jit
    def train(state):
        return jax.tree_util.tree_map(lambda a: a * 0.999 + 0.001, state)

    directory = base / f"{nbytes}-{'async' if asynchronous else 'sync'}"
    shutil.rmtree(directory, ignore_errors=True)
    policy = SavePolicy(job=f"gpu-check-{directory.name}", directory=directory,
                        policy=f"fixed:steps={every}", socket=base / "no-daemon.sock")  # fmt: skip
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=policy, max_to_keep=2, enable_async_checkpointing=asynchronous
    )
    state = train(state_of(nbytes))
    jax.block_until_ready(state)
    plain, stalls, started = [], [], {}
    with ocp.CheckpointManager(directory, options=options) as manager:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            state = train(state)
            jax.block_until_ready(state)
            t1 = time.perf_counter()
            saved = manager.save(step, args=ocp.args.StandardSave(state))
            t2 = time.perf_counter()
            if saved:
                stalls.append(t2 - t1)
                started[step] = t1
            else:
                plain.append(t1 - t0)
        manager.wait_until_finished()
        done = time.perf_counter()
    policy.close()
    reports = [
        {"step": r.step, "blocking_s": r.blocking_s, "durable_s": r.durable_s, "bytes": r.bytes,
         "extra_step_s": r.extra_step_s, "ok": r.ok}
        for r in policy.reports
    ]  # fmt: skip
    shutil.rmtree(directory, ignore_errors=True)
    return {
        "bytes": nbytes,
        "mode": "async" if asynchronous else "sync",
        "saves": len(stalls),
        "step_s": statistics.median(plain) if plain else None,
        "stall_s": stalls,
        "stall_median_s": statistics.median(stalls) if stalls else None,
        "last_finalize_s": done - started[max(started)] if started else None,
        "adaptd_reports": reports,
    }


def per_step_cost(steps: int, rounds: int) -> dict:
    """benchmarks/orbax_cost.py's figures (a process of its own)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "orbax_cost.py"), "--json",
         "--steps", str(steps), "--rounds", str(rounds), "--manager-steps", str(steps // 100)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def nvml_fixture(path: Path) -> dict:
    """scripts/record_nvml_fixture.py into ``path``."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_nvml_fixture.py"), "--frames", "3",
         "-o", str(path), "--note", "benchmarks/gpu_check.py"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return {"rc": out.returncode, "path": str(path), "stderr": out.stderr[-2000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the JSON results go")
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: under --out)")
    parser.add_argument("--small", action="store_true", help="1 MiB and 8 MiB (a CPU run)")
    parser.add_argument("--steps", type=int, default=None, help="steps per case")
    parser.add_argument("--every", type=int, default=None, help="save every this many steps")
    parser.add_argument(
        "--cost-steps", type=int, default=None, help="steps per round of the per-step cost"
    )
    args = parser.parse_args(argv)
    sizes = [1 * MIB, 8 * MIB] if args.small else [1 * GIB, 8 * GIB]
    steps = args.steps or (12 if args.small else 24)
    every = args.every or (4 if args.small else 8)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(args.dir) if args.dir else out / "checkpoints"
    base.mkdir(parents=True, exist_ok=True)
    import jax

    t0 = time.perf_counter()
    result: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "tensorflow_importable": _importable("tensorflow"),
        "small": args.small,
        "steps": steps,
        "every": every,
        "cases": [],
    }
    import orbax.checkpoint as ocp

    result["orbax"] = getattr(ocp, "__version__", "")
    for nbytes in sizes:
        for asynchronous in (True, False):
            case = run_case(nbytes, asynchronous, steps, every, base)
            result["cases"].append(case)
            print(_row(case), flush=True)
    cost_steps = args.cost_steps or (20_000 if args.small else 1_000_000)
    result["per_step_cost"] = per_step_cost(cost_steps, 3 if args.small else 7)
    result["nvml"] = nvml_fixture(out / "nvml_fixture.json")
    result["seconds"] = time.perf_counter() - t0
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    cost = result["per_step_cost"].get("results", {})
    for case, r in cost.items():
        print(f"policy per-step cost, {case}: {r['per_step_us']:.3f} µs")
    print(f"nvml fixture: rc {result['nvml']['rc']}, {result['nvml']['path']}")
    print(f"total {result['seconds']:.0f} s; results in {out / 'gpu_check.json'}")
    return 0


def _row(case: dict) -> str:
    big = case["bytes"] >= GIB
    size = f"{case['bytes'] / (GIB if big else MIB):g} {'GiB' if big else 'MiB'}"
    stall, fin, step = case["stall_median_s"], case["last_finalize_s"], case["step_s"]
    return (
        f"{size:>8} {case['mode']:>5}: {case['saves']} saves, stall median {_s(stall)}, "
        f"last commit after {_s(fin)}, step {_s(step)}"
    )


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.4f} s"


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    raise SystemExit(main())
