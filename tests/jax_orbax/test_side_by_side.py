"""A TensorFlow job and an Orbax (JAX) job on one daemon: the same plan decides both,
both jobs' saves reach it, and ``adaptd status`` shows them side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jax_orbax.jobs import MISSING, OrbaxJob

pytest.importorskip("orbax.checkpoint", reason=MISSING)

from adaptd.commands._spawn import running_daemon

pytestmark = [pytest.mark.slow, pytest.mark.tf, pytest.mark.jax]


def test_a_tensorflow_job_and_an_orbax_job_share_one_daemon(short_dir: Path, zygote) -> None:
    sock = short_dir / "d.sock"
    with running_daemon(sock, ["--policy", "fixed:steps=40"]):
        tf_job = zygote.spawn(
            ["--dir", short_dir / "tf", "--steps", 130, "--socket", sock, "--job", "tf-job"],
            module="adaptd.client.demo_job", reader=False,
        )  # fmt: skip
        jax_job = OrbaxJob(short_dir / "jax.log", "--dir", short_dir / "jax", "--job", "jax-job",
                           "--steps", 130, "--socket", sock)  # fmt: skip
        try:
            end = jax_job.finish()
            assert tf_job.wait(180) == 0
            status = subprocess.run(
                [sys.executable, "-m", "adaptd.cli", "status", "--socket", str(sock)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            listed = subprocess.run(
                [sys.executable, "-m", "adaptd.cli", "status", "--json", "--socket", str(sock)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        finally:
            jax_job.close()
            tf_job.kill()
    assert status.returncode == 0, status.stderr
    assert "tf-job" in status.stdout and "jax-job" in status.stdout
    jobs = {j["job"]: j for j in json.loads(listed.stdout)["jobs"]}
    # the daemon's plan (its --policy) decided both; each job's saves reached it
    assert [r["step"] for r in end["reports"]] == [40, 80, 120]
    assert jobs["jax-job"]["saves"] == 3 and jobs["jax-job"]["state"] == "finished"
    assert jobs["tf-job"]["saves"] >= 3 and jobs["tf-job"]["state"] == "finished"
    assert jobs["jax-job"]["policy"] == jobs["tf-job"]["policy"]
