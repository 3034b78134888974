"""The TensorFlow hook's FrameworkAdapter, read from a real tf.train.CheckpointManager."""

from __future__ import annotations

from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client.framework import FrameworkAdapter  # noqa: E402
from adaptd.client.tensorflow_adapter import TensorFlowAdapter  # noqa: E402

pytestmark = pytest.mark.tf


def test_it_answers_what_the_protocol_asks_from_the_checkpoint_directory(tmp_path: Path) -> None:
    adapter = TensorFlowAdapter(tmp_path)
    assert isinstance(adapter, FrameworkAdapter)
    assert adapter.newest_durable() is None and adapter.finalized(3) is None
    var = tf.Variable([1.0, 2.0, 3.0])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=var), tmp_path, max_to_keep=2)
    for step in (3, 6, 9):
        manager.save(checkpoint_number=step)
    assert adapter.newest_durable() == 9
    assert adapter.finalized(3) is None  # no longer kept (max_to_keep=2)
    size = sum(p.stat().st_size for p in tmp_path.glob("ckpt-6.*"))
    assert adapter.finalized(6) == size > 0
    assert adapter.accelerators() == len(tf.config.list_physical_devices("GPU"))
    assert adapter.peer_failure(ValueError("unrelated")) is None
    lost = tf.errors.UnavailableError(None, None, "Socket closed")
    assert adapter.peer_failure(lost) is not None
