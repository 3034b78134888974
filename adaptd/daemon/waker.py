"""Waking the daemon's loop from outside it: a signal, another thread, a granted slot.

The loop waits on nothing but its poller. :class:`Waker` is a non-blocking socket pair
whose read end the poller watches: :meth:`Waker.wake` (safe from any thread) makes the
current or next poll return at once, and its write end is what
:func:`signal.set_wakeup_fd` is given, so a signal wakes the poll too.
:meth:`Waker.tick_soon` also asks the loop to run its tick at once instead of at the next
second (the fleet's thread calls it when a write slot is granted).

A waker is made before the daemon, so a part built before it (the fleet) can be given
:meth:`Waker.tick_soon` in its constructor (:class:`adaptd.daemon.assembly.Seams`).
"""

from __future__ import annotations

import contextlib
import socket as _socket

__all__ = ["Waker"]


class Waker:
    """The loop's wake-up pipe and its "tick now" flag."""

    def __init__(self) -> None:
        self._r, self._w = _socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)
        self._tick_soon = False

    def fileno(self) -> int:
        """The end the poller watches."""
        return self._r.fileno()

    @property
    def wakeup_fd(self) -> int:
        """A non-blocking fd for :func:`signal.set_wakeup_fd`: a signal wakes the poll."""
        return self._w.fileno()

    def wake(self) -> None:
        """Make the current (or next) poll return at once; safe from any thread."""
        with contextlib.suppress(OSError):
            self._w.send(b"\0")

    def drain(self) -> None:
        """Empty the pipe (the poll saw it readable)."""
        with contextlib.suppress(BlockingIOError, OSError):
            while self._r.recv(4096):
                pass

    def tick_soon(self) -> None:
        """Run the loop's tick at once (safe from any thread)."""
        self._tick_soon = True
        self.wake()

    def take_tick_soon(self) -> bool:
        """Whether a tick was asked for since the last call (the loop's)."""
        asked, self._tick_soon = self._tick_soon, False
        return asked
