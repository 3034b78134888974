"""The priority of TensorFlow's async-save thread (the *writer*), chosen by measurement.

Why: on a host whose cores the training step keeps busy, TF's background write takes
CPU from the step, and that is most of what an async save costs the loop. At nice 19
the writer yields to the step: measured side by side on the 2-core development VM at
256 MB (``benchmarks/save_stall.py``, benchmarks/README.md), in the run where nothing
else starved it, the loop's stall per save was 0.02x a synchronous save against 0.58x
at normal priority (raw TF async: 1.19x). The price is a longer time until the save is
durable, L, and where other work keeps the cores busy a niced writer starves (below).

How the choice is made (:class:`WriterPriority`): with τ the planned interval (the
daemon's plan, or the embedded policy's) and L the measured durable latency (the
median of recent saves), both of which the hook knows in either mode:

* the waste the daemon minimises is δ/τ + (τ/2 + L + R)/M: a second of save cost δ
  per save costs M/τ times more than a second of L (τ is minutes, M days), so trading
  L for δ pays;
* until the write runs into the next save: one save is in flight at a time, so a
  write still running when the next save is due makes the loop wait for it.

So the writer runs in the background (nice 19) while L ≤ τ/4, at the training
thread's priority once L > τ/2, and keeps its priority in between (hysteresis: a
background writer's L is longer than a normal one's). L is the larger of the median
and the newest save's, so one starved write (a host whose other work leaves a niced
thread no CPU) is answered at the next save; the writer then stays at normal priority
for 10 saves before it tries the background again. And while the host's load average
exceeds 1.5 per core (more runnable work than the training job's), the writer runs at
normal priority whatever L: there a niced thread waits seconds for CPU (measured on
the shared 2-core VM at loads of 2-17: 256 MB durable after 4-12 s at nice 10 or 19
instead of about 1-3 s). The first save, before any L is known, runs at normal
priority. Where a niced thread may not raise its priority again
(an unprivileged process: ``RLIMIT_NICE``), going back to normal means ending TF's
writer thread between two writes and starting a new one, which inherits the training
thread's priority (:meth:`Writer.prepare`); the TF internals that needs stay here.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger("adaptd.client")

#: ``writer_nice="auto"``: chosen from the plan's interval and the measured latency.
AUTO = "auto"
#: Seconds to wait for TF's idle writer thread to leave its loop.
RESTART_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Choice:
    """A writer priority and why: ``nice`` 0 is the training thread's own priority."""

    nice: int
    reason: str


@dataclass(frozen=True, slots=True)
class WriterPriority:
    """Background writer while L ≤ ``background_up_to`` × τ, normal once L >
    ``normal_above`` × τ, unchanged in between (see the module docstring). L is the
    larger of the typical (median) and the newest save's latency, so one starved write
    is acted on at once; after such a fall-back the writer stays at normal priority
    for ``retry_after`` saves before it tries the background again (what starves a
    niced writer, other work on the host, rarely stops at once).

    Whatever L, the writer runs at normal priority while the host's load average per
    core exceeds ``max_load_per_core``: a niced thread yields to every other process,
    and on a host with more runnable work than cores it waits seconds for CPU (the
    training job alone keeps the load near one per core).

    Raises ValueError for a nice value outside 1..19, fractions not ordered
    ``0 < background_up_to < normal_above <= 1``, a negative ``retry_after`` or a
    ``max_load_per_core`` that is not positive.
    """

    background_nice: int = 19
    background_up_to: float = 0.25
    normal_above: float = 0.5
    retry_after: int = 10
    max_load_per_core: float = 1.5

    def __post_init__(self) -> None:
        if not 1 <= self.background_nice <= 19:
            raise ValueError(f"background_nice must be 1..19, got {self.background_nice}")
        if not 0 < self.background_up_to < self.normal_above <= 1:
            raise ValueError(
                "need 0 < background_up_to < normal_above <= 1, got "
                f"{self.background_up_to} and {self.normal_above}"
            )
        if self.retry_after < 0:
            raise ValueError(f"retry_after must be >= 0 saves, got {self.retry_after}")
        if not self.max_load_per_core > 0:
            raise ValueError(f"max_load_per_core must be > 0, got {self.max_load_per_core}")

    def choose(
        self,
        *,
        interval_s: float | None,
        latency_s: float | None,
        current: int,
        newest_s: float | None = None,
        since_fallback: int | None = None,
        load_per_core: float | None = None,
    ) -> Choice:
        """The priority for the next save.

        ``latency_s``: the typical (median) durable latency; ``newest_s``: the newest
        save's; ``current``: the priority now (0 or the background nice);
        ``since_fallback``: saves made at normal priority since the last fall-back from
        the background (``None``: none happened); ``load_per_core``: the host's
        1-minute load average per core (``None``: unknown).
        """
        if load_per_core is not None and load_per_core > self.max_load_per_core:
            return Choice(
                0,
                f"host load {load_per_core:.2g} per core: other work would starve a "
                "background writer",
            )
        if latency_s is None:
            return Choice(current, "no save measured yet")
        if interval_s is None or not interval_s > 0:
            return Choice(current, "no planned interval")
        worst = max(latency_s, newest_s or 0.0)
        share = worst / interval_s
        said = f"durable in {worst:.3g}s, {share:.0%} of the {interval_s:.3g}s interval"
        if share > self.normal_above:
            return Choice(0, f"{said}: a background write would run into the next save")
        if current:
            return Choice(current, said)
        if share > self.background_up_to:
            return Choice(0, said)
        if since_fallback is not None and since_fallback < self.retry_after:
            left = self.retry_after - since_fallback
            return Choice(0, f"{said}; {left} more saves at normal priority after a slow one")
        return Choice(self.background_nice, said)


#: What ``writer_nice`` takes: "auto", a rule of one's own, a fixed nice value, or None.
WriterNice = int | Literal["auto"] | WriterPriority | None


def load_per_core() -> float | None:
    """The host's 1-minute load average per core (``None`` where it is not available)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return None


class Writer:
    """The nice value of one checkpoint's TF writer thread.

    ``wanted``: ``"auto"`` (chosen by :class:`WriterPriority` before each save), a
    :class:`WriterPriority` (the same with its settings), an int 0-19 (that value,
    always), or ``None`` (left alone). ``load`` tells the host's load per core. The hook calls
    :meth:`prepare` between writes (before the save call) and :meth:`apply` after the
    save call (the first one creates the thread). Never raises: a priority that cannot
    be set is logged and left.
    """

    def __init__(
        self,
        checkpoint: Any,
        wanted: WriterNice,
        policy: WriterPriority | None = None,
        *,
        load: Callable[[], float | None] = load_per_core,
    ) -> None:
        if isinstance(wanted, WriterPriority):
            wanted, policy = AUTO, wanted
        self.checkpoint = checkpoint
        self.load = load
        self.wanted = wanted
        self.policy = policy or WriterPriority()
        #: The nice value applied to the writer thread (None: not touched).
        self.nice: int | None = None
        self.reason = ""
        self._target = 0 if wanted in (AUTO, None) else int(wanted)
        self._tid: int | None = None
        self._since_fallback: int | None = None  # normal-priority saves since a fall-back

    def prepare(
        self,
        *,
        interval_s: float | None,
        latency_s: float | None,
        newest_s: float | None = None,
    ) -> None:
        """Choose this save's priority (``"auto"``); back to normal: a new writer thread.

        ``latency_s``: the typical durable latency, ``newest_s``: the newest save's.
        """
        if self.wanted != AUTO:
            return
        current = self.nice or 0
        if not current and self._since_fallback is not None:
            self._since_fallback += 1
        choice = self.policy.choose(
            interval_s=interval_s,
            latency_s=latency_s,
            current=current,
            newest_s=newest_s,
            since_fallback=self._since_fallback,
            load_per_core=self.load(),
        )
        if choice.nice != self._target:
            log.info("writer priority: nice %d (%s)", choice.nice, choice.reason)
        self._target, self.reason = choice.nice, choice.reason
        if self._target < current:
            self._since_fallback = 0
            if self._restart():
                self.nice = None  # the new thread has the training thread's priority

    def apply(self) -> None:
        """Give the writer thread the chosen nice value (never raising a priority)."""
        if not self._target or (self.nice is not None and self.nice >= self._target):
            return
        thread = _thread_of(self.checkpoint)
        tid = getattr(thread, "native_id", None)
        if tid is None:
            return
        if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
            log.debug("writer_nice: per-thread priorities are Linux-only; left alone")
            return
        try:
            # never raise a priority: a process already nicer than asked keeps its value
            nice = max(self._target, os.getpriority(os.PRIO_PROCESS, tid))
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError as exc:
            log.info("could not set the save thread's nice value: %s", exc)
            return
        self._tid, self.nice = tid, nice

    def _restart(self) -> bool:
        """End TF's idle writer thread and start another (at the caller's priority).

        A lowered nice value cannot be raised again without privileges, but a new
        thread starts at its creator's. Only between writes (nothing queued or
        running); False when that, or TF's internals, are not as expected.
        """
        helper = getattr(self.checkpoint, "_async_checkpointer_impl", None)
        q = getattr(helper, "_queue", None)
        old = _thread_of(self.checkpoint)
        run = getattr(helper, "_async_save", None)
        if q is None or old is None or run is None or not old.is_alive():
            return False
        if q.unfinished_tasks or not q.empty():
            return False
        q.put(False)  # TF's own way to end the thread (its atexit hook does the same)
        old.join(RESTART_TIMEOUT_S)
        if old.is_alive():  # pragma: no cover - an idle thread leaves at once
            log.warning("TF's save thread did not stop; the writer keeps its priority")
        q.task_done()  # TF never marks its stop signal done; queue.join() would hang
        new = threading.Thread(target=run, daemon=True, name="tf-async-checkpoint")
        helper._async_save_thread = new
        new.start()
        self._tid = None
        return True


def _thread_of(checkpoint: Any) -> threading.Thread | None:
    helper = getattr(checkpoint, "_async_checkpointer_impl", None)
    return getattr(helper, "_async_save_thread", None)
