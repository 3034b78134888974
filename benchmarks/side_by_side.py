"""Run one benchmark against two revisions of the code, in alternation, in one run.

A figure measured before a change on one day and after it on another says as much
about the machine (a shared 2-core VM: other people's tests) as about the change. This
runs the benchmark of each revision in turn, ``--pairs`` times, in one session, so
both see the same machine; each revision's figures are the medians over its runs.

Each revision is laid out the way it is installed (``adaptd/``, ``client/`` as
``adaptd/client``, ``policies/`` as ``adaptd/policies``) in a temporary directory and
put first on ``PYTHONPATH``, so the benchmark (and the daemon it starts) import that
revision's code and nothing of the checkout's. The benchmark script itself is taken
from the working tree, so both revisions run the same measurement; it must print one
JSON object with ``--json`` whose ``results`` maps a case to a dict of figures (as
``benchmarks/hook_cost.py`` does).

Usage::

    python benchmarks/side_by_side.py --base main -- benchmarks/hook_cost.py --steps 300000
    python benchmarks/side_by_side.py --base 38161c0 --head HEAD --pairs 5 --json -- \\
        benchmarks/hook_cost.py --steps 300000 --rounds 5

``--head`` defaults to the working tree (uncommitted changes included).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Source folder -> where it is installed inside the ``adaptd`` package (pyproject's
#: package-dir), the same mapping scripts/imports.py reads the tree by.
LAYOUT = {"adaptd": "adaptd", "client": "adaptd/client", "policies": "adaptd/policies"}


def _export(rev: str | None, into: Path) -> None:
    """Lay revision ``rev`` (None: the working tree) out as installed, under ``into``."""
    src = into / "src"
    if rev is None:
        skip = shutil.ignore_patterns("__pycache__")
        for folder in LAYOUT:
            shutil.copytree(ROOT / folder, src / folder, ignore=skip)
    else:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, *LAYOUT], capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(src, filter="data")
    for folder, target in LAYOUT.items():
        shutil.copytree(src / folder, into / "tree" / target, dirs_exist_ok=True)


def _run(tree: Path, script: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    path, *options = script
    out = subprocess.run(
        [sys.executable, str(Path(path).resolve()), *options, "--json"],
        capture_output=True, text=True, env=env, cwd=tree, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(script)} failed under {tree}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _where(tree: Path) -> str:
    code = "import adaptd.client, adaptd.policies; print(adaptd.client.__file__)"
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run(  # in ``tree``: the checkout's folders must not be on sys.path
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tree, check=True
    ).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision before (e.g. main)")
    parser.add_argument("--head", default=None, help="the revision after (default: working tree)")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- benchmark [its options]")
    args = parser.parse_args(argv)
    script = [a for a in args.script if a != "--"] if args.script else []
    if not script or args.pairs < 1:
        parser.error("give a benchmark after --, and --pairs >= 1")
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="adaptd-sbs-") as tmp:
        trees = {}
        for side, rev in (("base", args.base), ("head", args.head)):
            _export(rev, Path(tmp) / side)
            trees[side] = Path(tmp) / side / "tree"
            found = _where(trees[side])
            if not found.startswith(str(trees[side])):  # the checkout's install shadowed it
                raise SystemExit(f"{side}: adaptd.client imports from {found}, not {trees[side]}")
        for _ in range(args.pairs):
            for side in ("base", "head"):
                runs[side].append(_run(trees[side], script))
    figures = {
        side: {
            case: {k: statistics.median(r["results"][case][k] for r in got) for k in fields}
            for case, fields in got[0]["results"].items()
        }
        for side, got in runs.items()
    }
    labels = {"base": args.base, "head": args.head or "working tree"}
    if args.json:
        print(json.dumps({"script": script, "pairs": args.pairs, "revisions": labels,
                          "medians": figures, "runs": runs}))  # fmt: skip
        return 0
    print(f"{' '.join(script)}: {args.pairs} runs of each, alternating; medians")
    for case in figures["base"]:
        for key in figures["base"][case]:
            b, h = figures["base"][case][key], figures["head"][case][key]
            print(f"{case:<28} {key:<14} {labels['base']:>12}: {b:9.3f}"
                  f"   {labels['head']:>12}: {h:9.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
