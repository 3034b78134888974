"""Kill-and-resume digests of a real multi-worker job, beside the uninterrupted run's.

For each world size (``--workers``, default 2 and 3), the job of
``tests/multiworker/rank_worker.py`` (a ``MultiWorkerMirroredStrategy`` job on
localhost, CPU; each worker its own shard of a shuffled pipeline, read three ways: a
plain per-worker iterator with a per-rank ``tf.random.Generator``,
``experimental_distribute_dataset`` and ``distribute_datasets_from_function``; Adam; a
save every 10 of 50 steps) runs once uninterrupted, then once until rank
``--kill-rank`` (default: the last) SIGKILLs itself after step ``--kill-at``, then
again from its checkpoints. It prints, per world size, input style and rank, the step
the job resumed from and the sha256 (first 12 hex digits) of the final weights of
both runs, and whether the optimizer's variables, the step and the rank's next three
batches are identical too. Exit status 1 when any differs.

    python scripts/exact_resume.py
    python scripts/exact_resume.py --workers 2 --kill-at 23 --kill-rank 0 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the job's worker and its runner

from multiworker.rank_jobs import COMPARED, STYLES, run  # noqa: E402


def compare(
    root: Path, n: int, kill_rank: int, kill_at: int, styles: list[str]
) -> list[dict[str, Any]]:
    """One world size: the uninterrupted run, the killed one, the resumed one; a row per
    style and rank."""
    inputs = ",".join(styles)
    ref = run(root / "uninterrupted", n, root / "uninterrupted" / "ckpt", INPUTS=inputs)
    env = {"KILL_RANK": str(kill_rank), "KILL_AT": str(kill_at), "INPUTS": inputs}
    run(root / "killed", n, root / "ckpt", **env)
    resumed = run(root / "resumed", n, root / "ckpt", INPUTS=inputs)
    assert ref is not None and resumed is not None
    rows = []
    for style in styles:
        for rank in range(n):
            want, got = ref[rank][style], resumed[rank][style]
            rows.append(
                {
                    "workers": n,
                    "input": style,
                    "rank": rank,
                    "killed": f"rank {kill_rank} after step {kill_at}",
                    "resumed_from": got["resumed_from"],
                    "uninterrupted": want["weights"],
                    "killed_and_resumed": got["weights"],
                    "identical": all(got[k] == want[k] for k in COMPARED),
                }
            )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ("workers", "input", "rank", "killed", "resumed from", "uninterrupted",
            "killed+resumed", "identical")  # fmt: skip
    body = [
        (str(r["workers"]), r["input"], str(r["rank"]), r["killed"], str(r["resumed_from"]),
         r["uninterrupted"][:12], r["killed_and_resumed"][:12], "yes" if r["identical"] else "NO")
        for r in rows
    ]  # fmt: skip
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = [
        "  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *body]
    ]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="2,3", help="world sizes, comma-separated")
    parser.add_argument("--kill-at", type=int, default=37, help="step after which to kill")
    parser.add_argument("--kill-rank", type=int, default=None, help="default: the last rank")
    parser.add_argument("--inputs", default=",".join(STYLES), help="input styles, comma-separated")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="adaptd-exact-") as tmp:
        for n in (int(x) for x in args.workers.split(",")):
            kill_rank = n - 1 if args.kill_rank is None else args.kill_rank
            styles = args.inputs.split(",")
            rows += compare(Path(tmp) / f"w{n}", n, kill_rank, args.kill_at, styles)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
