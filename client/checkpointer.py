"""The training-loop hook: :class:`AdaptiveCheckpointer`.

A facade over parts that each do one job, built once by :mod:`adaptd.client.assembly`:

* the save side (:mod:`adaptd.client.save`): what a checkpoint holds
  (:mod:`~adaptd.client.save.state`), which step the next save falls on
  (:mod:`~adaptd.client.save.schedule`), where a save goes
  (:mod:`~adaptd.client.save.targets`), the saves and their watcher thread
  (:mod:`~adaptd.client.save.saves`), put together by the
  :class:`~adaptd.client.save.saver.Saver`, which also says what the end of a run saves;
* the restore (:mod:`adaptd.client.restore`): which step the run continues from,
  alone or agreed by the job (:class:`~adaptd.client.restore.resume.Restorer`);
* whose plan the rank follows (:mod:`adaptd.client.agreement`);
* the daemon link and session, and the embedded policy (:mod:`adaptd.client.daemon`).

What stays here is the per-step hot path (:meth:`~AdaptiveCheckpointer.step`: a clock
read, a counter, one compare), the order of things at a slow-path boundary, at the
start and at the end, and SIGTERM (:mod:`~adaptd.client.save.sigterm`).

Threads: the training thread calls :meth:`~AdaptiveCheckpointer.step`; TensorFlow's
async-checkpoint thread writes; one watcher thread of ours waits for each write to end
and records its outcome. The training thread reads that outcome on its next tick, so
every report, log line and plan change happens on the training thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from time import perf_counter
from typing import Any

from adaptd.client import arguments, assembly
from adaptd.client.agreement import coordination
from adaptd.client.daemon import heartbeat
from adaptd.client.daemon.heartbeat import JobAborted
from adaptd.client.daemon.session import WELCOME_WAIT_S, HelloFacts
from adaptd.client.hook_views import HookViews
from adaptd.client.options import HookOptions
from adaptd.client.restore import intact, remote
from adaptd.client.restore import notes as resume_notes
from adaptd.client.restore.resume import Resumed
from adaptd.client.save import collective_timeout
from adaptd.client.save.costs import Baseline, StepClock
from adaptd.client.save.just_in_time import Outcome as JitOutcome
from adaptd.client.save.peer_failure import ABORTED_MARKER, abort_collectives, peer_failure
from adaptd.client.save.saver import FINAL_SAVE_REASON, final_reason
from adaptd.client.save.schedule import NEVER
from adaptd.client.save.sigterm import SIGTERM_REASON, SigtermHandler
from adaptd.client.save.state import SEEDS_KEY, STEP_KEY
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import PolicyError
from adaptd.protocol.job import JIT_REASON, Abort

log = logging.getLogger("adaptd.client")

_INF = float("inf")
#: How long :meth:`AdaptiveCheckpointer.close` (and leaving a ``with`` block) waits for
#: the save in flight to become durable.
CLOSE_TIMEOUT_S = 300.0
#: The same wait when the process ends without close() (its exit handler).
EXIT_TIMEOUT_S = 60.0


class AdaptiveCheckpointer(HookViews):
    """Saves ``trackables`` asynchronously at the steps the daemon (or the embedded
    policy) plans, and reports what each save cost.

    Args:
        directory: where checkpoints go (created if missing).
        job: job id shared by all ranks (letters, digits, ``_.:@+-``).
        options: the hook's settings (:class:`~adaptd.client.options.HookOptions`;
            default: every setting's default).
        **keywords: a setting by its name (``max_to_keep=3``, ``policy="fixed:steps=100"``,
            ``socket=``, ``rank=``, ``world_size=``, ``daemon_timeout=``,
            ``handle_sigterm=``, ``poll_interval=``, ``report_interval=``,
            ``decide_interval=``, ``writer_nice=``, ``restore_from=``,
            ``storage_options=``, ``curve_server_key=``, ``curve_client_key=``,
            ``save_on_close=``, ``per_rank=``, ``local_tier=``, ``local_tier_memory=``,
            ``local_tier_disk=``, ``just_in_time=``, ``step_counters=``,
            ``collective_timeout=``: each documented on
            :class:`~adaptd.client.options.HookOptions`; it replaces that field of
            ``options``), or else what to checkpoint (``model=``, ``optimizer=``,
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
        options: HookOptions | None = None,
        **keywords: Any,
    ) -> None:
        path, settings, trackables = arguments.hook_arguments(directory, job, options, keywords)
        built = assembly.parts(
            path, job, settings, trackables, position=lambda: self._n, wake=self._wake
        )
        #: The settings in force (every default filled in).
        self.options = settings
        self.directory, self.job, self.endpoint = built.directory, job, built.endpoint
        self.rank, self.world_size = built.who.rank, built.who.world_size
        self.policy = built.policy
        #: Where an empty directory is filled from (None: nowhere), and what that did.
        self.restore_from = built.source.url if built.source is not None else None
        self.pulled: remote.Pull | None = None
        self._poll_s = float(settings.poll_interval)
        self._save_on_close = bool(settings.save_on_close)
        self._state, self._part, self._writer = built.state, built.part, built.writer
        self._jit = built.jit
        self._collective_bound = built.collective_bound
        self._watchdog: collective_timeout.Watchdog | None = None
        #: What the last peer failure led to (:meth:`save_on_peer_failure`; None: none).
        self.just_in_time: JitOutcome | None = None
        self._durable, self._schedule, self._saver = built.durable, built.schedule, built.saver
        self._saves = built.saver.saves
        self._authority, self._restorer = built.authority, built.restorer
        self._link, self._session = built.link, built.session
        self.checkpoint = self._state.checkpoint
        self._sigterm = SigtermHandler(self._on_sigterm) if settings.handle_sigterm else None

        # Hot-path state: step() reads these and nothing else.
        self._n = 0
        self._due = 0  # 0: the first step() runs the slow path, which starts the hook
        self._tick_at = 0.0
        self._last = 0.0  # when the previous step() (or the slow path) ended
        self._slowest = 0.0  # the slowest step() call since the last report...
        self._slowest_n = 1  # ...and the steps it covered

        self._started = False
        self._closed = False
        #: What of the hook holds the loop now, for the heartbeat ("save", "round", "").
        self._holding = ""
        self._heartbeat: heartbeat.Heartbeat | None = None
        #: The daemon's Abort of a stalled job (None: none).
        self.aborted: Abort | None = None
        self._tracker: JobTracker | None = None
        self._preempt: int | None = None
        self.resumed_from = 0
        self.restore_s: float | None = None
        #: What restore_or_initialize() restored and the damaged checkpoints it skipped.
        self.resume = intact.Resume(None)
        #: The tier restore_or_initialize() restored from: "local" (the local tier, a
        #: restart in place) or "" (the directory, a destination, or nothing).
        self.resumed_tier = ""
        self._restored: Resumed | None = None
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
        done = self._restorer.restore(self._state)
        self.pulled, self.resume = done.pulled, done.resume
        if self.resume.skipped or (self.pulled is not None and self.pulled.step is not None):
            self._durable.reopen()  # the manager read the state file before it changed
        intact.warn_skipped(self.resume, self.directory)
        self._restored, self.resumed_tier = done, done.tier
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
        if self._saver.save_unless_saved(self._n, reason):
            if self._jit is not None:
                self._jit.observe(self._n)
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
        self._finish(timeout, goodbye="closed", save_on_close=self._save_on_close)

    def save_on_peer_failure(self, exc: BaseException) -> JitOutcome | None:
        """After ``exc`` raised out of a training step, save the last completed step
        just in time if ``exc`` is a peer's failure in a multi-worker job, then close.

        For loops that catch their own errors (the ``with`` form does this by itself).
        Returns None, doing nothing, for any other exception (re-raise it), in a job of
        one rank, and before :meth:`restore_or_initialize` or after :meth:`close`;
        otherwise the outcome (also in :attr:`just_in_time`): what was saved, or why
        nothing was (:mod:`adaptd.client.save.just_in_time`). The save in flight is
        waited for (and reported) first; the checkpointer is closed afterwards, since
        every later collective of the process fails too. Never raises.
        """
        if self._jit is None or not self._started or self._closed or peer_failure(exc) is None:
            return None
        self._session.peers_lost()  # the chief may be stopped: post nothing to it
        self._saver.finish(self._n, None, CLOSE_TIMEOUT_S)  # its part may be a replay's base
        if self._watchdog is not None:
            self._watchdog.thread = threading.get_ident()  # the thread that runs the steps
        abort = self._abort_heard()
        if abort is not None and abort.culprit == self.rank:  # it may be behind: never writes
            why = "the daemon took this rank for the cause of the stall: it saves nothing"
            outcome = JitOutcome(self._n, False, why, f"{ABORTED_MARKER}: {abort.reason}")
            log.error("%s (%s)", why, abort.reason)
        else:
            outcome = self._jit.save(self._n, exc)
        assert outcome is not None
        self.just_in_time = outcome
        if outcome.saved:
            report = self._saves.record(outcome.step, JIT_REASON, outcome.prefix,
                                        outcome.seconds, outcome.nbytes)  # fmt: skip
            self._session.saved(report, perf_counter())
        self._finish(CLOSE_TIMEOUT_S, goodbye=f"peer failure: {outcome.failure}")
        return outcome

    def __enter__(self) -> AdaptiveCheckpointer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._finish(CLOSE_TIMEOUT_S, goodbye="closed", save_on_close=self._save_on_close)
        elif self.save_on_peer_failure(exc) is None:
            # the state may be that of a half-done step: not saved (save.saver.final_reason)
            self._finish(CLOSE_TIMEOUT_S, goodbye=f"exception: {exc_type.__name__}")

    # ------------------------------------------------------------------ start

    def _start(self, start: int, restore_s: float | None) -> None:
        now = perf_counter()
        self._started = True
        self.resumed_from = start
        self.restore_s = restore_s
        self._n = start
        self.state_bytes = self._state.nbytes() + (self._part.nbytes() if self._part else 0)
        local = self._saver.saves.local
        done = self._restored
        self._tracker, gpus = assembly.tracker(
            self.job, self.world_size, start, self.state_bytes, restore_s,
            local_tier=local is not None, restored_tier=done.tier if done else "",
        )  # fmt: skip
        clock = StepClock(start, now)
        self._last, self._slowest, self._slowest_n = now, 0.0, 1
        self._schedule.last_saved_step = start if start else None
        self._saver.start(self._tracker, clock, Baseline(start, now))
        if self._jit is not None:
            self._jit.observe(start, start=True)
        facts = HelloFacts(
            self.state_bytes, start, gpus, self.resume.describe(),
            local_tier=local.kind if local is not None else "",
            resumed_tier=done.tier if done else "",
            local_intact=done.local_intact if done else False,
        )  # fmt: skip
        self._session.start(facts, self._tracker, clock, now)
        self._session.decide(start, now, False)
        if self._sigterm is not None:
            self._sigterm.install()
        self._authority.start()
        self._beat()
        self._guard()
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
        abort = self._abort_heard()
        if abort is not None:  # it came back after the daemon freed the others
            raise JobAborted(abort.reason)
        if now >= self._tick_at:
            self._tick(n, now)
        if self._preempt is not None and not self._authority.preempt(n):
            log.warning("SIGTERM: saving step %d, then exiting", n)
            self._finish(None, goodbye=SIGTERM_REASON)
            return
        self._holding = "round"
        stop = self._authority.boundary(n, self._tracker.step_time_s, now)
        self._holding = "save"
        self._saver.save_if_due(n)
        self._holding = ""
        if self._jit is not None and self._schedule.last_saved_step == n:
            self._jit.observe(n)  # the counters at a save: how far a step moves them
        if stop:
            self._finish(None, goodbye=SIGTERM_REASON, stop=True)
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
        self._saver.report_done(n, now)

    # ------------------------------------------------------------------ SIGTERM, close

    def _on_abort(self, msg: Abort) -> None:
        # The heartbeat's thread, while the loop may be blocked in a collective: free it
        # (its collective raises a peer failure, and the just-in-time save follows); or
        # blocked on the coordination service of a stopped chief: abandon it (the post
        # fails, the loop goes on to its next collective, which raises).
        self.aborted = msg
        self._due = 0
        abort_collectives(msg.reason)
        coordination.abandon(msg.reason)

    def _abort_heard(self) -> Abort | None:
        """The daemon's Abort of this job, if any; first heard afresh when the heartbeat
        could not beat (the process was stopped and continued: the others may have saved
        and exited meanwhile, and this rank must not write over their save)."""
        beating = self._heartbeat
        if self.aborted is None and beating is not None and beating.stale():
            # beats say "save" meanwhile: this wait is the hook's (before a save), and the
            # daemon, if it did not abort the job, must not take it for a hang
            held, self._holding = self._holding, "save"
            try:
                beating.catch_up()
            finally:
                self._holding = held
        return self.aborted

    def _beat(self) -> None:
        """Start the heartbeat of a rank of a multi-worker job (see
        :mod:`adaptd.client.daemon.heartbeat`)."""
        if self.world_size < 2 or self._heartbeat is not None:
            return
        o = self.options
        self._heartbeat = heartbeat.Heartbeat(
            self.endpoint, self.job, self.rank, position=lambda: self._n,
            holding=lambda: self._holding, on_abort=self._on_abort,
            stall_floor_s=o.stall_floor, stall_cap_s=o.stall_cap,
            curve_server_key=o.curve_server_key, curve_client_key=o.curve_client_key,
        ).start()  # fmt: skip

    def _guard(self) -> None:
        """Start the bound on a collective with a silent peer (a rank of a multi-worker
        job: :mod:`adaptd.client.save.collective_timeout`), watching this thread."""
        if self._collective_bound is None or self._watchdog is not None:
            return
        self._watchdog = collective_timeout.Watchdog(
            self._collective_bound, position=lambda: self._n, holding=lambda: bool(self._holding)
        )
        self._watchdog.thread = threading.get_ident()
        self._watchdog.start()

    def _wake(self) -> None:
        self._due = 0  # (any thread) the next step takes the slow path

    def _on_sigterm(self, signum: int) -> None:
        # Runs between two bytecodes of the main thread: only flag; step() acts on it.
        self._preempt = signum
        self._due = 0

    def _finish(
        self, timeout: float | None, goodbye: str, save_on_close: bool = False, stop: bool = False
    ) -> None:
        """End the run (once): the final save :func:`~adaptd.client.save.saver.final_reason`
        asks for, the wait for the save in flight, the last reports and the goodbye; then
        the agreement, the socket and SIGTERM are released, and a SIGTERM (or the job's
        agreed ``stop``) is delivered again."""
        if self._closed:
            return
        self._closed = True
        self._due, self._tick_at = NEVER, _INF
        signum = self._preempt
        # the loop is over: a peer that ends first (the chief's process holds the
        # coordination service) is not a broken agreement while this rank finishes
        self._authority.ending()
        try:
            if self._started:
                n = self._n
                last = self._schedule.last_saved_step
                reason = final_reason(
                    n, last, signaled=signum is not None, save_on_close=save_on_close
                )
                clean = save_on_close or signum is not None
                self._saver.finish(n, reason, timeout, clean=clean)
                now = perf_counter()
                # the last batch ends with the last completed step, not now: after a peer
                # failure or the daemon's abort, the time since is a wait in a collective
                # that never completed, not a step (counted as one, it taught the daemon a
                # step time of seconds for a job of 20 ms steps: issue 34's trials)
                self._session.report_steps(n, self._last, False,
                                           (self._slowest, self._slowest_n))  # fmt: skip
                self._session.goodbye(n, goodbye, now)
                self._saver.stop()
        finally:
            if self._heartbeat is not None:
                self._heartbeat.stop()
            if self._watchdog is not None:
                self._watchdog.stop()
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


__all__ = [
    "CLOSE_TIMEOUT_S",
    "EXIT_TIMEOUT_S",
    "FINAL_SAVE_REASON",
    "SEEDS_KEY",
    "STEP_KEY",
    "WELCOME_WAIT_S",
    "AdaptiveCheckpointer",
    "HookOptions",
    "PolicyError",
]
