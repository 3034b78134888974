"""Two tiers in a real multi-worker job (tests/multiworker/rank_worker.py, 2 workers):
each rank writes the local saves, the replicated state and its own part
(``ckpt-N.rank-RRRRR-of-WWWWW``), into its own local tier (here ``/dev/shm``, one
directory per rank as on separate hosts), every 2nd save durably into the job's
directory. A rank SIGKILLed, the job started again: the ranks agree on the newest step
every rank has in its local tier or the job's directory, and resume exactly (weights,
optimizer, step, next batches of the uninterrupted one-tier run); with one rank's
local tier wiped (its host rebooted), the job resumes exactly from durable storage."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from faults.zygote import Zygote

from multiworker.rank_jobs import COMPARED, run

pytestmark = [pytest.mark.slow, pytest.mark.tf]


def _two_tiers(shm: Path) -> dict[str, str]:
    return {"INPUTS": "plain", "STEPS": "40", "POLICY": "fixed:steps=10,durable_every=2",
            "ADAPTD_LOCAL_TIER": f"{shm}/{{job}}-{{rank}}"}  # fmt: skip


def test_ranks_resume_from_their_local_tiers_or_durable_exactly(tmp_path: Path, zygote: Zygote):
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this host")
    shm = Path("/dev/shm") / f"adaptd-test-{uuid.uuid4().hex[:8]}"
    wiped = shm.with_name(shm.name + "-wiped")
    try:
        ref = run(
            tmp_path / "ref", 2, tmp_path / "ref" / "ckpt", zygote, INPUTS="plain", STEPS="40"
        )
        assert ref is not None
        # killed after step 35: local saves 10 and 30 (10 superseded by durable 20)
        killed = run(tmp_path / "killed", 2, tmp_path / "ckpt", zygote, KILL_RANK="1",
                     KILL_AT="35", **_two_tiers(shm))  # fmt: skip
        assert killed is None
        durable = sorted(p.name for p in (tmp_path / "ckpt" / "plain").glob("*.index"))
        assert durable == ["ckpt-20.index", *(f"ckpt-20.rank-{r:05d}-of-00002.index"
                                               for r in range(2))]  # fmt: skip
        for rank in range(2):
            local = sorted(p.name for p in (shm / f"ranks-plain-{rank}").glob("*.index"))
            assert local == ["ckpt-30.index", f"ckpt-30.rank-{rank:05d}-of-00002.index"], local
        # the same state on a job whose rank 1 lost its local tier
        shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt-wiped")
        shutil.copytree(shm / "ranks-plain-0", wiped / "ranks-plain-0")

        for ckpt, tier, start in ((tmp_path / "ckpt", shm, 30),
                                  (tmp_path / "ckpt-wiped", wiped, 20)):  # fmt: skip
            resumed = run(tmp_path / f"resumed-{start}", 2, ckpt, zygote, **_two_tiers(tier))
            assert resumed is not None
            for rank in range(2):
                got, want = resumed[rank]["plain"], ref[rank]["plain"]
                assert got["resumed_from"] == start, (start, rank)
                for key in COMPARED:
                    assert got[key] == want[key], f"from {start}: rank {rank}: {key} differs"
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(wiped, ignore_errors=True)
