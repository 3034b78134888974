"""The training-loop hook: :class:`AdaptiveCheckpointer`.

It puts together the parts that each do one job: the checkpoint state
(:mod:`~adaptd.client.save.state`), the save schedule (:mod:`~adaptd.client.save.schedule`), the
saves and their watcher thread (:mod:`~adaptd.client.save.saves`), the session with the
daemon and the embedded policy (:mod:`~adaptd.client.daemon.session`), whose plan the rank
follows (:mod:`~adaptd.client.agreement.authority`) and SIGTERM
(:mod:`~adaptd.client.save.sigterm`).
What stays here is the per-step hot path and the order of things at a boundary.

Threads: the training thread calls :meth:`step`; TensorFlow's async-checkpoint
thread writes; one watcher thread of ours waits for each write to end and records
its outcome. The training thread reads that outcome on its next tick, so every
report, log line and plan change happens on the training thread.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import signal
import weakref
from collections.abc import Callable, Collection, Mapping
from time import perf_counter
from typing import Any

import tensorflow as tf

from adaptd.client import assembly as hook_parts
from adaptd.client.daemon.session import WELCOME_WAIT_S, HelloFacts
from adaptd.client.hook_views import HookViews
from adaptd.client.restore import intact, remote, resume
from adaptd.client.restore import notes as resume_notes
from adaptd.client.save.costs import Baseline, StepClock
from adaptd.client.save.schedule import NEVER
from adaptd.client.save.sigterm import SigtermHandler
from adaptd.client.save.state import SEEDS_KEY, STEP_KEY
from adaptd.client.save.writer import AUTO, WriterNice
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import Policy, PolicyError

log = logging.getLogger("adaptd.client")

_INF = float("inf")
#: The reason of the save :meth:`AdaptiveCheckpointer.close` makes of the last step.
FINAL_SAVE_REASON = "end of run"
#: How long :meth:`AdaptiveCheckpointer.close` (and leaving a ``with`` block) waits for
#: the save in flight to become durable.
CLOSE_TIMEOUT_S = 300.0
#: The same wait when the process ends without close() (its exit handler).
EXIT_TIMEOUT_S = 60.0
#: Default priority of TensorFlow's async-save thread (see ``writer_nice``): chosen
#: before each save from the planned interval and the measured durable latency
#: (:mod:`adaptd.client.save.writer`, measured in benchmarks/save_stall.py).
DEFAULT_WRITER_NICE: WriterNice = AUTO


class AdaptiveCheckpointer(HookViews):
    """Saves ``trackables`` asynchronously at the steps the daemon (or the embedded
    policy) plans, and reports what each save cost.

    Args:
        directory: where checkpoints go (created if missing).
        job: job id shared by all ranks (letters, digits, ``_.:@+-``).
        max_to_keep: checkpoints kept by the ``CheckpointManager`` (None: all).
        policy: a spec such as ``"fixed:steps=100"`` or a policy object; overrides
            the daemon's choice (sent in Hello) and drives the embedded fallback.
            Default: the daemon's choice, and :data:`adaptd.core.policy.DEFAULT_SPEC`
            embedded.
        socket: daemon endpoint or socket path (default :func:`adaptd.protocol.paths.endpoint`).
        curve_server_key, curve_client_key: for a ``tcp://`` socket, the daemon's public
            key file and this client's ``*.key_secret`` (default:
            ``$ADAPTD_CURVE_SERVER_KEY``/``$ADAPTD_CURVE_CLIENT_KEY``; see
            :class:`adaptd.client.daemon.link.DaemonLink`).
        rank, world_size: this process's place in the job (default: environment,
            see :mod:`adaptd.client.agreement.ranks`).
        daemon_timeout: seconds of silence after a send before the daemon counts
            as gone (also how long to wait for the first Welcome).
        handle_sigterm: on SIGTERM save at the next step, wait until durable, then
            let the signal take effect. Installed only from the main thread.
        poll_interval: wall seconds between socket polls in :meth:`step`.
        report_interval: wall seconds between step-time reports to the daemon.
        decide_interval: wall seconds between embedded re-decisions.
        writer_nice: priority of TensorFlow's async-save thread. ``"auto"`` (the
            default): nice 19 while the measured time until durable is at most a
            quarter of the planned interval and the host is not overloaded, the
            training thread's own priority once it exceeds half of it (see
            :mod:`adaptd.client.save.writer`); a :class:`~adaptd.client.save.writer.WriterPriority`:
            the same rule with other settings; an int 0-19: that nice value always;
            ``None`` or 0: left alone. Linux per-thread nice; elsewhere nothing changes.
        restore_from: a durable destination (fsspec URL or path: the job's folder
            there, ``{job}`` is replaced by the job id) to pull the newest verified
            checkpoint from when ``directory`` has none, e.g. on a new host (default
            ``$ADAPTD_RESTORE_FROM``; see :mod:`adaptd.client.restore.remote`).
        storage_options: fsspec options for ``restore_from`` (e.g. ``endpoint_url``).
        save_on_close: :meth:`close` (and leaving a ``with`` block without an
            exception) saves the current step when the run advanced since its last
            save, so even a run shorter than the first planned interval leaves a
            checkpoint (as the Keras callback saves at the end of ``fit``). Default on.
        per_rank: keywords of trackables that differ between the ranks of a
            multi-worker job, beside those that do by their kind (data iterators,
            generators made outside the strategy's scope): each rank saves and
            restores its own (see :mod:`adaptd.client.save.per_rank`).
        **trackables: what to checkpoint (``model=``, ``optimizer=``,
            ``data_iterator=``, ``rng=``, any ``tf`` trackable, or a ``tf.distribute``
            iterator).

    Raises:
        ValueError: an argument is invalid (the message names it and the value), or
            an input cannot be resumed exactly (``UnsupportedInput``: the message
            names what is supported).
        PolicyError: ``policy`` does not parse.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        job: str,
        max_to_keep: int | None = 5,
        policy: str | Policy | None = None,
        socket: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        daemon_timeout: float = 5.0,
        handle_sigterm: bool = True,
        poll_interval: float = 0.025,
        report_interval: float = 1.0,
        decide_interval: float = 5.0,
        writer_nice: WriterNice = DEFAULT_WRITER_NICE,
        restore_from: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        curve_server_key: str | os.PathLike[str] | None = None,
        curve_client_key: str | os.PathLike[str] | None = None,
        save_on_close: bool = True,
        per_rank: Collection[str] = (),
        **trackables: Any,
    ) -> None:
        built = hook_parts.parts(
            directory=directory,
            job=job,
            max_to_keep=max_to_keep,
            policy=policy,
            socket=socket,
            rank=rank,
            world_size=world_size,
            daemon_timeout=daemon_timeout,
            poll_interval=poll_interval,
            report_interval=report_interval,
            decide_interval=decide_interval,
            writer_nice=writer_nice,
            storage_options=storage_options,
            curve_server_key=curve_server_key,
            curve_client_key=curve_client_key,
            per_rank_keys=per_rank,
            trackables=trackables,
            manager=lambda: self.manager,
            options=_OPTIONS,
            position=lambda: self._n,
            wake=self._wake,
            pump=lambda seconds: self._session.pump(seconds, self._n),
        )
        self.directory, self.job, self.endpoint = built.directory, job, built.endpoint
        self.rank, self.world_size, self.policy = built.rank, built.world_size, built.policy
        #: Where an empty directory is filled from (None: nowhere), and what that did.
        self.restore_from = remote.source(restore_from, job)
        self._storage_options = dict(storage_options or {})
        self.pulled: remote.Pull | None = None
        self._max_to_keep = max_to_keep
        self._poll_s = float(poll_interval)
        self._save_on_close = bool(save_on_close)
        self._state, self._writer, self._link = built.state, built.writer, built.link
        self._schedule, self._authority = built.schedule, built.authority
        self._saves, self._session, self._part = built.saves, built.session, built.part
        self.checkpoint = self._state.checkpoint
        self._reopen_manager()
        self._sigterm = SigtermHandler(self._on_sigterm) if handle_sigterm else None

        # Hot-path state: step() reads these and nothing else.
        self._n = 0
        self._due = 0  # 0: the first step() runs the slow path, which starts the hook
        self._tick_at = 0.0
        self._last = 0.0  # when the previous step() (or the slow path) ended
        self._slowest = 0.0  # the slowest step() call since the last report...
        self._slowest_n = 1  # ...and the steps it covered

        self._started = False
        self._closed = False
        self._tracker: JobTracker | None = None
        self._preempt: int | None = None
        self.resumed_from = 0
        self.restore_s: float | None = None
        #: What restore_or_initialize() restored and the damaged checkpoints it skipped.
        self.resume = intact.Resume(None)
        self.state_bytes = 0
        self._atexit = _weak_close(self)
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ public API

    def restore_or_initialize(self) -> int:
        """Restore the newest intact checkpoint, if any; return the step to continue from.

        Removes leftovers of interrupted writes first. With ``restore_from`` and a
        directory without checkpoints, first pulls the newest verified checkpoint from
        there (a destination that cannot be read is a warning and a fresh start; the
        pull's time counts into ``restore_s``). Each checkpoint, newest first, gets
        ``adaptd verify``'s quick check before it is restored; a damaged one (in a
        multi-worker job, also one that lacks a rank's part) is skipped with a warning
        naming it and why, the next older one is restored, and the daemon is told (see
        :mod:`adaptd.client.restore.intact`; :attr:`resume` holds what happened). Call once,
        before the first :meth:`step`.

        Raises:
            RuntimeError: called twice or after :meth:`step`.
            NoIntactCheckpoint: there are checkpoints, but every one is damaged (the
                message names each and what is wrong).
            WorldSizeChanged: the newest checkpoint was written by a job of another
                number of workers (in a multi-worker job: ``RestoreAgreementError``
                with the same message), so no rank's own state could be restored exactly.
            AssertionError: (TensorFlow's) the checkpoint does not match the state.
        """
        if self._started:
            raise RuntimeError("restore_or_initialize() must be called once, before step()")
        done = resume.restore(
            self._authority,
            self.directory,
            self._state,
            restore_from=self.restore_from,
            storage_options=self._storage_options,
            part=self._part,
        )
        self.pulled, self.resume = done.pulled, done.resume
        if self.resume.skipped or (self.pulled is not None and self.pulled.step is not None):
            self._reopen_manager()  # the manager read the state file before it changed
        intact.warn_skipped(self.resume, self.directory)
        self._start(done.start, done.restore_s)
        self._session.await_welcome(self._n, self._store_due)
        return done.start

    def step(self, steps: int = 1) -> None:
        """Call once per finished training step (``steps``: how many finished since
        the previous call, e.g. ``steps_per_execution``). Costs well under a
        microsecond unless a save is due or the socket's poll time has come.
        Raises RuntimeError before :meth:`restore_or_initialize` (it names the call)."""
        now = perf_counter()
        dt = now - self._last
        self._last = now
        if dt > self._slowest:  # rare: kept so that a retrace stays out of the step time
            self._slowest = dt
            self._slowest_n = steps
        n = self._n + steps
        self._n = n
        if n >= self._due or now >= self._tick_at:
            self._boundary(n, now)
            self._last = perf_counter()  # the slow path's time is no step's time

    def save(self, reason: str = "requested") -> None:
        """Save the current step now (asynchronously), unless it is already saved.

        For a final save before :meth:`close`. Raises RuntimeError before
        :meth:`restore_or_initialize` and after close().
        """
        if self._closed:
            raise RuntimeError("save() after close(): the checkpointer is closed")
        if not self._started:
            raise resume_notes.not_restored("save()", self.directory)
        n = self._n
        if self._schedule.last_saved_step != n:
            self._save(n, reason)
            self._store_due()

    def request_save(self, reason: str = "requested") -> None:
        """Save at the next step boundary, whatever the plan says."""
        self._authority.save_now(reason, self._n + 1, self._n)
        self._store_due()

    def close(self, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
        """Save the current step if the run advanced since its last save (unless
        ``save_on_close=False``), wait up to ``timeout`` seconds for the save in
        flight, report it, say goodbye to the daemon and close the socket. Idempotent.

        A process that ends without calling it is closed at exit without that final
        save: the state at exit may be that of a step that raised.
        """
        self._finish(timeout, goodbye="closed", final_save=self._save_on_close)

    def __enter__(self) -> AdaptiveCheckpointer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._finish(CLOSE_TIMEOUT_S, goodbye="closed", final_save=self._save_on_close)
        else:  # the state may be that of a half-done step: not saved
            self._finish(CLOSE_TIMEOUT_S, goodbye=f"exception: {exc_type.__name__}")

    # ------------------------------------------------------------------ start

    def _reopen_manager(self) -> None:
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, str(self.directory), max_to_keep=self._max_to_keep
        )

    def _start(self, start: int, restore_s: float | None) -> None:
        now = perf_counter()
        self._started = True
        self.resumed_from = start
        self.restore_s = restore_s
        self._n = start
        self.state_bytes = self._state.nbytes() + (self._part.nbytes() if self._part else 0)
        self._tracker, gpus = hook_parts.tracker(
            self.job, self.world_size, start, self.state_bytes, restore_s
        )
        clock = StepClock(start, now)
        self._last, self._slowest, self._slowest_n = now, 0.0, 1
        self._schedule.last_saved_step = start if start else None
        self._saves.start(self._tracker, clock, Baseline(start, now))
        facts = HelloFacts(self.state_bytes, start, gpus, self.resume.describe())
        self._session.start(facts, self._tracker, clock, now)
        self._session.decide(start, now, False)
        if self._sigterm is not None:
            self._sigterm.install()
        self._authority.start()
        self._store_due()
        self._tick_at = now + self._poll_s

    def _store_due(self) -> None:
        """Set the step the hot path runs to: the schedule's next save, lowered by the
        authority (a step held for agreement); under its lock, so a wake-up from
        another thread is never overwritten."""
        with self._authority.lock:
            self._due = self._authority.bound(self._schedule.due)

    # ------------------------------------------------------------------ slow path

    def _boundary(self, n: int, now: float) -> None:
        if not self._started:
            if self._closed:
                self._due, self._tick_at = NEVER, _INF
                return
            raise resume_notes.not_restored("step()", self.directory)
        if now >= self._tick_at:
            self._tick(n, now)
        if self._preempt is not None and not self._authority.preempt(n):
            log.warning("SIGTERM: saving step %d, then exiting", n)
            self._finish(None, goodbye="SIGTERM")
            return
        stop = self._authority.boundary(n, self._tracker.step_time_s, now)
        if n >= self._schedule.due:
            self._save(n, self._schedule.due_reason)
        if stop:
            self._finish(None, goodbye="SIGTERM", stop=True)
            return
        # Decide after the save check: a policy plans strictly after the step it is
        # shown, so deciding first would skip a save due at this very step.
        if self._session.decide_due(now):
            self._session.decide(n, now, self.save_in_flight)
        self._store_due()

    def _tick(self, n: int, now: float) -> None:
        self._tick_at = now + self._poll_s
        slowest = (self._slowest, self._slowest_n)
        if self._session.tick(n, now, self.save_in_flight, slowest):
            self._slowest, self._slowest_n = 0.0, 1
        report = self._saves.report_done(n, now)
        if report is not None:
            self._session.saved(report, now)

    def _save(self, n: int, reason: str) -> None:
        self._schedule.saved(n)
        prev = self._saves.save(n, reason, self._schedule.interval_s(self._tracker.step_time_s))
        if prev is not None:
            self._session.saved(prev, perf_counter())
        started = self._saves.pending
        if started is not None and started.step == n:
            self._session.save_started(n, started.blocking_s, ok=not started.error)

    # ------------------------------------------------------------------ SIGTERM, close

    def _wake(self) -> None:
        self._due = 0  # (any thread) the next step takes the slow path

    def _on_sigterm(self, signum: int) -> None:
        # Runs between two bytecodes of the main thread: only flag; step() acts on it.
        self._preempt = signum
        self._due = 0

    def _finish(
        self, timeout: float | None, goodbye: str, final_save: bool = False, stop: bool = False
    ) -> None:
        if self._closed:
            return
        self._closed = True
        self._due, self._tick_at = NEVER, _INF
        signum = self._preempt
        try:
            if self._started:
                n = self._n
                last = self._schedule.last_saved_step
                if signum is not None and last != n:
                    self._save(n, "SIGTERM")
                elif final_save and n != (last or 0):
                    self._save(n, FINAL_SAVE_REASON)
                report = self._saves.wait(n, timeout)
                if report is not None:
                    self._session.saved(report, perf_counter())
                now = perf_counter()
                self._session.report_steps(n, now, False, (self._slowest, self._slowest_n))
                self._session.goodbye(n, goodbye, now)
                self._saves.stop()
        finally:
            self._authority.close()
            self._link.close(linger_ms=200)
            if self._sigterm is not None:
                self._sigterm.restore()
            atexit.unregister(self._atexit)
        if signum is None and stop:  # the job stops: as if this worker got SIGTERM too
            signum = signal.SIGTERM
        if signum is not None:
            log.warning("re-delivering signal %d", signum)
            os.kill(os.getpid(), signum)


# ---------------------------------------------------------------------- helpers


def _weak_close(ckptr: AdaptiveCheckpointer) -> Callable[[], None]:
    ref = weakref.ref(ckptr)

    def close_at_exit() -> None:
        obj = ref()
        if obj is not None:  # no final save: the process may be ending on an error
            obj._finish(EXIT_TIMEOUT_S, goodbye="closed")

    return close_at_exit


#: The constructor's options, for the did-you-mean of a misspelt one.
_OPTIONS = tuple(
    p.name
    for p in inspect.signature(AdaptiveCheckpointer.__init__).parameters.values()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
)

__all__ = [
    "FINAL_SAVE_REASON",
    "SEEDS_KEY",
    "STEP_KEY",
    "WELCOME_WAIT_S",
    "AdaptiveCheckpointer",
    "PolicyError",
]
