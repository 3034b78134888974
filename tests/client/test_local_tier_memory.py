"""The memory tier is bounded (issue 24 item 5): before each save the older copies go
while the new one would not fit in the budget, the newest copy always stays, and once
even that is too much the saves fall back to local disk with the reason logged; copies
superseded by a durable save are freed. Real TensorFlow writes to a real tmpfs; the
pressure is a small budget (an injected "available memory"), not a full RAM."""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client.save.local_tier import LocalTier, MemoryBudget, copies  # noqa: E402

pytestmark = pytest.mark.tf

SIZE = 1 << 20  # 1 MiB of float32 state


@pytest.fixture
def shm_dir(tmp_path):
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this host")
    d = Path("/dev/shm") / f"adaptd-test-{uuid.uuid4().hex[:8]}"
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _free(shm_dir: Path, memory: int) -> int:
    """Available memory on a host of ``memory`` free bytes: less what the tmpfs holds."""
    return memory - sum(f.stat().st_size for f in shm_dir.glob("*") if f.is_file())


def _tier(shm_dir: Path, fallback: Path, memory: int) -> tuple[LocalTier, tf.train.Checkpoint]:
    ckpt = tf.train.Checkpoint(v=tf.Variable(tf.zeros([SIZE // 4], tf.float32)))
    budget = MemoryBudget(0.5, available=lambda: _free(shm_dir, memory))
    return LocalTier(ckpt, shm_dir, fallback=fallback, budget=budget, keep=3), ckpt


def _save(tier: LocalTier, ckpt: tf.train.Checkpoint, step: int) -> None:
    prefix = tier.write(ckpt, step, tf.train.CheckpointOptions())
    tier.ended(prefix)


def test_a_memory_tier_keeps_what_fits_then_falls_back_to_disk(shm_dir, tmp_path, caplog):
    fallback = tmp_path / "disk"
    # budget: half of (available + held) = 2.5 MiB: two copies of 1 MiB fit, not three
    tier, ckpt = _tier(shm_dir, fallback, memory=5 * SIZE)
    assert tier.kind == "memory"
    for step in (1, 2, 3, 4):
        _save(tier, ckpt, step)
    steps = [s for s, _ in copies(shm_dir)]
    assert steps[-1] == 4 and len(steps) == 2, steps  # the oldest went; keep=3 not reached
    assert tier.directory == shm_dir and not tier.fell_back

    # pressure: almost nothing available, even the newest copy and one more do not fit
    tier.budget = MemoryBudget(0.5, available=lambda: SIZE // 4)
    with caplog.at_level(logging.WARNING, logger="adaptd.client"):
        _save(tier, ckpt, 5)
    assert [s for s, _ in copies(shm_dir)] == [4], "the newest copy in memory always stays"
    assert [s for s, _ in copies(fallback)] == [5]
    assert tier.directory == fallback and "over its budget" in tier.fell_back
    assert "saving to local disk" in caplog.text and "over its budget" in caplog.text

    # a durable save at 5 supersedes both tiers' copies: memory is freed
    tier.superseded(5)
    assert copies(shm_dir) == [] and copies(fallback) == []
    tier.close()
    assert not shm_dir.exists()


def test_a_bad_share_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="local_tier_memory"):
        MemoryBudget(0.0)
    with pytest.raises(ValueError, match="local_tier_memory"):
        MemoryBudget("half")  # type: ignore[arg-type]


def test_a_two_tier_plan_first_measures_a_local_save_then_follows_its_cadence(tmp_path):
    """``tiers`` probes with durable_every 1 until it knows δ₁: were every save durable,
    no local save would ever be measured. The run's first planned save goes to the local
    tier; then every k-th is durable; an unplanned save (the run's last) is durable."""
    import warnings

    from adaptd.client import AdaptiveCheckpointer

    v = tf.Variable(0.0)
    ckptr = AdaptiveCheckpointer(
        tmp_path / "ckpts", job="t", socket=f"ipc://{tmp_path}/none.sock",
        daemon_timeout=0.2, handle_sigterm=False, policy="fixed:steps=2,durable_every=1",
        local_tier=tmp_path / "local", v=v,
    )  # fmt: skip
    assert ckptr.restore_or_initialize() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "no daemon": expected here
        for _ in range(7):
            v.assign_add(1.0)
            ckptr.step()
    ckptr.close()
    tiers = [(r.step, r.tier) for r in ckptr.history]
    assert tiers == [(2, "local"), (4, ""), (6, ""), (7, "")], tiers
    assert not (tmp_path / "local").exists(), "superseded local copies are freed"


def test_a_requested_save_of_a_step_saved_only_locally_makes_it_durable(tmp_path):
    import warnings

    from adaptd.client import AdaptiveCheckpointer

    v = tf.Variable(0.0)
    ckptr = AdaptiveCheckpointer(
        tmp_path / "ckpts", job="t", socket=f"ipc://{tmp_path}/none.sock",
        daemon_timeout=0.2, handle_sigterm=False, policy="fixed:steps=2,durable_every=3",
        local_tier=tmp_path / "local", save_on_close=False, v=v,
    )  # fmt: skip
    assert ckptr.restore_or_initialize() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "no daemon": expected here
        for _ in range(2):
            v.assign_add(1.0)
            ckptr.step()
        ckptr.save("before the evaluation")  # step 2 was saved to the local tier only
    ckptr.close()
    assert [(r.step, r.tier) for r in ckptr.history] == [(2, "local"), (2, "")]
