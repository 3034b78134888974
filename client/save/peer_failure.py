"""Which exceptions mean "a peer of this multi-worker job is gone": the one place that
knows TensorFlow's errors for it.

Measured with TensorFlow 2.21, two ``MultiWorkerMirroredStrategy`` workers on CPU, the
survivor's next collective (``CollectiveReduceV2``) raises:

* a peer SIGKILLed: at once, ``UnavailableError`` "Collective ops is aborted by:
  recvmsg:Connection reset by peer";
* a peer SIGSTOPped, no collective timeout: after about 10 s (the coordination
  service's heartbeat), ``UnavailableError`` "Collective ops is aborted by: ... The
  following tasks are unhealthy (stopped sending heartbeats)";
* a peer SIGSTOPped with ``CommunicationOptions(timeout_seconds=5)``: after 5 s,
  ``DeadlineExceededError`` "Collective has timed out during execution".

Every later collective of the process raises the same error again ("The error could
be from a previous operation. Restart your program to reset."): the job cannot go on,
only save and exit. An error is a peer failure only when both its type and its text
say so (:func:`peer_failure`): an ``InternalError`` of a user's own op, or a
``DeadlineExceededError`` of something else, is not one and saves nothing.
``tests/client/test_peer_failure.py`` fails if TensorFlow renames these types.

A hung peer (its process alive, its loop stuck) breaks nothing: the others wait in
the collective until its timeout. When the daemon finds the job stalled, each rank
frees itself with :func:`abort_collectives`, TensorFlow's own health check's call
(measured, TF 2.21 on CPU: the blocked all-reduce raises ``UnavailableError`` a few
ms later, the variables exactly the last completed step's); what it raises is a peer
failure here (:data:`ABORTED_MARKER`), so the just-in-time save follows.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = [
    "ABORTED_MARKER",
    "MARKERS",
    "TYPES",
    "abort_collectives",
    "peer_failure",
    "time_out_collectives",
]

#: The start of the reason a daemon's abort gives TensorFlow (in every error it raises).
ABORTED_MARKER = "adaptd: the job stalled"

#: The error types TensorFlow raises for a lost peer or a collective that timed out.
TYPES: tuple[type[BaseException], ...] = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.InternalError,
)

#: Phrases of their messages that name a collective aborted by a peer or timed out.
MARKERS: tuple[str, ...] = (
    "Collective ops is aborted",
    "Collective has timed out",
    "stopped sending heartbeats",
    "Connection reset by peer",
    "failed to connect to all addresses",
    "Socket closed",
    ABORTED_MARKER,
)


def peer_failure(exc: BaseException | None) -> str | None:
    """Why ``exc`` (or an exception it was raised from) is a peer's failure, in one
    line; None when it is not one."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, TYPES):
            text = str(exc)
            for marker in MARKERS:
                if marker in text:
                    return f"{type(exc).__name__}: {marker}"
        exc = exc.__cause__ or exc.__context__
    return None


def time_out_collectives(reason: str) -> None:
    """Make every pending and later collective of this process raise
    ``DeadlineExceededError`` "Collective has timed out during execution" naming
    ``reason``: what TensorFlow's own per-collective timeout raises, from the hook's
    one watchdog instead (:mod:`adaptd.client.save.collective_timeout`). Any thread; the
    process cannot run a collective again."""
    from tensorflow.python.eager import context  # private: kept here, in one place
    from tensorflow.python.framework import errors

    context.context().abort_collective_ops(
        errors.DEADLINE_EXCEEDED, f"Collective has timed out during execution: {reason}"
    )


def abort_collectives(reason: str) -> None:
    """Make every pending and later collective of this process raise
    ``UnavailableError`` naming ``reason`` (after :data:`ABORTED_MARKER`). Any thread;
    the process cannot run a collective again (as after a peer's death)."""
    from tensorflow.python.eager import context  # private: kept here, in one place
    from tensorflow.python.framework import errors

    context.context().abort_collective_ops(errors.UNAVAILABLE, f"{ABORTED_MARKER}: {reason}")
