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
from adaptd.protocol import job as protocol

__all__ = ["BEAT_INTERVAL_S", "Heartbeat", "JobAborted"]

log = logging.getLogger("adaptd.client")

#: How often a rank beats: the daemon's tick, so a stopped beat is seen within seconds.
BEAT_INTERVAL_S = 1.0


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
        self.limits = {"stall_floor_s": stall_floor_s, "stall_cap_s": stall_cap_s}
        self._link = DaemonLink(endpoint, curve_server_key=curve_server_key,
                                curve_client_key=curve_client_key)  # fmt: skip
        self._stop = threading.Event()
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
                self.aborted = msg
                log.error("the daemon aborts the job: %s", msg.reason)
                self.on_abort(msg)
            elif isinstance(msg, protocol.Error) and msg.code == "unknown_peer":
                # the daemon has not heard this rank's hello (yet, or again after a
                # restart): the training thread's link says it; beats go on meanwhile
                continue
            elif isinstance(msg, protocol.Error):
                log.warning("the daemon refuses heartbeats (%s: %s): hang detection is off "
                            "for this rank", msg.code, msg.message)  # fmt: skip
                return False
        return True
