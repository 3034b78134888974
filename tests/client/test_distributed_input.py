"""A tf.distribute iterator made checkpointable (adaptd/client/distributed_input.py).

These tests fail when TensorFlow moves what that module relies on: the private
layout of ``DistributedIterator`` (its per-worker iterators, their dataset, devices,
options and inner iterator) and the rule that ``PER_REPLICA`` without fetching to the
device reads a worker's dataset through a plain iterator. A strategy with one CPU
replica in this process stands for one worker of a multi-worker job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client import AdaptiveCheckpointer  # noqa: E402
from adaptd.client.save import distributed_input  # noqa: E402

pytestmark = pytest.mark.tf

STYLES = ("distribute", "function")


def dataset() -> tf.data.Dataset:
    return tf.data.Dataset.range(200).shuffle(64, seed=3).repeat().batch(4)


def iterator(strategy: tf.distribute.Strategy, style: str):
    if style == "distribute":
        return iter(strategy.experimental_distribute_dataset(dataset()))
    return iter(strategy.distribute_datasets_from_function(lambda ctx: dataset()))


@pytest.fixture(scope="module")
def strategy() -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(["/cpu:0"])


def take(it, n: int) -> list[list[int]]:
    return [next(it).numpy().tolist() for _ in range(n)]


def test_tensorflow_keeps_the_iterator_where_adaptd_reaches_for_it(strategy) -> None:
    from tensorflow.python.distribute import input_lib

    for style in STYLES:
        it = iterator(strategy, style)
        assert isinstance(it, input_lib.DistributedIterator)
        (worker,) = it._iterators
        for attr in ("_iterator", "_dataset", "_devices", "_worker", "_options"):
            assert hasattr(worker, attr), f"{style}: TensorFlow moved {attr}"
        assert len(worker._devices) == 1
        assert hasattr(it, "_options")
        # the combination adaptd sets is the one TensorFlow reads with a plain iterator
        plain = distributed_input._plain(worker._options)
        assert not input_lib._should_use_multi_device_iterator(plain)


@pytest.mark.parametrize("style", STYLES)
def test_a_distributed_iterator_resumes_exactly_from_its_checkpoint(
    strategy, style, tmp_path
) -> None:
    it = iterator(strategy, style)
    (inner,) = distributed_input.per_worker_iterators("data", it)
    assert isinstance(inner, tf.data.Iterator)
    assert distributed_input.per_worker_iterators("data", it) == [inner]  # made once
    take(it, 7)
    ckpt = tf.train.Checkpoint(data=[inner])
    path = ckpt.write(str(tmp_path / "it"))
    after = take(it, 30)  # crosses an epoch boundary: a reshuffled order

    fresh = iterator(strategy, style)
    again = distributed_input.per_worker_iterators("data", fresh)
    tf.train.Checkpoint(data=again).read(path).assert_consumed()
    assert take(fresh, 30) == after


def test_the_made_iterator_still_passes_into_a_tf_function(strategy) -> None:
    # its type spec is built from the options adaptd set: it must match the iterator
    traced, eager = iterator(strategy, "distribute"), iterator(strategy, "distribute")
    distributed_input.per_worker_iterators("data", traced)
    distributed_input.per_worker_iterators("data", eager)

    @tf.function
    def two(it):
        return next(it), next(it)

    a, b = two(traced)
    assert [a.numpy().tolist(), b.numpy().tolist()] == take(eager, 2)
    assert take(traced, 3) == take(eager, 3)


def test_a_distributed_dataset_is_refused_saying_to_pass_its_iterator(strategy, tmp_path) -> None:
    ds = strategy.experimental_distribute_dataset(dataset())
    with pytest.raises(distributed_input.UnsupportedInput, match=r"data_iterator=iter\(dataset\)"):
        AdaptiveCheckpointer(
            tmp_path, job="j", socket=f"ipc://{tmp_path}/none.sock", handle_sigterm=False,
            data_iterator=ds,
        )  # fmt: skip


def test_an_iterator_onto_several_devices_is_refused_when_the_hook_is_built(tmp_path) -> None:
    # two logical CPUs must be set before TensorFlow starts: a process of its own
    script = textwrap.dedent(
        f"""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from adaptd.client import AdaptiveCheckpointer
        from adaptd.client.save.distributed_input import UnsupportedInput
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        ds = tf.data.Dataset.range(8).batch(2)
        it = iter(strategy.experimental_distribute_dataset(ds))
        try:
            AdaptiveCheckpointer({str(tmp_path)!r}, job="j", handle_sigterm=False,
                                 socket="ipc://{tmp_path}/none.sock", data_iterator=it)
        except UnsupportedInput as exc:
            print("REFUSED", exc)
        """
    )
    env = {"CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={**os.environ, **env},
    )  # fmt: skip
    assert "REFUSED data_iterator= reads onto 2 devices in this process" in out.stdout, out.stderr
    assert "one device per worker process" in out.stdout
