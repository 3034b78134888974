"""Mutation testing of adaptd's pure core with mutmut 3 (``make mutants``, docs/testing.md).

Why a script rather than a bare ``mutmut run``:

- mutmut names a mutant after the module its file path spells (``policies/daly.py`` ->
  ``policies.daly``) and switches it on only where the running function's ``__module__``
  matches that name. Our ``package-dir`` mapping installs ``policies/`` as
  ``adaptd.policies``, so run in the repository itself mutmut would mutate a
  ``policies.daly`` that no test imports, and every policy mutant would survive untested.
  The script therefore stages the installed layout (``adaptd/``, ``adaptd/policies/``,
  ``adaptd/client/``, ``tests/``, ``pyproject.toml``) and runs mutmut there: its
  ``mutants/`` copy comes first on ``sys.path``, so the tests import the mutated
  ``adaptd.policies.daly`` whose ``__module__`` is the name mutmut gave it.
- Each area gets its own staged tree, ``build/mutmut/<area>/``, with its own files to
  mutate and its own small test selection (AREAS below, added to the ``[tool.mutmut]``
  of pyproject.toml in the staged copy). mutmut keeps one test selection per tree and
  throws away every verdict when it changes, so areas sharing one tree would either
  share one large selection (every surviving policy mutant paying for the simulator's
  tests) or keep invalidating each other.

Results persist in each area's ``mutants/``; a later run re-tests only what changed (or,
with ``--survivors``, only the mutants that survived). Prints a score per module and the
surviving mutants; ``mutmut show NAME`` in the area's tree shows one.

    python scripts/mutants.py                        # every area, one after the other
    python scripts/mutants.py model policies         # some of them
    python scripts/mutants.py --survivors model      # re-test only last run's survivors
    python scripts/mutants.py --report               # only print the last scores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "mutmut"
MUTMUT = Path(sys.executable).parent / "mutmut"

# Each area: the files mutated (paths of the staged tree) and the tests that may kill
# them, the fast ones of that area only. Not the slow ones (under mutmut's trampolines the
# simulator runs ~5x slower, so the closed-form checks marked slow would cost a minute for
# every surviving mutant), nor those that start a subprocess (the CLI, seconds each).
AREAS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "model": (
        ("adaptd/core/model.py", "adaptd/core/multilevel.py"),
        (
            "tests/model/test_model.py",
            "tests/model/test_multilevel.py",
            "tests/policies/test_policies.py",
            "tests/policies/test_tiers_policy.py",
        ),
    ),
    "estimators": (
        ("adaptd/core/estimators.py", "adaptd/core/failure_rates.py"),
        ("tests/model",),
    ),
    "sim": (
        (
            "adaptd/sim/engine.py",
            "adaptd/sim/runner.py",
            "adaptd/sim/scenario.py",
            "adaptd/sim/theory.py",
            "adaptd/sim/theory_tiers.py",
            "adaptd/sim/oracles.py",
            "adaptd/sim/classes.py",
            "adaptd/sim/inflight.py",
        ),
        ("tests/sim", "--deselect=tests/sim/test_sim.py::test_cli_json_contract"),
    ),
    "policies": (("adaptd/policies/*",), ("tests/policies", "tests/test_policy_core.py")),
    "protocol": (
        ("adaptd/protocol/job.py",),
        # test_agreement: the rank records' JSON (encode_json, decode_rank)
        (
            "tests/test_protocol.py",
            "tests/faults/test_validation_fuzz.py",
            "tests/test_agreement.py",
        ),
    ),
    "agreement": (("adaptd/core/agreement.py",), ("tests/test_agreement.py",)),
}

# The modules scored, each with the area whose tree holds its mutants.
MODULES = {
    "adaptd.core.model": "model",
    "adaptd.core.multilevel": "model",
    "adaptd.core.estimators": "estimators",
    "adaptd.core.failure_rates": "estimators",
    "adaptd.sim.engine": "sim",
    "adaptd.sim.runner": "sim",
    "adaptd.sim.scenario": "sim",
    "adaptd.sim.theory": "sim",
    "adaptd.sim.theory_tiers": "sim",
    "adaptd.sim.oracles": "sim",
    "adaptd.sim.classes": "sim",
    "adaptd.sim.inflight": "sim",
    "adaptd.policies": "policies",
    "adaptd.protocol.job": "protocol",
    "adaptd.core.agreement": "agreement",
}

# Where each part of the repository lives once installed (pyproject's package-dir).
LAYOUT = (("adaptd", "adaptd"), ("policies", "adaptd/policies"), ("client", "adaptd/client"))

# mutmut's exit codes (mutmut's status_by_exit_code) that count as killed: a test failed,
# the mutant timed out or crashed, or it was caught by the type checker.
KILLED = {1, 3, 36, -24, 24, 152, 255, -11, -9, 37}
SURVIVED = 0
NO_TESTS = {5, 33}


def stage(area: str) -> Path:
    """Copy the sources into the installed layout under ``build/mutmut/<area>/`` and write
    its pyproject.toml with the area's files and tests; return the tree. copy2 keeps
    mtimes, so mutmut regenerates the mutants of a file only when that file changed."""
    tree = BUILD / area
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for src, dst in LAYOUT:
        shutil.copytree(ROOT / src, tree / dst, ignore=ignore, dirs_exist_ok=True)
    shutil.copytree(ROOT / "tests", tree / "tests", ignore=ignore, dirs_exist_ok=True)
    mutate, tests = AREAS[area]
    selection = [*tests, "-m", "not slow"]
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    try:
        at = lines.index("[tool.mutmut]") + 1
    except ValueError:
        raise SystemExit("pyproject.toml has no [tool.mutmut] table: restore it") from None
    # JSON arrays of plain strings are TOML arrays too.
    added = [
        f"only_mutate = {json.dumps(list(mutate))}",
        f"pytest_add_cli_args_test_selection = {json.dumps(selection)}",
    ]
    text = "\n".join(lines[:at] + added + lines[at:]) + "\n"
    target = tree / "pyproject.toml"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return tree


def run_area(area: str, max_children: int, only_survivors: bool) -> float:
    """Run mutmut on one area's mutants (or only on those that survived the last run);
    return the seconds it took."""
    started = time.monotonic()
    tree = stage(area)
    names: list[str] = []
    if only_survivors:
        codes = {k: c for m, a in MODULES.items() if a == area for k, c in results(m).items()}
        names = sorted(k for k, c in codes.items() if c == SURVIVED or c in NO_TESTS or c is None)
        if not names:
            print(f"== {area}: no survivors to re-run", flush=True)
            return 0.0
    cmd = [str(MUTMUT), "run", "--max-children", str(max_children), *names]
    print(f"== {area}: mutmut run ({len(names) or 'all'} mutants) in {tree}", flush=True)
    env = dict(os.environ, PYTHONHASHSEED="0")
    res = subprocess.run(cmd, cwd=tree, env=env, check=False)
    if res.returncode != 0:
        raise SystemExit(f"mutmut failed on {area} (exit {res.returncode}); see its output above")
    return time.monotonic() - started


def results(module: str) -> dict[str, int | None]:
    """Every mutant of ``module`` (a key of MODULES) with its exit code, None if not run,
    read from mutmut's .meta files."""
    codes: dict[str, int | None] = {}
    for meta in sorted((BUILD / MODULES[module] / "mutants").rglob("*.py.meta")):
        for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if key.startswith(module + "."):
                codes[key] = code
    return codes


def report(seconds: dict[str, float]) -> int:
    """Print a score per module and the survivors; return how many survived."""
    rows, survivors = [], []
    total_killed = total = 0
    for module, area in MODULES.items():
        codes = results(module)
        killed = sum(1 for c in codes.values() if c in KILLED)
        untested = [k for k, c in codes.items() if c in NO_TESTS]
        alive = [k for k, c in codes.items() if c == SURVIVED]
        unchecked = [k for k, c in codes.items() if c is None]
        n = len(codes) - len(unchecked)
        total_killed += killed
        total += n
        score = f"{100 * killed / n:5.1f}%" if n else "    -"
        rows.append(
            f"{module:20} {score} {killed:5}/{n:<5} survived {len(alive):3}  "
            f"no tests {len(untested):3}  not run {len(unchecked):3}"
        )
        survivors += [(area, name) for name in alive + untested]
    print("\nmodule                score  killed/all")
    print("\n".join(rows))
    if total:
        print(f"{'all':20} {100 * total_killed / total:5.1f}% {total_killed:5}/{total}")
    for area, took in seconds.items():
        print(f"{area}: {took:.0f} s")
    if survivors:
        print("\nsurvivors (mutmut show NAME in build/mutmut/AREA):")
        print("\n".join(f"  {area:10} {name}" for area, name in sorted(survivors)))
    return len(survivors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("areas", nargs="*", help=f"some of {', '.join(AREAS)} (default: all)")
    parser.add_argument(
        "--max-children", type=int, default=1, help="mutants tested at once (default 1)"
    )
    parser.add_argument("--report", action="store_true", help="only print the last scores")
    parser.add_argument(
        "--survivors", action="store_true", help="re-test only the mutants that survived last time"
    )
    args = parser.parse_args(argv)
    unknown = [a for a in args.areas if a not in AREAS]
    if unknown:
        parser.error(f"unknown area(s) {unknown}: choose from {', '.join(AREAS)}")
    seconds: dict[str, float] = {}
    if not args.report:
        if not MUTMUT.exists():
            parser.error(f"{MUTMUT} not found: install the dev extra (pip install -e '.[dev]')")
        for area in args.areas or AREAS:
            seconds[area] = run_area(area, args.max_children, args.survivors)
    report(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
