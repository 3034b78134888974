"""The checks of :class:`~adaptd.client.checkpointer.AdaptiveCheckpointer`'s arguments.

Each failure is a ``ValueError`` that names the argument and the value received, and
says what is accepted, so a typo fails at construction instead of during training.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import tensorflow as tf

from adaptd.client.save import distributed_input
from adaptd.client.save.state import RESERVED
from adaptd.client.save.writer import AUTO, WriterNice, WriterPriority
from adaptd.config.loader import did_you_mean
from adaptd.core.policy import Policy
from adaptd.protocol import job as protocol


def check(
    *,
    directory: Any,
    job: Any,
    max_to_keep: Any,
    seconds: Mapping[str, Any],
    writer_nice: WriterNice,
    storage_options: Any,
    trackables: Mapping[str, Any],
    options: Iterable[str],
) -> None:
    """Raise ValueError for the first invalid argument. ``seconds``: the interval
    arguments by name; ``options``: the constructor's option names (a keyword that is
    not a trackable and resembles one of them is reported as a misspelt option)."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise ValueError(f"directory must be a non-empty path, got {directory!r}")
    try:
        msgspec.convert(job, protocol.JobId)
    except msgspec.ValidationError:
        raise ValueError(
            f"job must be 1-256 characters of letters, digits and _.:@+- "
            f"(not starting with one of .:@+-), got {job!r}"
        ) from None
    if max_to_keep is not None and (
        isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1
    ):
        raise ValueError(f"max_to_keep must be an integer >= 1 or None, got {max_to_keep!r}")
    for name, value in seconds.items():
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if (
        writer_nice is not None
        and writer_nice != AUTO
        and not isinstance(writer_nice, WriterPriority)
        and (
            isinstance(writer_nice, bool)
            or not isinstance(writer_nice, int)
            or not 0 <= writer_nice <= 19
        )
    ):
        raise ValueError(
            f"writer_nice must be 'auto', a WriterPriority, an integer from 0 to 19, or "
            f"None to leave the writer's priority alone, got {writer_nice!r}"
        )
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise ValueError(
            f"storage_options must be a mapping of fsspec options or None, "
            f"got {type(storage_options).__name__}"
        )
    _check_trackables(trackables, tuple(options))


def _check_trackables(trackables: Mapping[str, Any], options: tuple[str, ...]) -> None:
    if not trackables:
        raise ValueError(
            "nothing to checkpoint: pass the state as keywords, "
            "e.g. AdaptiveCheckpointer(dir, job=..., model=model, optimizer=opt)"
        )
    for key, value in trackables.items():
        if key in RESERVED:
            raise ValueError(f"the checkpoint key {key!r} is reserved by adaptd; rename it")
        if distributed_input.is_distributed(value):
            continue  # made checkpointable (or refused, saying why) when the state is built
        if not isinstance(value, tf.__internal__.tracking.Trackable):
            hint = did_you_mean(key, options)
            if hint:  # a misspelt option, not state: say which one was meant
                raise ValueError(
                    f"{key}= is not an option of AdaptiveCheckpointer{hint} (other keywords "
                    "are state to checkpoint and must be TensorFlow trackables)"
                )
            raise ValueError(
                f"{key}= must be a TensorFlow trackable (model, optimizer, tf.Variable, "
                f"tf.data iterator, tf.distribute iterator, tf.random.Generator, ...), got "
                f"{type(value).__name__}"
            )


def spec_of(policy: str | Policy | None) -> str | None:
    """The spec to send in Hello: the string as given, or None for a policy object
    (the daemon cannot run an object it does not have; the hook runs it locally)."""
    return policy if isinstance(policy, str) else None


__all__ = ["check", "spec_of"]
