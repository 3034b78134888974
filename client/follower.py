"""Following the plan for a framework that asks at each step whether to save.

Orbax's ``CheckpointManager`` asks its ``SaveDecisionPolicy`` at every
``manager.save(step, ...)`` and saves when told to; so would a Keras-style callback of
another framework. :class:`Follower` is the framework-neutral part of such an adapter:
the daemon session (Hello, step reports, save reports, liveness, the embedded policy
while no daemon answers: :mod:`adaptd.client.daemon.session`), the save schedule
(:mod:`adaptd.client.save.schedule`) and the cost accounting
(:mod:`adaptd.client.save.costs`), put together as the TensorFlow hook puts them, with
none of its TensorFlow parts. The adapter tells it, with the times passed in:

* ``boundary(n, now)`` at the framework's calls (the step counter: ``n`` completed
  steps), which returns the step the next save is due at;
* ``save_started`` when the framework starts a save, ``save_returned`` when the loop
  runs again (with the seconds the save blocked it), ``save_finished`` when the save
  became durable (or failed), with the bytes it wrote: the Save report the daemon
  gets is built from these, exactly as the TensorFlow hook's;
* ``close`` at the end (the Goodbye that tells the daemon the job was not lost).

What the framework itself provides is :class:`~adaptd.client.framework.FrameworkAdapter`.
Everything runs on the training thread; nothing here imports a framework.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from adaptd.client.agreement.authority import Solo
from adaptd.client.agreement.ranks import Identity
from adaptd.client.daemon.link import DAEMON_TIMEOUT_S, DaemonLink
from adaptd.client.daemon.policy import PolicyChoice
from adaptd.client.daemon.session import DaemonSession, HelloFacts
from adaptd.client.framework import FrameworkAdapter
from adaptd.client.save.costs import Baseline, SaveWindow, StepClock
from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.estimators import JobTracker
from adaptd.protocol import job as protocol
from adaptd.protocol import paths

__all__ = ["DECIDE_S", "POLL_S", "Follower", "Pending"]

log = logging.getLogger("adaptd.client")

#: Defaults of the TensorFlow hook's ``poll_interval`` and ``decide_interval``.
POLL_S = 0.025
DECIDE_S = 5.0


@dataclass
class Pending:
    """The save in flight: of ``step``, for ``reason``, started at ``started_at``;
    ``blocked_s`` and ``window`` are known once the loop runs again."""

    step: int
    reason: str
    started_at: float
    returned: bool = False
    blocked_s: float = 0.0
    window: SaveWindow | None = field(default=None, repr=False)


class Follower:
    """One process's plan following for a framework that asks whether to save.

    Args:
        job: the job id (checked by the caller).
        adapter: the framework's side (:class:`~adaptd.client.framework.FrameworkAdapter`).
        choice: the policy the job was given (:meth:`PolicyChoice.of`).
        who: this process (rank ``who.rank`` of ``who.world_size``).
        directory: the checkpoint directory named in Hello (None: not told).
        socket: the daemon's endpoint (None: ``$ADAPTD_SOCKET`` or the default).
        daemon_timeout, report_s, decide_s: as the TensorFlow hook's settings.

    Raises:
        ValueError: a ``tcp://`` socket without CURVE keys, a bad timeout.
    """

    def __init__(
        self,
        job: str,
        adapter: FrameworkAdapter,
        choice: PolicyChoice,
        who: Identity,
        *,
        directory: Path | None = None,
        socket: str | None = None,
        daemon_timeout: float = DAEMON_TIMEOUT_S,
        report_s: float = protocol.REPORT_INTERVAL_S,
        decide_s: float = DECIDE_S,
    ) -> None:
        self.job, self.adapter, self.who = job, adapter, who
        self.endpoint = paths.endpoint(socket)
        self.link = DaemonLink(self.endpoint, timeout_s=daemon_timeout)
        self.schedule = SaveSchedule()
        self.session = DaemonSession(
            self.link, self.schedule, Solo(self.schedule), who, directory, choice,
            report_s=report_s, decide_s=decide_s,
        )  # fmt: skip
        #: The saves in flight, oldest first: a framework that starts a save while the
        #: previous one is still being written waits for that one in the new save's call.
        self.in_flight: deque[Pending] = deque()
        #: Every save's report, in order.
        self.history: list[protocol.SaveReport] = []
        self.tracker: JobTracker | None = None
        self._clock: StepClock | None = None
        self._baseline: Baseline | None = None
        self._closed = False

    @property
    def pending(self) -> Pending | None:
        """The newest save in flight (None: none)."""
        return self.in_flight[-1] if self.in_flight else None

    @property
    def step_time_s(self) -> float | None:
        """The mean step time measured so far (None: not yet)."""
        return self.tracker.step_time_s if self.tracker is not None else None

    def start(self, step: int, now: float, *, resumed_from: int = 0) -> None:
        """Begin at ``step`` (``resumed_from``: the step the run restored, 0 fresh):
        say hello, run the embedded policy once, wait briefly for a daemon that is
        there to answer with its plan."""
        gpus = self.adapter.accelerators()
        self.tracker = JobTracker(
            self.job, world_size=self.who.world_size, gpus=max(1, gpus), start_step=step
        )
        self._clock = StepClock(step, now)
        self._baseline = Baseline(step, now)
        self.schedule.last_saved_step = resumed_from or None
        self.session.start(HelloFacts(0, resumed_from, gpus, ""), self.tracker, self._clock, now)
        self.session.decide(step, now, False)
        self.session.await_welcome(step, lambda: None)

    def boundary(self, n: int, now: float, *, tick: bool) -> int:
        """At ``n`` completed steps: read the daemon's messages and send the step report
        when ``tick`` (the poll time came), re-run the embedded policy when due.
        Returns the step the next save is due at (:data:`~adaptd.client.save.schedule.NEVER`:
        none planned)."""
        in_flight = self.pending is not None
        if tick:
            self.session.tick(n, now, in_flight, (0.0, 1))
        if self.session.decide_due(now):
            self.session.decide(n, now, in_flight)
        return self.schedule.due

    def saved_elsewhere(self, step: int) -> None:
        """The framework saved ``step`` on its own (another policy, a forced save): the
        plan counts from there."""
        if self.schedule.last_saved_step is None or step > self.schedule.last_saved_step:
            self.schedule.saved(step)

    def save_started(self, step: int, reason: str, now: float) -> None:
        """The framework starts saving ``step`` (``reason``: why, for the report)."""
        assert self.tracker is not None and self._baseline is not None
        self.tracker.on_save_requested(now, step)
        self.schedule.saved(step)
        self._baseline.close(step, now)
        self.in_flight.append(Pending(step, reason, now))

    def save_returned(self, blocked_s: float, n: int, now: float) -> None:
        """The loop runs again at ``n``/``now`` after the save blocked it ``blocked_s``."""
        assert self._clock is not None and self._baseline is not None
        pending = self.pending
        if pending is None or pending.returned:
            return
        pending.returned, pending.blocked_s = True, max(0.0, blocked_s)
        self._clock.blocked(pending.blocked_s)
        self._baseline.blocked(pending.blocked_s)
        pending.window = SaveWindow(self._baseline.mean_s, n, now)

    def save_finished(
        self, n: int, now: float, *, nbytes: int, path: str = "", error: str = ""
    ) -> protocol.SaveReport | None:
        """The oldest save in flight became durable (or failed: ``error``) as seen at
        ``n``/``now``: its report goes to the daemon and to the embedded estimates.
        Returns it (None: no save was in flight)."""
        assert self.tracker is not None and self._baseline is not None
        if not self.in_flight:
            return None
        pending = self.in_flight.popleft()
        ok = not error
        extra = pending.window.extra(n, now) if pending.window is not None else 0.0
        report = protocol.SaveReport(
            v=protocol.VERSION, job=self.job, rank=self.who.rank, step=pending.step,
            blocking_s=min(pending.blocked_s, protocol.MAX_SECONDS),
            durable_s=min(max(0.0, now - pending.started_at), protocol.MAX_SECONDS),
            bytes=max(0, nbytes), extra_step_s=min(extra, protocol.MAX_SECONDS), ok=ok,
            error=error[: protocol.MAX_TEXT], path=path[: protocol.MAX_TEXT],
            reason=pending.reason[: protocol.MAX_TEXT],
        )  # fmt: skip
        self.history.append(report)
        self.tracker.on_save_report(
            now, pending.step, blocking_s=report.blocking_s, durable_s=report.durable_s,
            extra_step_s=report.extra_step_s, ok=ok,
        )  # fmt: skip
        self._baseline.restart(n, now)
        self.session.saved(report, now)
        if not ok:
            log.warning("save of step %d failed: %s", pending.step, error)
        return report

    def close(self, n: int, reason: str, now: float) -> None:
        """The last step report and the Goodbye; the socket is closed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.tracker is not None:
            self.session.report_steps(n, now, False, (0.0, 1))
            self.session.goodbye(n, reason, now)
        self.link.close(linger_ms=200)
