"""A ``tf.distribute`` input iterator made checkpointable: the one module that touches
TensorFlow's private attributes of ``DistributedIterator``.

``iter(strategy.experimental_distribute_dataset(ds))`` and
``iter(strategy.distribute_datasets_from_function(fn))`` give a
``tf.distribute.DistributedIterator``, which ``tf.train.Checkpoint`` refuses ("expecting
it to be a trackable object", TF 2.21). Inside, it holds one iterator per input worker
of this process (``_iterators``, each a ``_SingleWorkerOwnedDatasetIterator``) over that
worker's own dataset (``_dataset``: sharded and rebatched by TensorFlow already),
which it reads through an ``OwnedMultiDeviceIterator`` (``_iterator``): a prefetching
buffer whose position TensorFlow cannot save.

:func:`per_worker_iterators` makes it checkpointable without changing what it yields
from then on: for each worker iterator with one device (one process per accelerator,
or a CPU) it puts a plain ``tf.data`` iterator over the same dataset, on the worker's
host device, in place of the multi-device one, and sets the input options (the worker
iterator's, and the distributed iterator's, from which its type spec is built, so it
still passes into a ``tf.function``) to ``PER_REPLICA`` without fetching to the
device: the combination in which TensorFlow itself reads a worker's dataset through a
plain iterator. The plain iterators are what the hook saves, each rank its own
(:mod:`adaptd.client.save.rank_state`). Elements stay in host memory until the step uses
them: a pipeline that wants them prefetched to the accelerator ends with
``.prefetch(...)``.

Call it before the first element is taken: the new iterators start at the beginning
of the dataset (the second iteration of it: the first was the multi-device iterator's,
so a reshuffled dataset's first epoch order is that of its second iteration). A worker
iterator with several devices (several GPUs in one process) is refused: which device
gets which element is then the multi-device iterator's own business.

``tests/client/test_distributed_input.py`` fails when TensorFlow moves what this relies on.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["SUPPORTED", "UnsupportedInput", "is_distributed", "per_worker_iterators"]

#: What the hook can resume exactly, for the messages that refuse anything else.
SUPPORTED = (
    "a tf.data iterator (iter(dataset), each worker its own shard), or iter() of "
    "strategy.experimental_distribute_dataset(...) or "
    "strategy.distribute_datasets_from_function(...) with one device per worker process"
)


class UnsupportedInput(ValueError):
    """An input the hook cannot save and resume exactly (the message says why and what
    is supported); raised when the hook is built, never at a resume."""


def is_distributed(obj: Any) -> bool:
    """``obj`` is a ``tf.distribute`` iterator or dataset (public types only)."""
    return isinstance(obj, (tf.distribute.DistributedIterator, tf.distribute.DistributedDataset))


def per_worker_iterators(key: str, obj: Any) -> list[Any]:
    """The plain ``tf.data`` iterators, one per input worker of this process, that
    ``obj`` (a ``DistributedIterator``) reads from now on (made so on the first call;
    later calls return the same ones).

    Raises:
        UnsupportedInput: ``obj`` is a distributed dataset rather than its iterator, a
            worker iterator has several devices or was rebuilt inside a
            ``tf.function``, or this TensorFlow keeps the iterator differently.
    """
    if isinstance(obj, tf.distribute.DistributedDataset):
        raise UnsupportedInput(
            f"{key}= is a distributed dataset; pass its iterator, {key}=iter(dataset), and "
            "read the batches from that same iterator"
        )
    from tensorflow.python.distribute import input_lib  # private: this module's business

    workers = getattr(obj, "_iterators", None)
    if not isinstance(obj, input_lib.DistributedIterator) or not isinstance(workers, list):
        raise UnsupportedInput(
            f"{key}= is a {type(obj).__name__} that adaptd cannot save with TensorFlow "
            f"{tf.__version__} (no per-worker iterators where they were); supported: {SUPPORTED}"
        )
    out = []
    for worker in workers:
        inner = getattr(worker, "_iterator", None)
        if isinstance(inner, tf.data.Iterator) and isinstance(
            inner, tf.__internal__.tracking.Trackable
        ):
            out.append(inner)  # made plain already
            continue
        devices = tuple(getattr(worker, "_devices", ()) or ())
        dataset = getattr(worker, "_dataset", None)
        if len(devices) != 1:
            raise UnsupportedInput(
                f"{key}= reads onto {len(devices)} devices in this process "
                f"({', '.join(devices)}); adaptd saves a distributed iterator's position "
                f"only with one device per worker process. Supported: {SUPPORTED}"
            )
        if dataset is None:
            raise UnsupportedInput(
                f"{key}= was rebuilt from its components (inside a tf.function?); pass the "
                f"iterator made by iter() in eager code. Supported: {SUPPORTED}"
            )
        with tf.device(worker._worker):
            plain = iter(dataset)
        worker._iterator = plain
        worker._options = _plain(worker._options)
        out.append(plain)
    obj._options = _plain(obj._options)
    return out


def _plain(options: Any) -> Any:
    """The input options under which TensorFlow reads a worker's dataset through a plain
    iterator (``PER_REPLICA``, not fetched to the device), the rest kept."""
    size = getattr(options, "experimental_per_replica_buffer_size", 1) or 1
    return tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=False,
        experimental_per_replica_buffer_size=size,
    )
