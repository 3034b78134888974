"""The daemon's plan as Orbax's ``SaveDecisionPolicy``: :class:`SavePolicy`.

Orbax's ``CheckpointManager.save(step, ...)`` asks its policy ``should_save(step,
previous_steps, *, context)`` at every call and, on yes, saves (asynchronously by
default) and commits the step when the write is done. The policy answers from the
plan the job's daemon sends, or, while no daemon answers, the same embedded policies
the TensorFlow hook falls back to (:class:`~adaptd.client.follower.Follower`), and
measures what each save cost at this seam:

* **blocked**: the time from the yes until Orbax calls in again at the next step, less
  the mean step time (Orbax's save returns, the loop trains one step, then calls);
* **durable**: from the yes until the first call that finds no save in progress
  (``context.is_saving_in_progress``: Orbax's async write and its commit are done), to
  the resolution of one step;
* **extra step time**: the steps between the two, beyond their mean time;
* **bytes**: the size of the finalized step directory, when ``directory`` is given.

They go to the daemon as the TensorFlow hook's Save report does. Orbax stays in charge
of the format, the async writes, the atomic commit, retention and restore.

The per-step path (no save due) is a clock read and three compares; everything else
runs at the steps a save is due, at a poll (``poll_interval``), or once a save's
commit is seen.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

from adaptd.client.agreement.ranks import Identity
from adaptd.client.checks import check_directory, check_job, check_seconds
from adaptd.client.daemon.link import DAEMON_TIMEOUT_S
from adaptd.client.daemon.policy import PolicyChoice
from adaptd.client.follower import DECIDE_S, POLL_S, Follower
from adaptd.client.orbax.adapter import OrbaxAdapter
from adaptd.client.orbax.agreement import Answer, JaxStore, PrimaryAnswer
from adaptd.client.restore import notes
from adaptd.client.save.schedule import NEVER
from adaptd.client.save.sigterm import SIGTERM_REASON, SigtermHandler
from adaptd.core.policy import Policy
from adaptd.protocol import job as protocol

__all__ = ["AGREE_INTERVAL_S", "SIGTERM_WAIT_S", "SavePolicy"]

log = logging.getLogger("adaptd.client")

_INF = float("inf")
#: How long a SIGTERM waits for its save's commit before the signal is delivered again.
SIGTERM_WAIT_S = 300.0
#: How often (wall seconds) the processes of a multi-process job meet to hear the
#: primary's answer between its planned saves (:mod:`adaptd.client.orbax.agreement`).
AGREE_INTERVAL_S = 1.0


class SavePolicy:
    """Orbax's ``SaveDecisionPolicy`` backed by the adaptd daemon's plan::

        policy = SavePolicy(job="my-job", directory=ckpt_dir)
        manager = ocp.CheckpointManager(
            ckpt_dir, options=ocp.CheckpointManagerOptions(save_decision_policy=policy))
        manager.save(step, args=ocp.args.StandardSave(state))    # every step

    ``step`` counts completed steps, as the daemon's plans do. It composes with
    Orbax's own policies (``AnySavePolicy([PreemptionCheckpointingPolicy(), policy])``):
    a save another policy causes is where the plan counts from. In a job of several
    JAX processes (``jax.distributed``), every process answers the same
    (:mod:`adaptd.client.orbax.agreement`).

    Args:
        job: the job id shared by its processes (letters, digits, ``_.:@+-``).
        directory: the manager's checkpoint directory (named to the daemon; the saves'
            bytes are read from it). None: not told, bytes reported as 0.
        policy: a spec (``"fixed:steps=100"``) or a policy object, as the TensorFlow
            hook's ``policy``; None: the daemon's choice.
        socket: the daemon's endpoint (default ``$ADAPTD_SOCKET`` or the standard one).
        daemon_timeout: seconds of silence before the daemon counts as gone.
        poll_interval: wall seconds between reads of the daemon's messages.
        agree_interval: wall seconds between the processes' agreement steps (several
            processes only).
        agree_timeout: how long a process waits for the primary's answer.
        handle_sigterm: in a job of one process, SIGTERM saves the next step, waits
            (at most :data:`SIGTERM_WAIT_S`) until Orbax finalized it in ``directory``,
            says goodbye and delivers the signal again (as the TensorFlow hook does).

    Raises:
        ValueError: ``job``, ``directory`` or a number of seconds is invalid (the
            message names it and the value).
        PolicyError: ``policy`` does not parse.
    """

    def __init__(
        self,
        *,
        job: str,
        directory: str | os.PathLike[str] | None = None,
        policy: str | Policy | None = None,
        socket: str | os.PathLike[str] | None = None,
        daemon_timeout: float = DAEMON_TIMEOUT_S,
        poll_interval: float = POLL_S,
        agree_interval: float = AGREE_INTERVAL_S,
        agree_timeout: float = 300.0,
        handle_sigterm: bool = True,
    ) -> None:
        self.job = check_job(job)
        self.directory = check_directory(directory) if directory is not None else None
        for name, value in (
            ("daemon_timeout", daemon_timeout),
            ("poll_interval", poll_interval),
            ("agree_interval", agree_interval),
            ("agree_timeout", agree_timeout),
        ):
            check_seconds(name, value)  # fmt: skip
        self._choice = PolicyChoice.of(policy)
        self._socket = os.fspath(socket) if socket is not None else None
        self._daemon_timeout = float(daemon_timeout)
        self._poll_s = float(poll_interval)
        self._agree_s = float(agree_interval)
        self._agree_timeout = float(agree_timeout)
        self._sigterm = SigtermHandler(self._on_sigterm) if handle_sigterm else None
        self._preempt: int | None = None  # the signal received (None: none)
        self._preempt_step: int | None = None  # the step its save was asked for
        self.adapter = OrbaxAdapter(self.directory)
        #: Built at the first call (JAX must not be asked for its processes before
        #: ``jax.distributed.initialize()``).
        self.follower: Follower | None = None
        self._agreement: PrimaryAnswer | None = None
        # Hot-path state: should_save reads these and nothing else.
        self._due = 0  # 0: the first call takes the slow path, which starts the policy
        self._tick_at = 0.0
        self._pending = False  # a save is in flight (its commit not yet seen)
        # Slow-path state.
        self._next = 0  # the step of the next save (one process) or agreement step
        self._answered_at: float | None = None  # when the last yes was given
        self._n = 0
        self._seen = 0  # len(previous_steps) at the last slow path
        self._closed = False
        #: Checkpoints older than this were there before the run (a resume); newer ones
        #: were saved by another policy before this one was first asked.
        self._born = datetime.datetime.now(datetime.timezone.utc)
        self._atexit = _weak_close(self)
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ Orbax's call

    def should_save(self, step: Any, previous_steps: Sequence[Any], *, context: Any) -> bool:
        """Orbax's question at ``manager.save(step.step, ...)``: save now?

        Raises RuntimeError (several processes) when the primary process's answer does
        not come within ``agree_timeout``."""
        now = perf_counter()
        n = step.step
        if (
            n >= self._due
            or now >= self._tick_at
            or (self._pending and not context.is_saving_in_progress)
        ):
            return self._slow(n, now, previous_steps, context)
        self._n = n
        return False

    # ------------------------------------------------------------------ public API

    @property
    def endpoint(self) -> str:
        """The daemon endpoint the policy talks to (known after the first call)."""
        return self.follower.endpoint if self.follower is not None else ""

    @property
    def reports(self) -> list[protocol.SaveReport]:
        """Every save's report so far (the newest last)."""
        return self.follower.history if self.follower is not None else []

    def close(self, reason: str = "closed") -> None:
        """Tell the daemon the job ended (a job that ends without it looks lost, and a
        later resume counts as a failure) and close the socket; called at exit when
        not before. Call it after ``manager.wait_until_finished()``: the saves still in
        flight are reported if their step is finalized by then (their durable time
        runs until this call). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._due, self._tick_at = NEVER, _INF
        f = self.follower
        if f is not None:
            now = perf_counter()
            while len(f.in_flight) > 1:  # Orbax waited for it in the newest save's call
                self._finished(f, self._n, now, waited=True)
            if f.in_flight and self.adapter.finalized(f.in_flight[0].step) is not None:
                self._finished(f, self._n, now)  # committed by now (wait_until_finished)
            for pending in f.in_flight:
                log.info("save of step %d not reported: not finalized at close()", pending.step)
            f.close(self._n, reason, now)
        if self._sigterm is not None:
            self._sigterm.restore()
        atexit.unregister(self._atexit)

    # ------------------------------------------------------------------ slow path

    def _slow(self, n: int, now: float, previous: Sequence[Any], context: Any) -> bool:
        self._n = n
        if self._closed:
            self._due, self._tick_at = NEVER, _INF
            return False
        f = self.follower
        if f is None:
            f = self._start(n, now, previous)
        if self._answered_at is not None:  # the first call after a yes: the save returned
            step_s = f.step_time_s or 0.0
            f.save_returned(now - self._answered_at - step_s, n, now)
            self._answered_at = None
        while len(f.in_flight) > 1:  # Orbax waited for it in the newest save's call
            self._finished(f, n, now, waited=True)
        if f.in_flight and not context.is_saving_in_progress:
            self._finished(f, n, now)
        if self._preempt is not None:
            return self._preempted(f, n, now)
        if len(previous) != self._seen:  # a save of Orbax's own (another policy, force=)
            self._seen = len(previous)
            if previous:
                f.saved_elsewhere(previous[-1].step)
        tick = now >= self._tick_at
        if tick:
            self._tick_at = now + self._poll_s
        due = f.boundary(n, now, tick=tick)
        save = False
        if self._agreement is None:
            save = n >= due
            if save:
                f.save_started(n, f.schedule.due_reason or "plan", now)
            self._next = f.schedule.due
        elif n >= self._next:
            answer = self._agree(f, n, due)
            save, self._next = answer.save, answer.next_step
            if save:
                f.save_started(n, answer.reason, now)
        self._pending = f.pending is not None
        if save:
            self._answered_at = perf_counter()
            self._due = 0  # the next call measures how long the save blocked
        else:
            self._due = self._next
        return save

    def _on_sigterm(self, signum: int) -> None:
        # Runs between two bytecodes of the main thread: only flag; the next call acts.
        self._preempt = signum
        self._due = 0

    def _preempted(self, f: Follower, n: int, now: float) -> bool:
        """SIGTERM: save this step; at the next call wait until Orbax finalized it,
        say goodbye and deliver the signal again."""
        signum = self._preempt
        assert signum is not None
        if self._preempt_step is None:
            log.warning("SIGTERM: saving step %d, then exiting", n)
            self._preempt_step = n
            f.save_started(n, SIGTERM_REASON, now)
            self._pending = True
            self._answered_at = perf_counter()
            self._due = 0
            return True
        step = self._preempt_step
        if self.directory is None:
            log.warning("SIGTERM: no directory= given, so the commit of step %d cannot be "
                        "waited for", step)  # fmt: skip
        else:
            end = perf_counter() + SIGTERM_WAIT_S
            while self.adapter.finalized(step) is None and perf_counter() < end:
                time.sleep(0.01)  # Orbax's commit thread finishes the write
        self.close(SIGTERM_REASON)
        log.warning("re-delivering signal %d", signum)
        os.kill(os.getpid(), signum)
        return False

    def _agree(self, f: Follower, n: int, due: int) -> Answer:
        """The job's answer at agreement step ``n``: the primary's (it saves when its
        plan's ``due`` step is reached; it asks again at its next due step, or within
        ``agree_interval``), which every other process reads."""
        assert self._agreement is not None
        mine = None
        if self._agreement.primary:
            sched = f.schedule
            save = n >= due
            reason = (sched.due_reason or "plan") if save else ""
            if save:  # the plan after this save, as save_started() will leave it
                sched.saved(n)
            step_s = f.step_time_s
            every = max(1, int(self._agree_s / step_s)) if step_s else 1
            mine = Answer(save, reason, max(n + 1, min(sched.due, n + every)))
        return self._agreement.agree(n, mine)

    def _finished(self, f: Follower, n: int, now: float, *, waited: bool = False) -> None:
        """The oldest save in flight is done: its report, with its bytes when the
        directory is known. A step that is not finalized there failed, unless Orbax
        ``waited`` for it inside a later save's call (its retention may have removed
        it since: committed, bytes unknown)."""
        pending = f.in_flight[0]
        nbytes = self.adapter.finalized(pending.step)
        error = ""
        if nbytes is None and self.directory is not None and not waited:
            error = (
                f"Orbax reports no save in progress, but step {pending.step} is not "
                f"finalized in {self.directory}"
            )
        f.save_finished(n, now, nbytes=nbytes or 0, path=self.adapter.path(pending.step),
                        error=error)  # fmt: skip

    def _start(self, n: int, now: float, previous: Sequence[Any]) -> Follower:
        import jax

        rank, world = jax.process_index(), jax.process_count()
        who = Identity.here(self.job, rank, world)
        f = Follower(
            self.job, self.adapter, self._choice, who, directory=self.directory,
            socket=self._socket, daemon_timeout=self._daemon_timeout, decide_s=DECIDE_S,
        )  # fmt: skip
        self.follower = f
        if world > 1:
            self._agreement = PrimaryAnswer(JaxStore(), self.job, rank, world,
                                            timeout_s=self._agree_timeout)  # fmt: skip
        newest = max((p.step for p in previous if p.time < self._born), default=None)
        self._seen = len(previous)
        resumed = newest if newest is not None and n == newest + 1 else 0
        f.start(n, now, resumed_from=resumed)
        if self._sigterm is not None and world == 1:
            self._sigterm.install()
        self._tick_at = now + self._poll_s
        if rank == 0 or world == 1:
            notes.say(_where(n, newest, self.directory, rank, world))
        return f


def _where(n: int, newest: int | None, directory: Path | None, rank: int, world: int) -> str:
    """The line a run says once about where it continues from."""
    who = f"rank {rank}/{world} " if world > 1 else ""
    place = f" in {os.path.abspath(directory)}" if directory is not None else ""
    if newest is None:
        return f"{who}starting fresh: no Orbax checkpoint to resume from{place}"
    if n == newest + 1:
        return f"{who}resumed from step {newest} (Orbax step {newest}, finalized{place})"
    return f"{who}starting at step {n}; the newest finalized Orbax step{place} is {newest}"


def _weak_close(policy: SavePolicy) -> Callable[[], None]:
    ref = weakref.ref(policy)

    def close_at_exit() -> None:
        obj = ref()
        if obj is not None:
            obj.close()

    return close_at_exit
