"""Each simulated failure's class and whether a just-in-time save covers it.

A failure is a *process* failure (the host and its local tier survive) with probability
``process_share``, else a *host* failure; independently, a survivor holds a complete
replica and saves just in time with probability ``peer_share`` (issues 23 and 24). Both
come from their own seeded stream, two draws per failure whatever the scenario's shares,
so every policy of a comparison meets the same classes at the same failures (common
random numbers) and the failure times are those of the same seed without classes.
"""

from __future__ import annotations

import numpy as np

from adaptd.sim.scenario import Scenario

__all__ = [
    "FailureKinds",
]


class FailureKinds:
    """Classes of one seed's failures, in order: :meth:`next` for each failure."""

    CHUNK = 256

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self._rng = np.random.default_rng([seed, 0xC1A55])
        self._process = scenario.process_share
        self._peer = scenario.peer_share
        self._buf: list[list[float]] = []
        self._i = 0

    def next(self) -> tuple[str, bool]:
        """("process" or "host", covered by a just-in-time save) of the next failure."""
        if self._i >= len(self._buf):
            self._buf = self._rng.random((self.CHUNK, 2)).tolist()
            self._i = 0
        u, v = self._buf[self._i]
        self._i += 1
        return ("process" if u < self._process else "host"), v < self._peer
