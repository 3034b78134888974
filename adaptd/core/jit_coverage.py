"""What a job's failures teach about just-in-time saves: which were covered.

A failure is *covered* when the job came back resuming from a just-in-time save (a
survivor saved the last completed step after a peer died, docs/multiworker.md), and
*uncovered* otherwise (a whole-job or whole-host failure, the last replica lost, a
save refused). The share covered, a Beta posterior mean with ``prior_uncovered``
pseudo-failures none of them covered (0 until a covered failure is seen, 2/3 after
two covered ones), is :attr:`JitCoverage.coverage`; with what a just-in-time save took
(:attr:`JitCoverage.save_s`, the median of the newest), it fills
:class:`~adaptd.core.snapshot.JobState`'s ``jit_coverage`` and ``jit_save_s``, so the
policy plans the periodic interval for the uncovered failures only
(``policies/tiers.py``). Pure: the daemon feeds it (``adaptd/daemon/jobs/table.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JitCoverage"]

#: Just-in-time save durations kept for the median.
KEEP = 16


@dataclass
class JitCoverage:
    """Counts of covered and uncovered failures of one job, and its just-in-time saves'
    durations. Raises ValueError for a prior that is not > 0 or negative counts."""

    covered: int = 0
    uncovered: int = 0
    prior_uncovered: float = 1.0
    durations: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prior_uncovered > 0:
            raise ValueError(f"prior_uncovered must be > 0, got {self.prior_uncovered!r}")
        if self.covered < 0 or self.uncovered < 0:
            raise ValueError(f"counts must be >= 0, got {self.covered}, {self.uncovered}")

    def failure(self, covered: bool) -> None:
        """One failure of the job, covered by a just-in-time save or not."""
        if covered:
            self.covered += 1
        else:
            self.uncovered += 1

    def saved(self, seconds: float) -> None:
        """A just-in-time save took ``seconds`` until durable."""
        self.durations = [*self.durations, max(0.0, float(seconds))][-KEEP:]

    @property
    def coverage(self) -> float:
        """The share of failures a just-in-time save covers (posterior mean)."""
        return self.covered / (self.covered + self.uncovered + self.prior_uncovered)

    @property
    def save_s(self) -> float | None:
        """What a just-in-time save takes (median of the newest; None: none seen)."""
        return statistics.median(self.durations) if self.durations else None

    def fields(self) -> dict[str, float]:
        """The :class:`~adaptd.core.snapshot.JobState` fields it fills (none before a
        covered failure or a just-in-time save was seen)."""
        out: dict[str, float] = {}
        if self.covered:
            out["jit_coverage"] = self.coverage
        if self.save_s is not None:
            out["jit_save_s"] = self.save_s
        return out

    def learned(self) -> dict[str, Any]:
        """Its part of what the tracker learned (``{"jit": ...}``), only for a job that
        saves just in time: a tracker without it exports what it exported before."""
        if not (self.covered or self.durations):
            return {}
        return {"jit": {"covered": self.covered, "uncovered": self.uncovered,
                        "save_s": self.durations}}  # fmt: skip

    @classmethod
    def from_learned(cls, learned: Any, default: JitCoverage) -> JitCoverage:
        """Read :meth:`learned`'s part of ``learned`` back (``default`` when it has none;
        anything unreadable is a fresh start)."""
        data = learned.get("jit") if isinstance(learned, Mapping) else None
        if data is None:
            return default
        if not isinstance(data, dict):
            return cls()
        try:
            durations = [float(x) for x in data.get("save_s", ())][-KEEP:]
            return cls(int(data.get("covered", 0)), int(data.get("uncovered", 0)),
                       durations=durations)  # fmt: skip
        except (TypeError, ValueError):
            return cls()
