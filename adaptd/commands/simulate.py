"""``adaptd simulate``: compare policies on a failure scenario.

    adaptd simulate --scenario llama3-16k --policy default --policy oracle --seeds 40 [--json]

``--scenario`` is a TOML file or a built-in name (``seed-article``, ``llama3-16k``,
``nfs-storm``, ``weibull-fleet``, ``slow-first-step``); each ``--policy`` is a spec
(``fixed:steps=50``, ``daly``, ``budget:overhead=0.035``, ``default``, or ``oracle``:
Daly with the scenario's true δ, M and step time). ``--json`` prints means over seeds as
``{"scenario": ..., "results": [{"policy", "goodput", "wall_s", "useful_s",
"checkpoint_overhead_s", "lost_work_s", "restart_s", "warmup_s", "saves", "failures"}]}``.
"""

from __future__ import annotations

import argparse
import json

from adaptd import tables
from adaptd.commands import UsageError
from adaptd.tables import Table

HELP = "compare policies on failure scenarios"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        required=True,
        metavar="FILE_OR_NAME",
        help="scenario TOML file or built-in name",
    )
    parser.add_argument(
        "--policy",
        action="append",
        required=True,
        metavar="SPEC",
        help="policy spec (repeatable), e.g. fixed:steps=50, daly, default, oracle",
    )
    parser.add_argument("--seeds", type=int, default=20, help="seeds per policy (default 20)")
    parser.add_argument(
        "--jobs", type=int, default=None, help="worker processes (default: the CPU count)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from adaptd import sim
    from adaptd.core.policy import PolicyError
    from adaptd.sim.runner import ProgressBar

    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    try:
        scenario = sim.load(args.scenario)
    except (sim.ScenarioError, OSError) as exc:
        raise UsageError(f"--scenario: {exc}") from None
    try:
        summaries = sim.compare(
            scenario, args.policy, args.seeds, progress=ProgressBar(), jobs=args.jobs
        )
    except PolicyError as exc:
        raise UsageError(f"--policy: {exc}") from None
    if args.json:
        doc = {"scenario": scenario.name, "results": [s.as_json() for s in summaries]}
        print(json.dumps(doc, indent=2))
        return 0
    tables.emit(parts(scenario, summaries, args.seeds))
    return 0


def table(scenario, summaries, seeds: int) -> str:  # type: ignore[no-untyped-def]
    """The comparison as plain text (what a pipe gets)."""
    return tables.plain(parts(scenario, summaries, seeds)).rstrip("\n")


def parts(scenario, summaries, seeds: int) -> list[tables.Part]:  # type: ignore[no-untyped-def]
    """The scenario line, the comparison table (means over seeds, hours), the legend."""
    h = 3600.0
    best = max(s.goodput for s in summaries)
    rows = [
        (
            s.policy,
            f"{s.goodput:.4%}",
            f"±{s.goodput_stderr():.3%}",
            f"{s.mean('wall_s') / h:.1f}",
            f"{s.mean('checkpoint_overhead_s') / h:.2f}",
            f"{s.mean('lost_work_s') / h:.2f}",
            f"{s.mean('restart_s') / h:.2f}",
            f"{s.mean('warmup_s') / h:.2f}",
            f"{s.mean('saves'):.1f}",
            f"{s.mean('failures'):.1f}",
            "*" if s.goodput == best else "",
        )
        for s in summaries
    ]
    header = ("policy", "goodput", "±", "wall h", "ckpt h", "lost h", "restart h",
              "warm-up h", "saves", "failures", "best")  # fmt: skip
    return [
        f"scenario {scenario.name}: {scenario.steps:,} steps x {scenario.step_time_s:g}s on "
        f"{scenario.gpus:,} GPUs, job MTBF {scenario.job_mtbf_s / h:.3g}h "
        f"({scenario.distribution}), δ={scenario.save_cost_s:.3g}s; means over {seeds} seeds\n",
        Table(header, rows, numeric=frozenset(range(1, 10))),
        "\ngoodput = useful / wall; ± is the standard error over seeds; * best",
    ]
