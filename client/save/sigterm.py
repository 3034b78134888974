"""SIGTERM (preemption) for the hook: a handler that only flags, and its removal.

The handler runs between two bytecodes of the main thread, so it only records the
signal and makes the next step take the slow path; the hook saves there, waits until
the save is durable, puts the previous handler back and delivers the signal again.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("adaptd.client")

#: Why a SIGTERM saves: the reason of its save, and the goodbye of a rank it stops.
SIGTERM_REASON = "SIGTERM"


class SigtermHandler:
    """Calls ``on_signal(signum)`` on SIGTERM while installed."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._prev: Any = None
        self.installed = False

    def install(self) -> None:
        """Install the handler (only from the main thread, and only over a Python or
        default handler: an ignored SIGTERM, or one owned by native code, is left
        alone)."""
        if threading.current_thread() is not threading.main_thread():
            log.info("not on the main thread: SIGTERM is not handled by the hook")
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev is signal.SIG_IGN or prev is None:
            return
        self._prev = prev
        signal.signal(signal.SIGTERM, self._handle)
        self.installed = True

    def _handle(self, signum: int, frame: Any) -> None:
        self._on_signal(signum)

    def restore(self) -> None:
        """Put the previous handler back (idempotent)."""
        if self.installed:
            self.installed = False
            try:
                signal.signal(signal.SIGTERM, self._prev)
            except (ValueError, TypeError) as exc:  # not the main thread any more
                log.debug("could not restore the SIGTERM handler: %s", exc)


__all__ = ["SIGTERM_REASON", "SigtermHandler"]
