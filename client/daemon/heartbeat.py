"""The rank's heartbeat: a thread that tells the daemon the process is alive while its
training loop is blocked (in a collective, a stuck step), and that hears the daemon's
:class:`~adaptd.protocol.job.Abort` when the job stalled.

The training thread's own link only speaks when ``step()`` runs, so a loop blocked in
an all-reduce falls silent like a dead one. This thread has a connection of its own
(a second :class:`~adaptd.client.daemon.link.DaemonLink`: ZeroMQ sockets are not
shared across threads), sends a :class:`~adaptd.protocol.job.Beat` every
``interval_s`` with the loop's step and what of the hook holds it (read from
attributes the loop already keeps: nothing is added to ``step()``), and waits on the
socket in between. The daemon tells a rank that beats but makes no progress from one
whose beats stopped (dead, stopped ``T``), and answers beats with an Abort once it
judged the job stalled: :attr:`Heartbeat.on_abort` runs in this thread, while the
training thread is still blocked (it aborts the collectives).

A rank whose process was stopped (SIGSTOP) and continued could not beat meanwhile: its
loop goes on at once, before this thread's next beat is answered. So before it writes
anything the hook asks :meth:`Heartbeat.stale` and, when it is, waits for the answer to
a fresh beat (:meth:`Heartbeat.catch_up`): a rank the others gave up on hears the Abort
and does not write over their just-in-time save (measured in
tests/multiworker/test_hang.py: a chief stopped before its hook saw a save step, once
continued, started that save within milliseconds, before the answer to its heartbeat's
next beat). The Abort is handed over only once :attr:`Heartbeat.on_abort` has run, so
what the hook reads afterwards (its own record of the Abort, which on_abort sets) says
so too: handed over first, a continued chief read the hook's record still unset and
saved over the survivors' save (CI; tests/client/test_heartbeat.py).

Without a daemon the beats are dropped (``IMMEDIATE``) at no cost, and the hook's
collective timeout stays the bound on a hang. A daemon older than the message refuses
it (an :class:`~adaptd.protocol.job.Error`): the thread stops, logging it once. A daemon
that has not heard the rank's hello (yet, or since it restarted) answers ``unknown_peer``:
the thread beats on until the training thread's link says hello again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from adaptd.client.daemon.link import DaemonLink
from adaptd.core.stall import DEFAULT_FLOOR_S
from adaptd.protocol import job as protocol

__all__ = [
    "ANSWER_S",
    "BEAT_INTERVAL_S",
    "CATCH_UP_S",
    "STALE_BEATS",
    "Heartbeat",
    "JobAborted",
    "stale_after",
]

log = logging.getLogger("adaptd.client")

#: How often a rank beats: the daemon's tick, so a stopped beat is seen within seconds.
BEAT_INTERVAL_S = 1.0
#: A last beat older than this many intervals says the thread could not beat: the
#: process was stopped (or starved); the hook catches up before it writes. Never more
#: than half the daemon's floor (:func:`stale_after`): a rank stopped for less than
#: the gap would go on to save unchecked, and the daemon aborts after its floor.
STALE_BEATS = 3
#: How long the answer to a beat after a gap is awaited: a daemon on the host answers
#: within milliseconds, but on a loaded host (load average 8-16 on 2 cores, the tests')
#: 0.5 s was missed; no answer by then means "not aborted". Paid once, by a rank that
#: was stopped for seconds anyway.
ANSWER_S = 3.0
#: The longest the hook waits, catching up, for a fresh beat and its answer.
CATCH_UP_S = 5.0


def stale_after(interval_s: float, stall_floor_s: float | None) -> float:
    """The gap between beats past which the rank checks with the daemon before it saves:
    :data:`STALE_BEATS` intervals, but at most half the floor of the daemon's threshold
    (the hook's ``stall_floor``, else the default), and at least 1.5 intervals. A job is
    aborted no sooner than its floor after its last step, and a stopped rank does not
    step, so a rank the daemon gave up on was stopped for about the floor at least: with
    a gap limit above it (3 s against the tests' floor of 2 s, seen once in a suite run)
    a chief stopped for 2.9 s came back, saw no gap, and wrote over the survivor's
    just-in-time save before its heartbeat read the queued Abort."""
    floor = DEFAULT_FLOOR_S if stall_floor_s is None else stall_floor_s
    return min(STALE_BEATS * interval_s, max(1.5 * interval_s, 0.5 * floor))


class JobAborted(RuntimeError):
    """Raised by ``step()`` of a rank that comes back after the daemon aborted its
    stalled job (the others saved and exited): it must not train on or save."""


class Heartbeat:
    """Beats for ``job``'s ``rank`` to the daemon at ``endpoint`` from a daemon thread.

    Args:
        position: the loop's newest completed step (read, never written).
        holding: what of the hook holds the loop now ("save", "round" or "").
        on_abort: called once, in the thread, with the daemon's Abort.
        interval_s: seconds between beats.
        stall_floor_s, stall_cap_s: the hook's limits of the daemon's threshold (None:
            the daemon's), sent with each beat.
        curve_server_key, curve_client_key: as for :class:`DaemonLink` (``tcp://``).

    Raises:
        ValueError: an endpoint or keys :class:`DaemonLink` refuses.
    """

    def __init__(
        self,
        endpoint: str,
        job: str,
        rank: int,
        *,
        position: Callable[[], int],
        holding: Callable[[], str],
        on_abort: Callable[[protocol.Abort], None],
        interval_s: float = BEAT_INTERVAL_S,
        stall_floor_s: float | None = None,
        stall_cap_s: float | None = None,
        curve_server_key: str | os.PathLike[str] | None = None,
        curve_client_key: str | os.PathLike[str] | None = None,
    ) -> None:
        self.job, self.rank = job, rank
        self.position, self.holding, self.on_abort = position, holding, on_abort
        self.interval_s = interval_s
        self.stale_s = stale_after(interval_s, stall_floor_s)
        self.limits = {"stall_floor_s": stall_floor_s, "stall_cap_s": stall_cap_s}
        self._link = DaemonLink(endpoint, curve_server_key=curve_server_key,
                                curve_client_key=curve_client_key)  # fmt: skip
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._beat_at = time.monotonic()  # when the newest beat was sent (or the start)
        self._settle_by = 0.0  # until then the answer to a beat after a gap is awaited
        self._thread = threading.Thread(target=self._run, name="adaptd-heartbeat", daemon=True)
        #: The Abort heard (None: none).
        self.aborted: protocol.Abort | None = None
        self.beats = 0

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the thread (it closes its connection); idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def stale(self) -> bool:
        """True when the daemon may have given this rank up unheard: the thread runs but
        sent no beat for :attr:`stale_s` (:func:`stale_after`; the process is being continued
        after a stop, or starved), or its first beat after such a gap has not had
        :data:`ANSWER_S` to be answered. Costs a clock read."""
        now = time.monotonic()
        return self._thread.is_alive() and (
            now - self._beat_at > self.stale_s or now < self._settle_by
        )

    def catch_up(self, timeout_s: float = CATCH_UP_S) -> protocol.Abort | None:
        """(The training thread, when :meth:`stale`.) Wait until a beat after the gap
        had :data:`ANSWER_S` to be answered, at most ``timeout_s`` in all; the daemon's
        Abort if it was heard (then :attr:`on_abort` has run), else None."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.aborted is None:
                now = time.monotonic()
                fresh = now - self._beat_at <= self.stale_s
                if now >= deadline or (fresh and now >= self._settle_by):
                    break
                until = self._settle_by if fresh else deadline
                self._changed.wait(max(0.001, min(deadline, until) - now))
        return self.aborted

    def _run(self) -> None:
        link = self._link
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                holding = self.holding()
                beat = protocol.Beat(v=protocol.VERSION, job=self.job, rank=self.rank,
                                     step=self.position(), holding=holding,
                                     **self.limits)  # fmt: skip
                if link.send(beat, now):
                    self.beats += 1
                sent = time.monotonic()  # not ``now``: the thread may have stopped since
                with self._changed:
                    if sent - self._beat_at > self.stale_s:
                        self._settle_by = sent + ANSWER_S  # after a gap: await the answer
                    self._beat_at = sent
                    self._changed.notify_all()
                deadline = now + self.interval_s
                while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
                    if link.poll(left) and not self._heard(link.receive(time.monotonic())):
                        return
        except Exception:  # the heartbeat must never break training
            log.exception("the heartbeat thread failed: hang detection is off for this rank")
        finally:
            link.close()

    def _heard(self, messages: list[protocol.DaemonMessage]) -> bool:
        """Act on the daemon's answers; False: stop beating."""
        for msg in messages:
            if isinstance(msg, protocol.Abort) and self.aborted is None:
                log.error("the daemon aborts the job: %s", msg.reason)
                try:
                    self.on_abort(msg)
                finally:
                    # only now: :meth:`catch_up` returns the Abort once on_abort has run
                    # (the hook's "aborted" is set by it; set here first, a training
                    # thread that came back from a stop read it, found the hook's unset
                    # and saved over the survivors' just-in-time save: seen in CI)
                    with self._changed:
                        self.aborted = msg
                        self._changed.notify_all()
            elif isinstance(msg, protocol.Error) and msg.code == "unknown_peer":
                # the daemon has not heard this rank's hello (yet, or again after a
                # restart): the training thread's link says it; beats go on meanwhile
                continue
            elif isinstance(msg, protocol.Error):
                log.warning("the daemon refuses heartbeats (%s: %s): hang detection is off "
                            "for this rank", msg.code, msg.message)  # fmt: skip
                return False
        return True
