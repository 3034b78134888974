"""benchmarks/gpu_check.py runs end to end (``--small``: 1 MiB and 8 MiB on CPU), with
TensorFlow unimportable as on the GPU hosts it is written for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jax_orbax.jobs import _NO_TF, ENV, MISSING

pytest.importorskip("orbax.checkpoint", reason=MISSING)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.jax]


def test_the_gpu_check_runs_small_and_records_every_figure(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", _NO_TF, str(ROOT / "benchmarks" / "gpu_check.py"),
           "--small", "--steps", "8", "--every", "4", "--cost-steps", "2000",
           "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["tensorflow_importable"] is False
    cases = {(c["bytes"], c["mode"]): c for c in result["cases"]}
    assert set(cases) == {(s, m) for s in (1 << 20, 8 << 20) for m in ("async", "sync")}
    for (size, _mode), case in cases.items():
        assert case["saves"] == 2 and all(s > 0 for s in case["stall_s"])
        assert [r["step"] for r in case["adaptd_reports"]] == [4, 8]
        first = case["adaptd_reports"][0]
        assert first["ok"] and 0.9 * size < first["bytes"] < 1.2 * size
    costs = result["per_step_cost"]["results"]
    assert set(costs) == {"no daemon (embedded policy)", "daemon connected"}
    fixture = json.loads((tmp_path / "nvml_fixture.json").read_text())
    assert result["nvml"]["rc"] == 0 and "init" in fixture
    assert "policy per-step cost" in done.stdout
