"""Waiting for TensorFlow's async checkpoint write, and taking the error it stored.

Both reach into TensorFlow's async checkpoint helper
(``tensorflow/python/checkpoint/async_checkpoint_helper.py``: ``_async_checkpointer_impl``,
its ``_queue``, ``_async_save_thread`` and ``_async_error``), so they live here, once,
for every checkpoint the hook writes (the replicated state and a rank's own part).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["clear_async_error", "wait_for_write"]


def wait_for_write(ckpt: tf.train.Checkpoint) -> None:
    """Wait until TF's async thread has finished the write it was given.

    ``checkpoint.sync()`` (``queue.join()``) never returns once TF's own atexit hook
    has run: it ends the thread by queueing ``False``, which is never marked done.
    So wait for the queue to drain *or* the thread to end, whichever comes first.
    """
    helper = getattr(ckpt, "_async_checkpointer_impl", None)
    q = getattr(helper, "_queue", None)
    thread = getattr(helper, "_async_save_thread", None)
    if q is None or thread is None or not hasattr(q, "all_tasks_done"):
        ckpt.sync()
        return
    with q.all_tasks_done:
        while q.unfinished_tasks and thread.is_alive():
            q.all_tasks_done.wait(0.1)


def clear_async_error(ckpt: tf.train.Checkpoint) -> BaseException | None:
    """Take the error TF's async thread stored, so it is reported once by us instead of
    being raised into the next save (or at interpreter exit)."""
    helper = getattr(ckpt, "_async_checkpointer_impl", None)
    err = getattr(helper, "_async_error", None)
    if err is not None:
        helper._async_error = None
    return err
