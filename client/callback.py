"""``model.fit`` integration: :class:`AdaptiveCheckpointCallback`.

A thin Keras callback around :class:`~adaptd.client.checkpointer.AdaptiveCheckpointer`
that resumes the way ``keras.callbacks.BackupAndRestore`` does, but at step
granularity: on ``on_train_begin`` it restores the model, the optimizer (slots and
``iterations``), the Keras seed-generator states and the global step from the
newest checkpoint, tells ``fit`` to start at the epoch that step falls in, and skips
the batches of that epoch that were already trained (they are read from the input
pipeline, not trained on), so no step is trained twice.

The global step counts batches (``steps_per_execution`` batches per call count as
that many steps). Mapping a step to an epoch needs ``fit`` to know its steps per
epoch; with an input of unknown length the callback restores the state and the
step but cannot skip, and says so.

``fit`` builds its own input iterators, so the *position* and shuffle state of the
input pipeline are not checkpointed here; a resumed epoch sees the order that ``fit``
gives a new process. The resume is bit-identical when that order is the same every
epoch (arrays, ``tf.data`` without ``reshuffle_each_iteration``); docs/client.md
("Bit-identical resume with fit") says where it is not. For those, use a custom loop
with ``data_iterator=``.

What the other callbacks see after a resume inside an epoch: ``fit`` (Keras 3) has no
way to start an epoch at a batch other than 0 (``BackupAndRestore`` sets only the
initial epoch, and its resumed run trains the interrupted epoch again from batch 0),
and a callback cannot keep ``fit`` from calling the others. So the resumed epoch
runs through every batch index, as under ``BackupAndRestore``: each callback gets
``on_epoch_begin(epoch)``, then ``on_train_batch_begin(i)``/``on_train_batch_end(i,
logs)`` for ``i = 0 .. steps-1`` and ``on_epoch_end``, the same calls and indices as a
``BackupAndRestore`` run. The first ``resume_batch`` of them are the batches trained
before the interruption: they are read from the input and not trained again, and
their ``on_train_batch_end`` gets ``logs == {}`` (a trained batch always carries the
compiled metrics, at least ``loss``). A callback that logs or counts trained batches
skips empty logs, or compares with :attr:`~AdaptiveCheckpointCallback.resume_epoch`
and :attr:`~AdaptiveCheckpointCallback.resume_batch`; a per-batch schedule keyed on
the batch index gets the right index for every trained batch; Keras' progress bar
runs through the skipped batches at once, showing no loss for them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import keras

from adaptd.client.checkpointer import AdaptiveCheckpointer
from adaptd.core.policy import Policy

log = logging.getLogger("adaptd.client")


class AdaptiveCheckpointCallback(keras.callbacks.Callback):
    """Adaptive asynchronous checkpoints and automatic resume for ``model.fit``.

    Args:
        directory: where checkpoints go.
        job: job id shared by all ranks.
        max_to_keep, policy, socket, rank, world_size, daemon_timeout,
            handle_sigterm, writer_nice: as for :class:`AdaptiveCheckpointer`.
        save_on_end: save the final step when ``fit`` ends, so running the same
            ``fit`` again resumes at its end instead of redoing the tail.
        **trackables: more state to checkpoint next to the model and its
            optimizer (e.g. ``rng=`` a ``tf.random.Generator`` used by the model).

    Raises:
        ValueError: an argument is invalid (raised at construction for the
            callback's own arguments, at ``on_train_begin`` for the hook's).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        job: str,
        max_to_keep: int | None = 5,
        policy: str | Policy | None = None,
        socket: str | os.PathLike[str] | None = None,
        save_on_end: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise ValueError(f"directory must be a non-empty path, got {directory!r}")
        if not isinstance(job, str) or not job:
            raise ValueError(f"job must be a non-empty string, got {job!r}")
        for key in ("model", "optimizer"):
            if key in options:
                raise ValueError(
                    f"{key}= is taken from the model that fit() trains; do not pass it"
                )
        if "save_on_close" in options:
            raise ValueError("save_on_close= is the callback's save_on_end=; pass that instead")
        self.directory = directory
        self.job = job
        self._options = dict(options, max_to_keep=max_to_keep, policy=policy, socket=socket)
        self.save_on_end = bool(save_on_end)
        #: The hook, from ``on_train_begin`` on.
        self.checkpointer: AdaptiveCheckpointer | None = None
        #: The step ``fit`` resumed from (0 when fresh).
        self.resumed_from = 0
        #: Batches of the resumed epoch skipped because they were trained before.
        self.skipped_batches = 0
        #: The epoch ``fit`` resumed in, and how many of its first batches were trained
        #: before (they reach the other callbacks with empty logs; see the module
        #: docstring). ``None`` and 0 when ``fit`` started fresh or could not skip.
        self.resume_epoch: int | None = None
        self.resume_batch = 0
        self._skip_left = 0
        self._skipping = False
        self._train_function: Any = None
        self._begin = 0

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        if not model.built:
            raise ValueError(
                "AdaptiveCheckpointCallback needs a built model before fit(); "
                "build it (e.g. call it on a batch or give it an Input) first"
            )
        trackables: dict[str, Any] = {"model": model}
        if model.optimizer is not None:
            trackables["optimizer"] = model.optimizer
        # the end of fit is saved below (save_on_end), not by close()
        self.checkpointer = AdaptiveCheckpointer(
            self.directory, job=self.job, **self._options, save_on_close=False, **trackables
        )
        start = self.checkpointer.restore_or_initialize()
        self.resumed_from = start
        if not start:
            return
        steps = self.params.get("steps") if self.params else None
        if not steps:
            log.warning(
                "resumed the state of step %d, but fit() does not know its steps per "
                "epoch, so no batch is skipped",
                start,
            )
            return
        epoch, skip = divmod(start, steps)
        model._initial_epoch = epoch  # what BackupAndRestore sets; fit() reads it next
        self.resume_epoch, self.resume_batch = epoch, skip
        if skip:
            self._skip_left = skip
            self._train_function = model.train_function
            model.train_function = self._skip_batches
        log.info("resuming fit() at epoch %d, batch %d (step %d)", epoch, skip, start)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._begin = batch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._skipping:
            self._skipping = False
            return
        ckptr = self.checkpointer
        if ckptr is not None:
            ckptr.step(batch - self._begin + 1)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        ckptr = self.checkpointer
        if ckptr is None:
            return
        self._restore_train_function()
        if self.save_on_end and ckptr.step_count > self.resumed_from:
            ckptr.save("end of fit")
        ckptr.close()

    # ------------------------------------------------------------------ internals

    def _skip_batches(self, iterator: Any) -> dict[str, Any]:
        """Stands in for ``model.train_function`` while already-trained batches pass:
        reads them from the iterator without training on them. The empty logs it
        returns are what every callback's ``on_train_batch_end`` gets for them."""
        count = min(int(getattr(self.model, "steps_per_execution", 1) or 1), self._skip_left)
        for _ in range(count):
            next(iterator)  # StopIteration ends the epoch, as the real function's does
        self._skip_left -= count
        self.skipped_batches += count
        self._skipping = True
        if self._skip_left <= 0:
            self._restore_train_function()
        return {}

    def _restore_train_function(self) -> None:
        if self._train_function is not None:
            self.model.train_function = self._train_function
            self._train_function = None


__all__ = ["AdaptiveCheckpointCallback"]
