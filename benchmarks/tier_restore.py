"""Restore from the memory tier vs from durable storage, side by side in one run (issue 24).

One checkpoint of ``--gb`` GB (default 1; float32 variables) is written once into a
memory tier (a directory on /dev/shm) and once into the durable directory; then each
is restored ``--rounds`` times, alternately, with the hook's own restore
(:func:`adaptd.client.restore.tiers.restore_local` for the memory tier,
:func:`adaptd.client.restore.intact.restore_newest_intact` for durable: the quick
check, then TensorFlow's CRC-checked read). Prints each time, the medians and the
ratio memory/durable (goal: at most 0.2). One restore first, untimed (TensorFlow builds
its restore ops once per process).

The durable directory is, in turn:

* ``disk``: a directory on this VM's local disk (``--durable-dir``, default a
  temporary one). Its files were just written, so they are read from the page cache:
  this is NOT a network filesystem, and says only what a fast local disk gives;
* ``slowfs``: the same files read through ``scripts/slowfs.py`` with reads capped at
  ``--nfs-mib-s`` (default 1000 MiB/s, a 10 GbE NFS link; ``--latency-ms`` per
  request), the FUSE stand-in for a shared NFS server (needs /dev/fuse).

    python benchmarks/tier_restore.py [--gb 1] [--rounds 3] [--nfs-mib-s 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import tensorflow as tf  # noqa: E402

from adaptd.client.restore import intact, tiers  # noqa: E402

CHUNK = 1 << 26  # elements per variable (256 MiB of float32)


def build(gb: float) -> tf.train.Checkpoint:
    n = int(gb * 1e9 / 4)
    sizes = [CHUNK] * (n // CHUNK) + ([n % CHUNK] if n % CHUNK else [])
    gen = tf.random.Generator.from_seed(1)
    return tf.train.Checkpoint(vs=[tf.Variable(gen.normal([s])) for s in sizes])


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--durable-dir", default=None)
    ap.add_argument("--nfs-mib-s", type=float, default=1000.0)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--no-slowfs", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    shm = Path("/dev/shm") / f"adaptd-bench-{uuid.uuid4().hex[:8]}"
    work = Path(args.durable_dir or tempfile.mkdtemp(prefix="adaptd-bench-"))
    durable = work / "durable"
    ckpt = build(args.gb)
    results: dict[str, list[float]] = {"memory": [], "disk": [], "slowfs": []}
    try:
        for d in (shm, durable):
            tf.train.CheckpointManager(ckpt, str(d), max_to_keep=1).save(checkpoint_number=1)
        size = sum(f.stat().st_size for f in shm.iterdir() if f.name.startswith("ckpt-1."))

        def from_memory() -> None:
            assert tiers.restore_local([shm], work / "none", ckpt.read).restored

        def from_dir(d: Path):
            return lambda: intact.restore_newest_intact(d, ckpt.read)

        from_memory()  # warm-up, untimed: TensorFlow builds its restore ops once
        for _ in range(args.rounds):
            results["memory"].append(timed(from_memory))
            results["disk"].append(timed(from_dir(durable)))
        if not args.no_slowfs:
            from slowfs import slow_mount

            mount = work / "mnt"
            mount.mkdir()
            with slow_mount(durable, mount, bandwidth_mib_s=args.nfs_mib_s,
                            latency_ms=args.latency_ms, throttle_reads=True):  # fmt: skip
                for _ in range(args.rounds):
                    results["memory"].append(timed(from_memory))
                    results["slowfs"].append(timed(from_dir(mount)))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        if args.durable_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items() if v}
    low = {k: min(v) for k, v in results.items() if v}
    out = {
        "bytes": size,
        "seconds": results,
        "median_s": med,
        "min_s": low,
        "ratio_memory_vs_disk": med["memory"] / med["disk"],
        "ratio_memory_vs_slowfs": med["memory"] / med["slowfs"] if "slowfs" in med else None,
        "ratio_min_memory_vs_slowfs": low["memory"] / low["slowfs"] if "slowfs" in low else None,
        "nfs_mib_s": None if args.no_slowfs else args.nfs_mib_s,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"checkpoint: {size / 1e9:.2f} GB, {args.rounds} restores per tier, alternating")
    for k, v in results.items():
        if v:
            times = ", ".join(f"{x:.2f}" for x in v)
            print(f"  {k:7s} median {med[k]:.2f} s, min {low[k]:.2f} s  ({times})")
    print(f"memory / local disk (page cache, not a network fs): {out['ratio_memory_vs_disk']:.2f}")
    if out["ratio_memory_vs_slowfs"] is not None:
        print(f"memory / slowfs at {args.nfs_mib_s:g} MiB/s (NFS stand-in): "
              f"{out['ratio_memory_vs_slowfs']:.2f} (medians), "
              f"{out['ratio_min_memory_vs_slowfs']:.2f} (minima)  (goal <= 0.2)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
