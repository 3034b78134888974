"""Log a recurring fault once, count every occurrence.

Samplers run every second: a fault that repeats (an unsupported NVML query, an
unreadable /proc file) must not flood the journal, yet must stay visible. The
first occurrence of each key is logged; later ones only bump a counter that
``adaptd status`` and tests can read.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable

__all__ = [
    "OnceLog",
]


class OnceLog:
    """Per-key "log the first time, count every time"."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.counts: Counter[Hashable] = Counter()

    def __call__(
        self, key: Hashable, level: int, msg: str, *args: object, exc_info: bool = False
    ) -> bool:
        """Count ``key``; log ``msg % args`` only on its first occurrence.

        Returns True when this call logged.
        """
        self.counts[key] += 1
        if self.counts[key] > 1:
            return False
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    @property
    def total(self) -> int:
        return sum(self.counts.values())
