"""Refused messages: counted by code, told to the sinks, logged.

Both of the daemon's sockets refuse what they cannot take (a frame that does not
decode, a report from the wrong connection, an operator who may not ask). Each
refusal is counted in :attr:`DaemonStats.rejected` under its code (``adaptd status``
shows them) and becomes a :class:`~adaptd.events.MessageRejected` (the metrics
count it too); :meth:`Refusals.refuse` also logs it, at most once per code per
throttle period, since a flood of bad frames must not flood the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from adaptd import events as ev
from adaptd.daemon.stats import DaemonStats
from adaptd.logfmt import Throttle, logfmt

__all__ = ["Refusals"]

log = logging.getLogger("adaptd.server")


class Refusals:
    """Counts, tells and logs the daemon's refusals."""

    def __init__(
        self,
        *,
        stats: DaemonStats,
        emit: Callable[[ev.Event], None],
        clock: Callable[[], float],
    ) -> None:
        self.stats = stats
        self.emit = emit
        self.clock = clock
        self._throttle = Throttle()

    def count(self, code: str) -> None:
        """One refusal under ``code``: counted and told to the sinks."""
        self.stats.rejected[code] += 1
        self.emit(ev.MessageRejected(self.clock(), code))

    def refuse(self, code: str, message: str, **fields: object) -> None:
        """:meth:`count`, and a warning (throttled per code) with ``fields`` and why."""
        self.count(code)
        if self._throttle(f"reject:{code}"):
            log.warning(logfmt("rejected", code=code, **fields, message=message))
