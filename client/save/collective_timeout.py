"""The bound on a collective with a silent peer: the hook's ``collective_timeout``.

A peer that dies is noticed at once (its connections close) or by TensorFlow's
heartbeat (a stopped process: about 10 s, measured, :mod:`~adaptd.client.save.
peer_failure`). A peer whose process lives but never joins the collective (stuck in
I/O, a partition the heartbeat does not cross) would hold the others for good: only
``CommunicationOptions(timeout_seconds=...)`` on the ``MultiWorkerMirroredStrategy``
bounds that. The user's own timeout always wins; where there is none the hook sets
:data:`COLLECTIVE_TIMEOUT_S` (or its ``collective_timeout``) before the training
function is first traced (TensorFlow bakes the timeout into each collective op then).

Why 120 s: the bound must exceed the longest wait between two collectives that a
healthy rank makes, or a slow peer is taken for dead. Steps here take 0.01-0.1 s, but
a rank may legitimately be held much longer: a blocking save (seconds at 256 MB on a
slow disk), and above all a rank held at an undecided save step of the agreement waits
up to twice the round timeout, 2 x 30 s (docs/multiworker.md), while its peers wait in
their next collective. 120 s is twice that, and still bounded: the waste it adds to a
covered failure is at most the timeout, paid only where the heartbeat saw nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

log = logging.getLogger("adaptd.client")

__all__ = ["COLLECTIVE_TIMEOUT_S", "apply", "strategy_of"]

#: The hook's default ``collective_timeout`` (seconds; see the module docstring).
COLLECTIVE_TIMEOUT_S = 120.0


def strategy_of(trackables: Mapping[str, Any]) -> Any:
    """The ``tf.distribute`` strategy the state was made under (the one in scope, else
    the one of a distributed variable of the state), or None."""
    if tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    for value in trackables.values():
        variables = getattr(value, "variables", None)
        for var in [value, *(variables if isinstance(variables, (list, tuple)) else ())]:
            strategy = getattr(var, "_distribute_strategy", None)
            if strategy is not None:
                return strategy
    return None


def _options_of(strategy: Any) -> list[Any]:
    ext = getattr(strategy, "extended", None)
    found = []
    for holder, attr in (
        (ext, "_communication_options"),
        (getattr(ext, "_cross_device_ops", None), "_options"),
        (getattr(ext, "_host_cross_device_ops", None), "_options"),
    ):
        opts = getattr(holder, attr, None)
        if opts is not None and hasattr(opts, "timeout_seconds") and opts not in found:
            found.append(opts)
    return found


def apply(strategy: Any, seconds: float | None) -> float | None:
    """Set ``seconds`` as ``strategy``'s collective timeout unless it has one; the
    timeout in force (None: none, or not a strategy with collectives)."""
    options = _options_of(strategy)
    if not options:
        return None
    mine = options[0].timeout_seconds
    if mine:
        return float(mine)  # the user's: kept
    if seconds is None:
        return None
    for opts in options:
        opts.timeout_seconds = float(seconds)
    log.info("collective timeout: %gs (the hook's collective_timeout)", seconds)
    return float(seconds)
