"""The checks of :class:`~adaptd.client.checkpointer.AdaptiveCheckpointer`'s arguments,
and the split of its keywords into settings and state.

The hook's keywords are of two kinds: its settings (:class:`~adaptd.client.options.
HookOptions`' fields, checked there) and the state to checkpoint (any other keyword).
Each failure is a ``ValueError`` that names the argument and the value received, and
says what is accepted, so a typo fails at construction instead of during training.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tensorflow as tf

from adaptd.client.checks import check_directory, check_job
from adaptd.client.options import HookOptions
from adaptd.client.save import distributed_input
from adaptd.client.save.state import RESERVED
from adaptd.config.loader import did_you_mean

__all__ = ["check_directory", "check_job", "hook_arguments"]


def hook_arguments(
    directory: Any, job: Any, options: Any, keywords: Mapping[str, Any]
) -> tuple[Path, HookOptions, dict[str, Any]]:
    """``(directory, settings, state)`` from the hook's arguments, checked in that order.

    ``options``: a :class:`HookOptions` or None; the keywords that name one of its fields
    replace that field, the others are the state to checkpoint.

    Raises:
        ValueError: the first invalid argument (the message names it and the value).
        PolicyError: ``policy`` does not parse.
    """
    path = check_directory(directory)
    check_job(job)
    if options is not None and not isinstance(options, HookOptions):
        raise ValueError(
            f"options must be an adaptd.client.HookOptions or None, got {type(options).__name__}"
        )
    names = HookOptions.names()
    given = {k: v for k, v in keywords.items() if k in names}
    state = {k: v for k, v in keywords.items() if k not in names}
    settings = (options or HookOptions()).replace(**given)
    _check_trackables(state, ("job", "options", *names))
    return path, settings, state


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
