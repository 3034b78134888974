"""The writes a simulated job has in flight, and what they do to its pace.

A save's write runs from the end of its blocking until ``end``, slowing compute by its
``slowdown`` meanwhile. With one tier there is at most one write; with two, a local
write and a durable one may overlap, and their slowdowns add up (the scenario keeps the
sum below 1), so the compute each loses is its own slowdown × its own duration, and a
save's δ stays blocking + slowdown × (latency − blocking) however the writes overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Write",
    "Writes",
]


@dataclass(frozen=True)
class Write:
    """One write in flight: ``tier`` ("durable" or "local") of checkpoint ``step``, ended
    (complete in its tier) at ``end``; ``blocking_s`` and ``latency_s`` are what its
    save report says (from its own call), ``slowdown`` what it costs compute."""

    tier: str
    step: int
    end: float
    slowdown: float
    blocking_s: float
    latency_s: float


class Writes:
    """The writes in flight, soonest end first."""

    def __init__(self) -> None:
        self.items: list[Write] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, write: Write) -> None:
        self.items.append(write)
        self.items.sort(key=lambda w: w.end)

    def clear(self) -> None:
        self.items.clear()

    def pop(self) -> Write:
        """The write that ends first, removed."""
        return self.items.pop(0)

    def next_end(self) -> float | None:
        return self.items[0].end if self.items else None

    def busy_until(self, tiers: tuple[str, ...]) -> float | None:
        """When the last write in flight to one of ``tiers`` ends (None: there is none)."""
        ends = [w.end for w in self.items if w.tier in tiers]
        return max(ends) if ends else None

    def slowdown(self, t: float) -> float:
        """The share of compute lost at ``t``."""
        return sum(w.slowdown for w in self.items if w.end > t)

    def durable_at(self, t: float) -> bool:
        """Whether a durable write is in flight at ``t`` (it loads the storage target)."""
        return any(w.tier == "durable" and w.end > t for w in self.items)

    def lost(self, t0: float, t1: float) -> float:
        """Compute seconds lost to the writes between ``t0`` and ``t1``."""
        return sum(w.slowdown * (min(t1, w.end) - t0) for w in self.items if w.end > t0)

    def time_to(self, t: float, need: float, step_s: float) -> float:
        """When ``need`` steps (> 0) of ``step_s`` seconds are done, computing from ``t``."""
        ends = [w for w in self.items if w.end > t]
        total = sum(w.slowdown for w in ends)
        for w in ends:
            steps = (w.end - t) * (1.0 - total) / step_s
            if steps >= need:
                return t + need * step_s / (1.0 - total)
            need -= steps
            t = w.end
            total -= w.slowdown
        return t + need * step_s
