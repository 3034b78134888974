"""Two tiers in the hook: the plan's saves to a local tier (host memory), every k-th
durable; a restart in place resumes from memory, exactly; a wiped or damaged memory
tier resumes from durable storage, exactly. Real TensorFlow in real subprocesses,
SIGKILL, and a real tmpfs (/dev/shm)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from tests.client.test_resume import kill_at, read_until, start

pytestmark = [pytest.mark.slow, pytest.mark.tf]

SHM = Path("/dev/shm")


@pytest.fixture
def memory_tier():
    if not SHM.is_dir():
        pytest.skip("no /dev/shm on this host")
    root = SHM / f"adaptd-test-{uuid.uuid4().hex[:8]}"
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_restart_in_place_resumes_from_memory_and_wiped_or_damaged_from_durable(
    tmp_path, memory_tier, zygote
):
    # fixed two tiers: a save every 5 steps, every 2nd durable: 5 local, 10 durable,
    # 15 local, 20 durable ...; killed once the save of 15 is reported (its write runs
    # beside the steps: on a loaded box it can end after step 17): memory holds 15,
    # durable 10
    common = ["--steps", "30", "--policy", "fixed:steps=5,durable_every=2",
              "--socket", f"ipc://{tmp_path}/none", "--step-sleep", "0.05"]  # fmt: skip
    ref_out = tmp_path / "ref.bin"
    ref = start(zygote, tmp_path / "ref", ref_out, *common)  # runs alongside, one tier

    results = {}
    for case in ("in place", "wiped", "damaged"):
        ckpt, out = tmp_path / case / "ckpt", tmp_path / case / "out.bin"
        local = memory_tier / case.replace(" ", "-")
        tier = ["--local-tier", str(local)]
        lines = kill_at(zygote, ckpt, out, r"saved 15 ok=True tier=local", *common, *tier)
        assert "saved 5 ok=True tier=local" in lines and "saved 10 ok=True" in lines
        # the durable directory holds only the durable saves; memory the newer local one
        assert [n for n in _files(ckpt) if n.endswith(".index")] == ["ckpt-10.index"]
        assert [n for n in _files(local) if n.endswith(".index")] == ["ckpt-15.index"]
        if case == "wiped":  # the host rebooted: its memory tier is gone
            shutil.rmtree(local)
        elif case == "damaged":
            data = next(local.glob("ckpt-15.data-*"))
            raw = bytearray(data.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            data.write_bytes(bytes(raw))
        proc = start(zygote, ckpt, out, *common, *tier)
        lines = read_until(proc, "done")
        assert proc.wait(60) == 0
        results[case] = (lines, out.read_bytes(), local)

    read_until(ref, "done")
    assert ref.wait(60) == 0
    want = ref_out.read_bytes()

    lines, got, local = results["in place"]
    assert lines[:2] == ["start 15", "tier local"]
    assert got == want, "resumed from memory: not bit-identical to the uninterrupted run"
    assert not local.exists(), "a clean end (final save durable) must free the memory tier"

    for case in ("wiped", "damaged"):
        lines, got, _ = results[case]
        assert lines[0] == "start 10" and "tier local" not in lines, case
        assert got == want, f"{case}: resumed from durable, not bit-identical"
