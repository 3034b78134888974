"""The bound on a collective with a silent peer: the hook's ``collective_timeout``.

A peer that dies is noticed at once (its connections close) or by TensorFlow's
heartbeat (a stopped process: about 10 s, measured, :mod:`~adaptd.client.save.
peer_failure`). A peer whose process lives but never joins the collective (stuck in
I/O, a partition the heartbeat does not cross) would hold the others for good. The
daemon finds such a job stalled in seconds from its ranks' reports and frees it
(docs/multiworker.md, "Hangs"); without a daemon, this bound does.

**One watchdog thread, not TensorFlow's timeout** (issue 35). TensorFlow 2.21's
``CommunicationOptions(timeout_seconds=...)``, which the hook used to set, gives every
collective it starts a thread of its collective executor (``collective_ops``, 8 MB of
stack) that sleeps out the whole timeout, however fast the collective completes
(``base_collective_executor.cc``: "TODO: Share the timeout watchdog thread among
collectives"). A process then holds collectives per second × timeout threads: measured
(``benchmarks/collective_threads.py``), a two-worker job of 10 ms steps held about
16,000 threads per process within 80 s at the hook's 120 s, until thread creation
failed ("terminate called after throwing an instance of 'std::system_error': Resource
temporarily unavailable") and the worker aborted; a pod with a pids limit of a few
thousand fails far sooner. So the hook leaves TensorFlow's option alone and bounds
the same thing with :class:`Watchdog`: one thread that looks, about once a second, at
the training thread's Python stack. When that thread has been inside one call of a
``tf.function`` that holds collective ops (``quick_execute``, found by scanning the
function's definition and the functions it calls) for longer than the bound, every
collective of the process is aborted with what TensorFlow's timeout raises
(``DeadlineExceededError`` "Collective has timed out during execution",
:func:`~adaptd.client.save.peer_failure.time_out_collectives`), and the just-in-time
save follows as before. Not counted: calls before the first step completed (the
training function may compile for minutes), calls while the hook itself holds the loop
(a blocking save, an agreement round), calls of functions without collectives, and
time outside such calls (input, the user's Python). A user's own
``CommunicationOptions`` timeout is kept, and then there is no watchdog.

**The bound** is ``collective_timeout`` (:data:`COLLECTIVE_TIMEOUT_S`), or
:data:`STEP_FACTOR` times the job's typical time per step when that is longer (a job
of steps of minutes is not taken for hung; with ``steps_per_execution``, one call runs
several steps: keep ``collective_timeout`` above a call's time). Why 120 s: the bound
must exceed the longest wait between two collectives that a healthy rank makes, or a
slow peer is taken for dead. Steps here take 0.01-0.1 s, but a rank may legitimately
be held much longer: a blocking save (seconds at 256 MB on a slow disk), and above all
a rank held at an undecided save step of the agreement waits up to twice the round
timeout, 2 x 30 s (docs/multiworker.md), while its peers wait in their next
collective. 120 s is twice that, and still bounded: the waste it adds to a covered
failure is at most the timeout, paid only where neither the heartbeat nor a daemon saw
anything.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from adaptd.client.save.peer_failure import time_out_collectives
from adaptd.core.estimators import weighted_median

log = logging.getLogger("adaptd.client")

__all__ = ["COLLECTIVE_TIMEOUT_S", "STEP_FACTOR", "Watchdog", "bound", "strategy_of"]

#: The hook's default ``collective_timeout`` (seconds; see the module docstring).
COLLECTIVE_TIMEOUT_S = 120.0
#: The bound is at least this many times the job's typical time per step: the median
#: over the steps of the watchdog's last :data:`STEP_HISTORY` looks that saw the step
#: move, each look's steps timed alike (its time since the step last moved over the
#: steps it moved). Per step, not per look: a look that saw 50 steps of 10 ms counts 50
#: times, one slow step (a stall, a blocking save, the first step's compile) once. Per
#: look, a short job's few looks made its one slow step and its compile the median (a
#: two-worker test of 9 steps, one of them 2 s, got a bound of 8 s instead of 4).
STEP_FACTOR = 10.0
STEP_HISTORY = 16
#: The watchdog looks this often (or an eighth of the bound, if shorter).
CHECK_S = 1.0


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


def bound(strategy: Any, seconds: float | None) -> float | None:
    """The hook's bound for :class:`Watchdog` on ``strategy``'s collectives: ``seconds``,
    or None where there is nothing to bound (not a strategy with collectives, no
    ``seconds``) or the user set TensorFlow's own timeout (kept, logged)."""
    options = _options_of(strategy)
    if not options or seconds is None:
        return None
    mine = options[0].timeout_seconds
    if mine:
        log.info("collective timeout: %gs (the strategy's own, per collective)", mine)
        return None
    log.info("collective timeout: %gs (the hook's collective_timeout, one watchdog)", seconds)
    return float(seconds)


class Watchdog:
    """The bound on a ``tf.function`` call of the training thread that holds
    collectives and does not return (see the module docstring). One thread; nothing on
    the training thread's path.

    ``position`` returns the hook's newest completed step, ``holding`` whether the hook
    holds the loop now (its own waits are not a peer's); :attr:`thread` is the training
    thread's ident (the hook sets it from that thread). ``fire`` aborts the process's
    collectives (tests pass their own); ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        seconds: float,
        *,
        position: Callable[[], int],
        holding: Callable[[], bool],
        fire: Callable[[str], None] = time_out_collectives,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not seconds > 0:
            raise ValueError(f"collective_timeout must be > 0 seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.position = position
        self.holding = holding
        self.fire = fire
        self.clock = clock
        self.thread: int | None = None
        #: Why the watchdog aborted the collectives (None: it has not).
        self.fired: str | None = None
        self._stop = threading.Event()
        self._runner: threading.Thread | None = None
        self._collectives: dict[str, bool] = {}  # function name -> holds collectives
        self._held: Any = None  # the call watched: its frame (held, so its id is unique)
        self._since = 0.0
        self._counted = False
        self._at: tuple[int, float] | None = None  # the position last seen, and since when
        #: per look that saw the step move: (seconds per step, steps)
        self._gaps: deque[tuple[float, int]] = deque(maxlen=STEP_HISTORY)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Watchdog:
        self._runner = threading.Thread(target=self._run, name="adaptd-collective-watchdog",
                                        daemon=True)  # fmt: skip
        self._runner.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._runner is not None and self._runner is not threading.current_thread():
            self._runner.join(timeout=5.0)
        self._held = None

    def _run(self) -> None:
        every = min(CHECK_S, self.seconds / 8)
        while not self._stop.wait(every):
            try:
                if self.check() is not None:
                    return
            except Exception:  # the bound must never end the training
                log.exception("the collective watchdog failed; collectives are unbounded")
                return

    # ------------------------------------------------------------------ the check

    def limit(self) -> float:
        """The bound now: ``seconds``, or :data:`STEP_FACTOR` × the typical step time
        (the median per step, not per look: see :data:`STEP_FACTOR`)."""
        # each look's time per step, weighted by its steps
        typical = weighted_median(self._gaps) if self._gaps else 0.0
        return max(self.seconds, STEP_FACTOR * typical)

    def check(self) -> str | None:
        """Look once (the thread does, every second or so); the reason when this look
        aborted the collectives."""
        now = self.clock()
        n = self.position()
        if self._at is None or n != self._at[0]:
            if self._at is not None:  # the time per step since the position last moved
                steps = max(1, abs(n - self._at[0]))
                self._gaps.append(((now - self._at[1]) / steps, steps))
            self._at = (n, now)
        call = None
        if self._gaps and self.thread is not None and not self.holding():
            call = self._call()  # armed once a step completed (the first may compile)
        if call is None:
            self._held = None
            return None
        frame, name = call
        if frame is not self._held:
            self._held, self._since = frame, now
            self._counted = self._has_collectives(name)
            return None
        limit = self.limit()
        if not self._counted or now - self._since < limit:
            return None
        why = (
            f"adaptd's collective_timeout: the training thread has been in one call of "
            f"{name} (which holds collectives) for {now - self._since:.0f}s, over "
            f"{limit:g}s: a peer never joined"
        )
        self.fired = why
        self._held = None
        log.error("%s; aborting the collectives", why)
        self.fire(why)
        return why

    def _call(self) -> tuple[Any, str] | None:
        """The training thread's ``quick_execute`` frame and the function it runs."""
        from tensorflow.python.eager import execute  # private: kept here, in one place

        code = execute.quick_execute.__code__
        frame = sys._current_frames().get(self.thread)  # type: ignore[arg-type]
        while frame is not None:
            if frame.f_code is code:
                name = frame.f_locals.get("op_name")
                if isinstance(name, bytes):
                    name = name.decode(errors="replace")
                return (frame, name) if isinstance(name, str) else None
            frame = frame.f_back
        return None

    def _has_collectives(self, name: str) -> bool:
        known = self._collectives.get(name)
        if known is None:
            known = self._collectives[name] = _holds_collectives(name)
        return known


def _holds_collectives(name: str, seen: set[str] | None = None) -> bool:
    """Whether the function ``name`` (of this process's eager context) or one it calls
    holds a collective op (``Collective*``); False when it cannot be read."""
    from tensorflow.python.eager import context  # private: kept here, in one place

    seen = set() if seen is None else seen
    if name in seen:
        return False
    seen.add(name)
    ctx = context.context()
    try:
        fdef = ctx.get_function_def(name)
    except Exception:  # not a function of this context (or gone): nothing to bound
        return False
    for node in fdef.node_def:
        if node.op.startswith("Collective"):
            return True
        called = [a.func.name for a in node.attr.values() if a.HasField("func")]
        if ctx.has_function(node.op):
            called.append(node.op)
        if any(_holds_collectives(c, seen) for c in called):
            return True
    return False
