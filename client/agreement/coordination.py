"""TensorFlow's coordination service as a small key-value store with barriers.

Under ``tf.distribute.MultiWorkerMirroredStrategy`` every worker process is connected
to one coordination service (it runs in the chief, task 0). Its key-value store and
barriers are what TensorFlow's own ``PreemptionCheckpointHandler`` agrees on a save
step with (``tensorflow/python/distribute/failure_handling/failure_handling.py``), and
what adaptd's agreement uses (:mod:`adaptd.client.agreement.rounds`). The calls are not
exported TensorFlow API (``tensorflow.python.eager.context.context()``'s
``set_config_key_value``, ``get_config_key_value``, ``delete_config_key_value``);
this module is the only place that makes them.

Their behaviour on the pinned TensorFlow (2.21), checked by
tests/multiworker/test_coordination.py:

* ``set_config_key_value`` of a key that exists raises ``AlreadyExistsError``: the
  first writer wins, which is what agreement is built on (:meth:`Coordination.put`).
* ``get_config_key_value(key, timeout_in_ms)`` blocks until the key exists, and raises
  ``DeadlineExceededError`` after the timeout; a timeout of 0 means *forever*, so every
  wait here passes at least 1 ms. There is no non-blocking "try get" in the Python
  API; :meth:`Coordination.try_get` is a get with a 1 ms timeout (about 1 ms). A
  blocked get releases the GIL.
* ``delete_config_key_value`` of a missing key succeeds; deleting ``a/b`` deletes
  every key under ``a/b/`` too.
* TensorFlow's own ``wait_at_barrier(id, timeout_in_ms)`` raises
  ``DeadlineExceededError`` when not every task arrived in time, but it holds the GIL
  while it waits: every other Python thread of the process stops, the agreement's
  watcher included (found when a test's end barrier froze a rank's watcher until
  another rank gave up on its acknowledgement). So :meth:`Coordination.barrier` is
  built from keys and blocking gets instead, which release the GIL.
* When the chief's process (the service) is gone, calls fail at once with
  ``UnavailableError``; when another worker died, a get waits for its key until its
  timeout and the service marks the job unhealthy. So every wait has a timeout, and
  the errors are mapped to :class:`CoordinationLost`.
* When the chief's process is *stopped* (SIGSTOP; its connection stays open),
  ``set_config_key_value`` and ``delete_config_key_value`` wait for its answer with no
  deadline, and neither TensorFlow's heartbeat nor ``abort_collective_ops`` ends the
  wait (measured, issue 34: a survivor posting its save's cost to a stopped chief was
  still blocked 200 s later). So :meth:`Coordination.put` and
  :meth:`Coordination.delete` make the call on a thread of their own and wait for it
  at most :data:`CALL_TIMEOUT_S`, or until :func:`abandon` (the daemon found the job
  stalled); a get has its own deadline (a get in flight is not abandoned: it ends at
  its timeout; the next call raises). Slicing long gets to hear :func:`abandon` sooner
  was tried and dropped: with it, tests/multiworker/test_hook.py's random plan changes
  failed 2 times in 6, a get meeting the chief's service closed at the job's end (the
  cause not confirmed).
  A call left behind stays blocked in TensorFlow until the process exits; after it
  (or after :func:`abandon`), every call raises :class:`CoordinationLost` at once.

Keys are plain strings; values are UTF-8 text (the service decodes them as such).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("adaptd.client")

#: The private calls this module needs on TensorFlow's eager context.
REQUIRED_CALLS = ("set_config_key_value", "get_config_key_value", "delete_config_key_value")
#: How long :meth:`Coordination.try_get` waits (the service has no non-blocking get).
TRY_GET_S = 0.001
#: The longest a put or a delete may wait for the service: a write to its in-memory
#: map takes about a millisecond; 30 s only a stopped (frozen) chief takes. Within the
#: hook's 120 s collective timeout, so a job without a daemon is bounded as before.
CALL_TIMEOUT_S = 30.0

#: Why this process abandoned the coordination service (None: it did not); see
#: :func:`abandon`. Process-wide, as the service's agent and TensorFlow's collectives are.
_abandoned: str | None = None
#: The events of the puts and deletes in flight, set by :func:`abandon` to end their wait.
_pending: set[threading.Event] = set()
_pending_lock = threading.Lock()


def abandon(reason: str) -> None:
    """Make every pending and later call of this process on the coordination service
    raise :class:`CoordinationLost` naming ``reason`` (a put or delete blocked on a
    stopped chief at once; a get in flight at its own timeout). Any thread; the
    process cannot use the service again (as :func:`~adaptd.client.save.peer_failure.
    abort_collectives` for collectives): called when the daemon aborts the stalled job."""
    global _abandoned
    with _pending_lock:
        _abandoned = reason
        waiting = list(_pending)
    for event in waiting:
        event.set()


def abandoned() -> str | None:
    """Why this process abandoned the coordination service (None: it did not)."""
    return _abandoned


class CoordinationError(RuntimeError):
    """Base of this module's errors."""


class CoordinationUnavailable(CoordinationError):
    """There is no coordination service to use: raised at construction."""


class CoordinationLost(CoordinationError):
    """The coordination service stopped answering (its process, the chief, is gone,
    or the job was marked unhealthy after a worker died)."""


class BarrierTimeout(CoordinationError):
    """Not every task reached a barrier in time."""


def _tf_errors() -> Any:
    from tensorflow.python.framework import errors

    return errors


def _context() -> Any:
    from tensorflow.python.eager import context

    return context.context()


def _ms(timeout_s: float) -> int:
    """Milliseconds for TensorFlow, never 0 (which would mean "wait forever")."""
    if not isinstance(timeout_s, (int, float)) or math.isnan(timeout_s) or timeout_s <= 0:
        raise ValueError(f"a timeout must be a positive number of seconds, got {timeout_s!r}")
    return max(1, math.ceil(timeout_s * 1000))


def service_configured(context: Any = None) -> bool:
    """True when this process is a member of a TensorFlow cluster with a coordination
    service (``MultiWorkerMirroredStrategy`` created with a multi-worker TF_CONFIG).
    Never raises; needs TensorFlow imported."""
    try:
        ctx = context if context is not None else _context()
        return getattr(ctx, "coordination_service", None) is not None
    except Exception:  # an unexpected TF build: not configured, as far as we can tell
        return False


class Coordination:
    """Typed key-value and barrier calls on TensorFlow's coordination service.

    Every wait takes a timeout; nothing here blocks for longer. TensorFlow's errors
    become :class:`CoordinationLost` (the service is gone) or the return values
    documented on each method.

    Args:
        rank, world_size: this task's index among the cluster's tasks and their
            number (for :meth:`barrier`).
        context: TensorFlow's eager context (default: the process's).
        call_timeout_s: the longest a put or delete waits (:data:`CALL_TIMEOUT_S`).

    Raises:
        ValueError: ``rank``/``world_size`` are not a rank and a size, or
            ``call_timeout_s`` is not a positive number.
        CoordinationUnavailable: this TensorFlow lacks the calls, or no coordination
            service runs in this process, or it does not answer. The message says
            what to do.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        context: Any = None,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        if not (isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size):
            raise ValueError(f"rank {rank!r} must be an integer below world_size {world_size!r}")
        _ms(call_timeout_s)  # validate
        self.rank = rank
        self.world_size = world_size
        self.call_timeout_s = call_timeout_s
        self._unanswered: str | None = None  # a put or delete got no answer in time
        self._barriers: dict[str, int] = {}
        ctx = context if context is not None else _context()
        missing = [name for name in REQUIRED_CALLS if not callable(getattr(ctx, name, None))]
        if missing:
            raise CoordinationUnavailable(
                f"this TensorFlow ({_tf_version()}) has no {', '.join(missing)} on its eager "
                "context, which adaptd's multi-worker agreement uses (the coordination "
                "service's key-value store, as tf.distribute's PreemptionCheckpointHandler "
                "does); install a TensorFlow version adaptd is tested with (2.16-2.21)"
            )
        if not service_configured(ctx):
            raise CoordinationUnavailable(
                "no TensorFlow coordination service in this process: create "
                "tf.distribute.MultiWorkerMirroredStrategy() with a TF_CONFIG that names "
                "every worker before the AdaptiveCheckpointer; ranks without tf.distribute "
                "agree through their daemon instead (see docs/multiworker.md)"
            )
        self._ctx = ctx
        self._errors = _tf_errors()
        try:
            self.try_get("adaptd/probe")
        except CoordinationLost as exc:
            raise CoordinationUnavailable(
                f"the TensorFlow coordination service does not answer ({exc}); check that "
                "the chief (task 0 of TF_CONFIG) is running and reachable"
            ) from None

    # ------------------------------------------------------------------ key-value

    def put(self, key: str, value: str) -> bool:
        """Store ``value`` under ``key`` unless the key exists: True when this call
        wrote it, False when another writer was first. Raises CoordinationLost."""
        try:
            self._bounded("put", key, lambda: self._ctx.set_config_key_value(key, value))
        except self._errors.AlreadyExistsError:
            return False
        except self._errors.OpError as exc:
            raise self._lost("put", key, exc) from None
        return True

    def get(self, key: str, timeout_s: float) -> str | None:
        """The value of ``key``, waiting up to ``timeout_s`` for it to be written;
        None when it was not. Raises CoordinationLost, or ValueError for a
        timeout that is not positive."""
        ms = _ms(timeout_s)
        self._check("get", key)
        try:
            return self._ctx.get_config_key_value(key, ms)
        except self._errors.DeadlineExceededError:
            return None
        except self._errors.OpError as exc:
            raise self._lost("get", key, exc) from None

    def try_get(self, key: str) -> str | None:
        """The value of ``key`` if it is there now (waits about 1 ms), else None."""
        return self.get(key, TRY_GET_S)

    def delete(self, key: str) -> None:
        """Remove ``key`` and every key under ``key/``; a missing key is no error."""
        try:
            self._bounded("delete", key, lambda: self._ctx.delete_config_key_value(key))
        except self._errors.NotFoundError:
            return
        except self._errors.OpError as exc:
            raise self._lost("delete", key, exc) from None

    # ------------------------------------------------------------------ barriers

    def barrier(self, name: str, timeout_s: float) -> None:
        """Wait until every task called ``barrier(name)`` (the N-th call of a name meets
        the other tasks' N-th call). Other threads keep running meanwhile.

        Raises:
            BarrierTimeout: not every task arrived within ``timeout_s`` (the message
                names the missing ones).
            CoordinationLost: the service is gone.
        """
        deadline = time.monotonic() + timeout_s
        _ms(timeout_s)  # validate
        n = self._barriers.get(name, 0)
        self._barriers[name] = n + 1
        prefix = f"adaptd/barrier/{name}/{n}"
        self.put(f"{prefix}/{self.rank}", "1")
        missing = []
        for r in range(self.world_size):
            left = deadline - time.monotonic()
            key = f"{prefix}/{r}"
            value = self.get(key, left) if left > 0 else self.try_get(key)
            if value is None:
                missing.append(r)
        if missing:
            raise BarrierTimeout(
                f"barrier {name!r}: task(s) {', '.join(map(str, missing))} did not arrive "
                f"within {timeout_s:g}s"
            )

    # ------------------------------------------------------------------ internals

    def _check(self, what: str, key: str) -> None:
        if _abandoned is not None:
            raise CoordinationLost(f"coordination service {what} {key!r} abandoned: {_abandoned}")
        if self._unanswered is not None:
            raise CoordinationLost(f"{what} {key!r} not tried: {self._unanswered}")

    def _bounded(self, what: str, key: str, call: Callable[[], object]) -> None:
        """Make ``call`` (a put or delete: TensorFlow gives them no deadline) on a thread
        of its own, and wait for it at most :attr:`call_timeout_s` or until
        :func:`abandon`; re-raise what it raised. Raises CoordinationLost when it did
        not answer in time (the chief is stopped), or the service was abandoned."""
        self._check(what, key)
        done = threading.Event()
        raised: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except BaseException as exc:  # handed to the caller
                raised.append(exc)
            finally:
                done.set()

        with _pending_lock:
            _pending.add(done)
        try:
            threading.Thread(target=run, name="adaptd-coordination-call", daemon=True).start()
            answered = done.wait(self.call_timeout_s)
        finally:
            with _pending_lock:
                _pending.discard(done)
        if raised:
            raise raised[0]
        self._check(what, key)
        if not answered:
            # taken for lost: each later call would wait as long again (seen: without
            # abandon(), a survivor's posts kept it past the test's 60 s deadline)
            self._unanswered = (
                f"coordination service {what} {key!r}: no answer within "
                f"{self.call_timeout_s:g}s (is the chief, task 0, stopped?)"
            )
            raise CoordinationLost(self._unanswered)

    @staticmethod
    def _lost(what: str, key: str, exc: BaseException) -> CoordinationLost:
        return CoordinationLost(
            f"coordination service {what} {key!r} failed: {type(exc).__name__}: {_first_line(exc)}"
        )


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _tf_version() -> str:
    try:
        import tensorflow as tf

        return f"TensorFlow {tf.__version__}"
    except Exception:  # not importable: say so rather than fail while failing
        return "TensorFlow, version unknown"


__all__ = [
    "CALL_TIMEOUT_S",
    "BarrierTimeout",
    "Coordination",
    "CoordinationError",
    "CoordinationLost",
    "CoordinationUnavailable",
    "abandon",
    "abandoned",
    "service_configured",
]
