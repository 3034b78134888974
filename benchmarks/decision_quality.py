"""Decision quality: how much training time each policy wastes, on the built-in scenarios.

    .venv/bin/python benchmarks/decision_quality.py [--seeds 40] [--only SCENARIO] [--out FILE]

One comparison per scenario (all policies on the same seeds, so the same failure
times: common random numbers); waste = wall − useful time. Differences are paired
per seed, with their standard error. Targets (issue 4):

- llama3-16k: default (learning online from cold start) wastes at most 5% more than
  ``oracle`` (Daly with the true δ and M), and beats fixed:steps=50, fixed:steps=500
  and phased;
- nfs-storm: default beats the static oracle;
- weibull-fleet: weibull beats daly.

Each target also gets z = mean difference / its standard error: |z| < 2 means the
sign is not established by that many seeds (rerun with ``--only`` and more seeds).
Prints a Markdown report (and writes it to ``--out``); exit status 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from adaptd import sim
from adaptd.sim.runner import ProgressBar, Summary

PLAN = {
    "llama3-16k": ["oracle", "default", "daly", "fixed:steps=50", "fixed:steps=500", "phased"],
    "nfs-storm": ["oracle", "default", "daly", "fixed:steps=500", "phased"],
    "weibull-fleet": ["oracle", "daly", "weibull", "default", "phased"],
    "seed-article": ["oracle", "default", "fixed:steps=50", "phased", "budget"],
}


def paired(a: Summary, b: Summary) -> tuple[float, float]:
    """Mean and standard error over seeds of waste(a) − waste(b), in seconds."""
    diffs = [x.waste_s - y.waste_s for x, y in zip(a.runs, b.runs, strict=True)]
    err = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return statistics.fmean(diffs), err


def table(name: str, summaries: list[Summary], seconds: float) -> list[str]:
    s = sim.load(name)
    h = 3600.0
    out = [
        f"### {name}",
        "",
        f"{s.description.strip()}  ",
        f"{s.steps:,} steps × {s.step_time_s:g} s on {s.gpus:,} GPUs; "
        f"true δ = {s.save_cost_s:.3g} s, "
        f"job MTBF = {s.job_mtbf_s / h:.3g} h ({s.distribution}"
        + (f", shape {s.weibull_shape:g}" if s.distribution == "weibull" else "")
        + f"); {len(summaries[0].runs)} seeds in {seconds:.0f} s.",
        "",
        "| policy | goodput | waste h | checkpoint h | lost h | restart h | saves | failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in summaries:
        out.append(
            f"| `{x.policy}` | {x.goodput:.4%} | {x.waste_s / h:.2f} | "
            f"{x.mean('checkpoint_overhead_s') / h:.2f} | {x.mean('lost_work_s') / h:.2f} | "
            f"{x.mean('restart_s') / h:.2f} | {x.mean('saves'):.0f} | {x.mean('failures'):.1f} |"
        )
    return [*out, ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--only", choices=sorted(PLAN), action="append", help="run only this scenario (repeatable)"
    )
    args = ap.parse_args()
    plan = {k: v for k, v in PLAN.items() if not args.only or k in args.only}
    only = "".join(f" --only {k}" for k in args.only or ())
    results: dict[str, dict[str, Summary]] = {}
    lines = [
        "# Decision quality (issue 4)",
        "",
        f"Command: `.venv/bin/python benchmarks/decision_quality.py --seeds {args.seeds}{only}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
        "",
    ]
    timings = {}
    for name, specs in plan.items():
        start = time.monotonic()
        got = sim.compare(sim.load(name), specs, args.seeds, progress=ProgressBar(), jobs=args.jobs)
        timings[name] = time.monotonic() - start
        results[name] = {x.policy: x for x in got}
        lines += table(name, got, timings[name])

    checks: list[tuple[str, bool, str]] = []

    def target(what: str, a: Summary, b: Summary, bound: float = 0.0) -> None:
        """waste(a) - waste(b) must be < bound x waste(b) (0: a beats b)."""
        d, e = paired(a, b)
        z = d / e if e > 0 else math.copysign(math.inf, d)
        how = f"{d / 3600:+.2f} ± {e / 3600:.2f} h, z = {z:+.1f}"
        if bound:
            how = f"{d / b.waste_s:+.2%} of oracle's waste ({how})"
        checks.append((what, d <= bound * b.waste_s if bound else d < 0, how))

    if L := results.get("llama3-16k"):
        target(
            "llama3-16k: default's excess waste over oracle ≤ 5% of oracle's waste",
            L["default"],
            L["oracle"],
            bound=0.05,
        )
        for other in ("fixed:steps=50", "fixed:steps=500", "phased"):
            target(f"llama3-16k: default beats {other}", L["default"], L[other])
    if N := results.get("nfs-storm"):
        target("nfs-storm: default beats static oracle", N["default"], N["oracle"])
    if W := results.get("weibull-fleet"):
        target("weibull-fleet: weibull beats daly", W["weibull"], W["daly"])

    lines += [
        "### Targets",
        "",
        "Differences are waste(first) − waste(second), paired by seed, mean ± standard error; "
        "z = mean / standard error.",
        "",
        "| target | met | measured |",
        "|---|---|---|",
    ]
    lines += [f"| {what} | {'yes' if ok else '**no**'} | {how} |" for what, ok, how in checks]
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
