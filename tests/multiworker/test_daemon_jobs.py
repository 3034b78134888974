"""Multi-rank jobs through ``AdaptiveCheckpointer`` on a real ``adaptd serve``
(tests/multiworker/hook_worker.py): three independent processes of one job agreeing
through the daemon's rounds, and a 2-worker ``MultiWorkerMirroredStrategy`` job whose
daemon is SIGKILLed and restarted mid-run. Every rank saves the same steps; nothing
hangs (every wait has a deadline).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from faults.zygote import Zygote

from adaptd.protocol import admin
from multiworker.cluster import HERE
from multiworker.daemons import DEADLINE, ENDLESS, JOB, job_info, serve, stop_job, wait_for
from multiworker.forked import ForkedCluster

pytestmark = [pytest.mark.slow, pytest.mark.tf]


def test_three_processes_without_a_runtime_agree_through_the_daemon(
    short_dir: Path, zygote: Zygote
) -> None:
    sock = short_dir / "a" / "d.sock"
    env = {
        "CKPT": str(short_dir / "ckpt"),
        "STEPS": "2500",
        "STEP_S": "0.004",
        "NO_STRATEGY": "1",  # TF_CONFIG names the ranks; no coordination service
        "SOCKET": f"ipc://{sock}",
        "POLICY": "",
        "DAEMON_TIMEOUT": "5",
        "ADAPTD_TEST_LOG": "INFO",
    }
    rng = random.Random(3)
    daemon = serve(short_dir, "a", "fixed:steps=25")
    try:
        with ForkedCluster(
            zygote, short_dir / "run", 3, HERE / "hook_worker.py", env=env
        ) as cluster:
            joined = wait_for(
                "three ranks", lambda: (j := job_info(sock)) and len(j.ranks) == 3 and j, cluster
            )
            assert joined.agreement == "daemon"
            for i in range(105):  # at random moments
                spec = f"fixed:steps={rng.randint(5, 40)}"
                reply = admin.request(sock, admin.SetPolicyRequest(job=JOB, spec=spec), 10.0)
                assert isinstance(reply, admin.SetPolicyReply), reply
                if i % 30 == 29:
                    reply = admin.request(sock, admin.SaveNowRequest(job=JOB, reason="op"), 10.0)
                    assert isinstance(reply, admin.SaveNowReply), reply
                time.sleep(rng.uniform(0.0, 0.03))
            still_running = all(p.poll() is None for p in cluster.procs)
            results = cluster.wait_ok(timeout=DEADLINE)
    finally:
        daemon.kill()
        daemon.wait()
    assert still_running, "the job ended before the operator was done: make it longer"
    saved = [r["saved"] for r in results]
    assert saved[0] == saved[1] == saved[2] and len(saved[0]) >= 10, saved
    assert all(r["kind"] == "daemon" and r["failed"] == 0 for r in results)
    committed = [x for x in results[0]["rounds"] if x[3]]
    assert len(committed) >= 10  # the plan changes did go through rounds
    assert results[0]["applied"] == results[1]["applied"] == results[2]["applied"]


def test_a_daemon_sigkilled_and_restarted_under_a_two_worker_job(
    short_dir: Path, zygote: Zygote
) -> None:
    sock = short_dir / "a" / "d.sock"
    env = {
        "CKPT": str(short_dir / "ckpt"),
        "STEPS": ENDLESS,
        "STEP_S": "0.004",
        "SOCKET": f"ipc://{sock}",
        "POLICY": "",
        "DAEMON_TIMEOUT": "1",
        "ADAPTD_TEST_LOG": "INFO",
    }
    daemon = serve(short_dir, "a", "fixed:steps=15")
    try:
        with ForkedCluster(
            zygote, short_dir / "run", 2, HERE / "hook_worker.py", env=env
        ) as cluster:
            before = wait_for("three saves", lambda: (j := job_info(sock)) and j.saves >= 3 and j,
                              cluster)  # fmt: skip
            daemon.kill()  # SIGKILL: no goodbye, the socket file stays
            daemon.wait()
            daemon = serve(short_dir, "a", "fixed:steps=15")  # same socket and state
            back = wait_for(
                "both ranks back, 50 steps on",
                lambda: (
                    (j := job_info(sock))
                    and sum(r.alive for r in j.ranks) == 2
                    and j.step >= before.step + 50
                    and j
                ),
                cluster,
            )
            reply = admin.request(sock, admin.SetPolicyRequest(job=JOB, spec="fixed:steps=9"))
            assert isinstance(reply, admin.SetPolicyReply), reply
            wait_for("50 more steps", lambda: (j := job_info(sock)) and j.step >= back.step + 50,
                     cluster)  # fmt: skip
            r0, r1 = stop_job(cluster)
    finally:
        daemon.kill()
        daemon.wait()
    assert back.decided_here
    assert r0["saved"] == r1["saved"] and len(r0["saved"]) >= 6
    gaps = {b - a for a, b in zip(r0["saved"], r0["saved"][1:], strict=False)}
    assert 9 in gaps  # the restarted daemon's plan was agreed and followed
    assert r0["weights"] == r1["weights"]
    assert not r0["broken"] and not r1["broken"]
