"""The replicator and Orbax checkpoints, on steps a real ``CheckpointManager`` wrote
(JAX on CPU, in this process): adaptd's destinations hold TensorFlow's files, so an
Orbax job has nothing queued, neither a finalized step nor one still being written,
and the daemon says so once instead of reporting its files missing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from adaptd import events as ev
from adaptd.checkpoints.orbax import finalized_steps, holds_orbax
from adaptd.config import loader as config
from adaptd.protocol import job as p
from adaptd.tiers.replicator import Replicator
from jax_orbax.jobs import MISSING

CONFIG = """
[destinations.nfs]
url = "{dest}"

[jobs."jax-job"]
staging = "{staging}"
replicate_to = ["nfs"]
"""


@pytest.fixture(scope="module")
def orbax_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 1 and 2 finalized by Orbax, step 3 as Orbax names a write in progress."""
    pytest.importorskip("orbax.checkpoint", reason=MISSING)
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    root = tmp_path_factory.mktemp("orbax") / "ckpts"
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    with ocp.CheckpointManager(root, options=options) as manager:
        for step in (1, 2, 3):
            manager.save(step, args=ocp.args.StandardSave({"w": jnp.full(4, float(step))}))
        manager.wait_until_finished()
    (root / "3").rename(root / "3.orbax-checkpoint-tmp-1")  # never committed
    return root


def test_orbax_steps_finalized_or_not_are_never_queued_and_said_once(
    orbax_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert sorted(finalized_steps(orbax_dir)) == [1, 2] and holds_orbax(orbax_dir)
    assert not holds_orbax(tmp_path) and not holds_orbax(tmp_path / "missing")
    dest = tmp_path / "nfs"
    rep = Replicator(config.loads(CONFIG.format(dest=dest, staging=orbax_dir)))
    caplog.set_level(logging.WARNING, logger="adaptd.replicator")
    for step in (2, 3):  # a finalized step, and the one still being written
        report = p.SaveReport(v=p.VERSION, job="jax-job", rank=0, step=step, blocking_s=0.1,
                              durable_s=0.2, bytes=1)  # fmt: skip
        rep.on_event(ev.SaveReported(1.0, 1.0, "jax-job", report, True))
    rep._intake.put(("catch_up", "jax-job"))  # what start() queues for a configured job
    rep._intake.put(None)  # the end: the intake's work runs here, on this thread
    rep._intake_loop()
    assert rep.errors == 0
    assert all(r.pending_step is None and r.uploading_step is None for r in rep.status())
    assert not dest.exists() or not any(dest.rglob("*"))
    told = [r for r in caplog.records if "replicate_unsupported" in r.getMessage()]
    assert len(told) == 1 and "Orbax" in told[0].getMessage()
    assert not [r for r in caplog.records if "replicate_missing" in r.getMessage()]
