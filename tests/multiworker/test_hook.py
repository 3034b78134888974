"""A real 2-worker ``MultiWorkerMirroredStrategy`` job trained through
``AdaptiveCheckpointer`` (tests/multiworker/hook_worker.py): the hook agrees on every
save step in-band, so every rank's ``history`` lists the same steps, whatever the
timing of plan changes, a SIGTERM of the non-chief worker, or a SIGKILL and restart.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from faults.zygote import Zygote

from multiworker.cluster import HERE
from multiworker.forked import ForkedCluster

pytestmark = [pytest.mark.slow, pytest.mark.tf]

WORKERS = 2


def run(
    zygote: Zygote, workdir: Path, ckpt: Path, steps: int, **env: str
) -> tuple[list[int], list[dict[str, Any]]]:
    """Run the job to the end (or to a signal), its workers forked from ``zygote``
    (tests/multiworker/forked.py); exit codes and results."""
    full = {"CKPT": str(ckpt), "STEPS": str(steps), "ADAPTD_TEST_LOG": "INFO", **env}
    with ForkedCluster(zygote, workdir, WORKERS, HERE / "hook_worker.py", env=full) as cluster:
        codes = cluster.wait(timeout=180)
        return codes, [cluster.result(r) for r in range(WORKERS)]


def test_random_plan_changes_every_rank_saves_the_same_steps(tmp_path, zygote) -> None:
    ckpt = tmp_path / "ckpt"
    codes, (r0, r1) = run(zygote, tmp_path / "run", ckpt, 800, PLAN_CHANGES="1")
    assert codes == [0, 0]
    assert r0["saved"] == r1["saved"] and len(r0["saved"]) >= 20
    assert r0["kind"] == r1["kind"] == "coordination"
    plans = [r for r in r0["rounds"] if r[1] == "plan" and r[3]]
    assert len(plans) >= 100, f"only {len(plans)} plan changes were committed"
    assert r0["applied"] == r1["applied"]
    assert r0["failed"] == r1["failed"] == 0 and not r0["broken"] and not r1["broken"]
    # the chief's copies are the job's checkpoint; the other worker's went to scratch
    assert all(p.startswith(str(ckpt)) for p in r0["paths"])
    assert not any(p.startswith(str(ckpt)) for p in r1["paths"])
    assert sorted(int(p.name.split("-")[1].split(".")[0]) for p in ckpt.glob("ckpt-*.index"))
    assert r0["weights"] == r1["weights"]


def test_sigterm_of_the_non_chief_makes_both_save_one_agreed_step_and_stop(
    tmp_path, zygote
) -> None:
    codes, (r0, r1) = run(zygote, tmp_path / "run", tmp_path / "ckpt", 400, SIGTERM_AT="100")
    assert codes == [128 + signal.SIGTERM] * 2
    assert r0["exit"] == r1["exit"] == signal.SIGTERM
    assert r0["saved"] == r1["saved"]
    stops = [r for r in r0["rounds"] if r[1] == "stop" and r[3]]
    assert len(stops) == 1 and stops[0][2] == r0["saved"][-1] == r0["steps"] == r1["steps"]
    assert r0["steps"] >= 100


def test_sigkill_then_restart_resumes_every_rank_from_one_step_bit_exactly(
    tmp_path, zygote
) -> None:
    ckpt = tmp_path / "ckpt"
    env = {"CKPT": str(ckpt), "STEPS": "300", "SIGKILL_AT": "170", "ADAPTD_TEST_LOG": "INFO"}
    killed = ForkedCluster(zygote, tmp_path / "killed", WORKERS, HERE / "hook_worker.py", env=env)
    with killed as cluster:
        deadline = time.monotonic() + 180
        while cluster.procs[1].poll() is None:  # rank 1 kills itself at step 170
            assert time.monotonic() < deadline, cluster.tails()
            time.sleep(0.05)
        assert cluster.procs[1].returncode == -signal.SIGKILL
        cluster.kill()  # the chief is stuck in a collective with a dead peer
    codes, (a, b) = run(zygote, tmp_path / "resumed", ckpt, 300)
    assert codes == [0, 0]
    assert a["resumed_from"] == b["resumed_from"] == 160  # fixed:steps=40
    assert a["saved"] == b["saved"]
    codes, (ref, _) = run(zygote, tmp_path / "reference", tmp_path / "ref-ckpt", 300)
    assert codes == [0, 0]
    assert a["weights"] == b["weights"] == ref["weights"]


def test_under_one_adaptd_daemon_the_chiefs_daemon_plans_for_both(tmp_path, zygote) -> None:
    from adaptd.commands._spawn import running_daemon

    sock = tmp_path / "adaptd.sock"
    with running_daemon(sock, ["--policy", "fixed:steps=25"]):
        codes, (r0, r1) = run(
            zygote, tmp_path / "run", tmp_path / "ckpt", 300, SOCKET=f"ipc://{sock}", POLICY=""
        )
    assert codes == [0, 0]
    assert r0["saved"] == r1["saved"] and len(r0["saved"]) >= 5
    assert r0["weights"] == r1["weights"]
