"""Pacing an upload: a bandwidth cap shared by a destination's uploads, and the pause
that lets a job's own save have the disk.

:class:`Throttle` is a token bucket, one per destination. :class:`Pacer` wraps one
upload's reads: before each chunk it waits while ``should_yield()`` holds (at most
``max_yield_s`` at a time, so replication cannot be starved), takes the chunk's bytes
from the throttle, and reports progress after it is written.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import IO

__all__ = ["CHUNK", "Pacer", "Throttle"]

#: Bytes read, hashed and written at a time: the unit of throttling, yielding and progress.
CHUNK = 1 << 20


class Throttle:
    """A token bucket capping the bytes per second of every upload that shares it.

    One per destination: concurrent uploads to it together stay under the cap.
    ``take(n)`` accounts ``n`` bytes and sleeps as long as the cap requires (outside
    the lock, so concurrent takers queue fairly). The bucket starts empty and holds
    at most ``burst_s`` seconds' worth of bytes, so over any window of ``t`` seconds
    at most ``rate * (t + burst_s)`` bytes pass. ``rate_bytes_s=None`` is unlimited.

    Raises:
        ValueError: the rate is not a positive finite number, or the burst is negative.
    """

    def __init__(
        self,
        rate_bytes_s: float | None,
        *,
        burst_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate_bytes_s is not None and (
            isinstance(rate_bytes_s, bool)
            or not isinstance(rate_bytes_s, int | float)
            or not math.isfinite(rate_bytes_s)
            or rate_bytes_s <= 0
        ):
            raise ValueError(
                f"Throttle rate must be a positive number of bytes/s or None (unlimited), "
                f"got {rate_bytes_s!r}"
            )
        if not burst_s >= 0:
            raise ValueError(f"Throttle burst_s must be >= 0 seconds, got {burst_s!r}")
        self.rate = None if rate_bytes_s is None else float(rate_bytes_s)
        self.burst_s = float(burst_s)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = 0.0
        self._last = clock()

    def take(self, n: int) -> None:
        """Account ``n`` bytes; block until the cap allows them."""
        if self.rate is None or n <= 0:
            return
        with self._lock:
            now = self._clock()
            refill = (now - self._last) * self.rate
            self._tokens = min(self.rate * self.burst_s, self._tokens + refill)
            self._last = now
            self._tokens -= n
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)


class Pacer:
    """Throttle, yield and progress around each chunk of one upload."""

    def __init__(
        self,
        throttle: Throttle | None,
        should_yield: Callable[[], bool] | None,
        progress: Callable[[int], None] | None,
        *,
        yield_poll_s: float,
        max_yield_s: float,
    ) -> None:
        self.throttle = throttle
        self.should_yield = should_yield
        self.progress = progress
        self.yield_poll_s = yield_poll_s
        self.max_yield_s = max_yield_s
        self.yielded_s = 0.0

    def read(self, src: IO[bytes]) -> bytes:
        """The next chunk of ``src``, once ``should_yield`` and the throttle allow it.

        A pause holds at most this one chunk in memory; the local disk is not read
        again until it ends.
        """
        chunk = src.read(CHUNK)
        if not chunk:
            return chunk
        if self.should_yield is not None:
            # timed from before the first answer: ``should_yield`` announces the pause
            # (status, log) before it returns, and a thread descheduled right there can
            # find the save over when it runs again; the pause began at the announcement
            t0 = time.monotonic()
            if self.should_yield():
                deadline = t0 + self.max_yield_s
                while self.should_yield() and time.monotonic() < deadline:
                    time.sleep(self.yield_poll_s)
                self.yielded_s += time.monotonic() - t0
        if self.throttle is not None:
            self.throttle.take(len(chunk))
        return chunk

    def sent(self, n: int) -> None:
        if self.progress is not None:
            self.progress(n)
