"""Two tiers in a real multi-worker job (tests/multiworker/rank_worker.py, 2 workers):
each rank writes the local saves, the replicated state and its own part
(``ckpt-N.rank-RRRRR-of-WWWWW``), into its own local tier (here ``/dev/shm``, one
directory per rank as on separate hosts), every 2nd save durably into the job's
directory; a rank SIGKILLed, the job started again resumes exactly (weights,
optimizer, step, next batches of the uninterrupted one-tier run) from durable storage:
the ranks agree on a step of the job's directory (the local tiers are not offered)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from multiworker.rank_jobs import COMPARED, run

pytestmark = [pytest.mark.slow, pytest.mark.tf]


def test_ranks_write_their_parts_to_their_local_tier_and_resume_exactly(tmp_path: Path):
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this host")
    shm = Path("/dev/shm") / f"adaptd-test-{uuid.uuid4().hex[:8]}"
    env = {"INPUTS": "plain", "STEPS": "40"}
    two = {**env, "POLICY": "fixed:steps=10,durable_every=2",
           "ADAPTD_LOCAL_TIER": f"{shm}/{{job}}-{{rank}}"}  # fmt: skip
    try:
        ref = run(tmp_path / "ref", 2, tmp_path / "ref" / "ckpt", **env)
        assert ref is not None
        # killed after step 35: local saves 10 and 30 (10 superseded by durable 20)
        assert run(tmp_path / "killed", 2, tmp_path / "ckpt", KILL_RANK="1", KILL_AT="35",
                   **two) is None  # fmt: skip
        durable = sorted(p.name for p in (tmp_path / "ckpt" / "plain").glob("*.index"))
        assert durable == ["ckpt-20.index", *(f"ckpt-20.rank-{r:05d}-of-00002.index"
                                               for r in range(2))]  # fmt: skip
        for rank in range(2):
            local = sorted(p.name for p in (shm / f"ranks-plain-{rank}").glob("*.index"))
            assert local == ["ckpt-30.index", f"ckpt-30.rank-{rank:05d}-of-00002.index"], local
        resumed = run(tmp_path / "resumed", 2, tmp_path / "ckpt", **two)
        assert resumed is not None
        for rank in range(2):
            got, want = resumed[rank]["plain"], ref[rank]["plain"]
            assert got["resumed_from"] == 20
            for key in COMPARED:
                assert got[key] == want[key], f"rank {rank}: {key} differs"
    finally:
        shutil.rmtree(shm, ignore_errors=True)
