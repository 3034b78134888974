"""The decision-quality benchmark, fast: one scenario, few seeds, in the suite.

It must check the simulator and the oracle against the closed form before it
reports, and exit non-zero when a check or a target fails (a wrong oracle used to
make every target look met)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "decision_quality.py"


@pytest.mark.slow
def test_the_benchmark_checks_the_oracle_and_its_targets(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "llama3-16k", "--seeds", "8", "--jobs", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = out.read_text(encoding="utf-8")
    sanity = report.split("### The simulator and the oracle against the closed form")[1]
    sanity = sanity.split("### llama3-16k")[0]
    # the oracle and both fixed intervals were held to the closed form, and held
    assert sanity.count("| yes |") == 3 and "`oracle` (every 141 steps)" in sanity
    targets = report.split("### Targets")[1]
    assert targets.count("| yes |") == 4 and "**no**" not in report
