"""A policy from another distribution, installed with an entry point, is picked up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PLUGIN = """
from dataclasses import dataclass

from adaptd.policies import Decision, JobState, Snapshot


@dataclass(frozen=True)
class EveryN:
    n: int = 7

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        return Decision(next_step=(job.step // self.n + 1) * self.n, every_steps=self.n,
                        reason=f"every {self.n}", policy="every_n")
"""

PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "adaptd-every-n"
version = "1.2.3"

[project.entry-points."adaptd.policies"]
every_n = "adaptd_every_n:EveryN"

[tool.setuptools]
py-modules = ["adaptd_every_n"]
"""

ADAPTD = [sys.executable, "-c", "import sys; from adaptd.cli import main; sys.exit(main())"]


@pytest.mark.slow
def test_installed_plugin_is_listed_parsed_and_simulated(tmp_path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "adaptd_every_n.py").write_text(textwrap.dedent(PLUGIN))
    (src / "pyproject.toml").write_text(PYPROJECT)
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    listed = subprocess.run(
        [*ADAPTD, "policies", "--json"], env=env, capture_output=True, text=True, check=True
    )
    found = json.loads(listed.stdout)
    assert found["every_n"] == "adaptd_every_n:EveryN (adaptd-every-n 1.2.3)"
    out = subprocess.run(
        [
            *ADAPTD,
            "simulate",
            "--scenario",
            "seed-article",
            "--policy",
            "every_n:n=1000",
            "--policy",
            "every_n:n=1000+risk",
            "--seeds",
            "1",
            "--json",
            "--jobs",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    results = json.loads(out.stdout)["results"]
    assert [r["saves"] for r in results] == [499.0, 499.0]  # 500,000 steps / 1000, not at the end
