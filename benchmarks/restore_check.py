"""What checking the newest checkpoint costs at every start, beside the restore itself.

``restore_or_initialize()`` gives each checkpoint, newest first, ``adaptd verify``'s
quick check before restoring it (index checksums, every shard's size, the object
graph; TensorFlow's restore then checks every tensor's CRC32C as it reads). For a
checkpoint of each ``--sizes`` MB written by the hook (16 MiB float32 variables),
one process measures, interleaved over ``--rounds`` rounds (medians):

* ``check``: ``verify(prefix, read_tensors=False)``, the quick check;
* ``restore``: ``tf.train.Checkpoint.restore`` of the same checkpoint, what a resume
  always cost;
* ``resume``: the hook's whole ``restore_or_initialize()`` (check + restore + start);
* ``full verify``: ``adaptd verify``, which reads every tensor, for comparison.

The page cache is warm (the checkpoint was just written, and each round reads it
again); a cold cache slows the restore and the full verify, not the quick check,
which reads only the index.

Usage::

    python benchmarks/restore_check.py                # 1 GB, 5 rounds
    python benchmarks/restore_check.py --sizes 64,1024 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path


def _state(mb: int):
    import tensorflow as tf

    per_var = 16 * 2**20 // 4
    return {f"w{i}": tf.Variable(tf.random.uniform([per_var], seed=i)) for i in range(mb // 16)}


def _measure(mb: int, rounds: int) -> dict:
    import tensorflow as tf

    from adaptd.client import AdaptiveCheckpointer
    from adaptd.client.restore.verify import verify

    with tempfile.TemporaryDirectory(prefix="adaptd-restore-") as d:
        state = _state(mb)
        opts = {
            "job": "bench",
            "socket": f"ipc://{d}/none.sock",
            "daemon_timeout": 0.1,
            "handle_sigterm": False,
            "save_on_close": False,
            "policy": "fixed:steps=1",
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no daemon here
            writer = AdaptiveCheckpointer(Path(d) / "ck", **opts, **state)
            writer.restore_or_initialize()
            writer.step()  # fixed:steps=1 saves step 1
            writer.close()
        prefix = str(Path(d) / "ck" / "ckpt-1")
        size = sum(f.stat().st_size for f in (Path(d) / "ck").glob("ckpt-1.*"))
        checkpoint = tf.train.Checkpoint(**state)
        times: dict[str, list[float]] = {"check": [], "restore": [], "resume": [], "full": []}
        for _ in range(rounds):
            t0 = time.perf_counter()
            report = verify(prefix, read_tensors=False)
            times["check"].append(time.perf_counter() - t0)
            assert report.ok, report.problems
            t0 = time.perf_counter()
            checkpoint.restore(prefix).assert_existing_objects_matched().expect_partial()
            times["restore"].append(time.perf_counter() - t0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                ckptr = AdaptiveCheckpointer(Path(d) / "ck", **opts, **state)
                t0 = time.perf_counter()
                assert ckptr.restore_or_initialize() == 1
                times["resume"].append(time.perf_counter() - t0)
                ckptr.close()
            t0 = time.perf_counter()
            assert verify(prefix).ok
            times["full"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"mb": mb, "bytes": size, "rounds": rounds, **{f"{k}_s": v for k, v in med.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024", help="comma-separated state sizes in MB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    results = [_measure(int(s), args.rounds) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"medians of {args.rounds} rounds, warm page cache")
    print(f"{'size':>8} {'check ms':>9} {'restore ms':>11} {'check/restore':>14} "
          f"{'resume ms':>10} {'full verify ms':>15}")  # fmt: skip
    for r in results:
        print(
            f"{r['bytes'] / 2**20:>6.0f}MB {r['check_s'] * 1e3:>9.1f} {r['restore_s'] * 1e3:>11.1f}"
            f" {r['check_s'] / r['restore_s']:>14.3f} {r['resume_s'] * 1e3:>10.1f}"
            f" {r['full_s'] * 1e3:>15.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
