"""Levels from noisy measurements: the save-cost and step-time estimates a
:class:`~adaptd.core.estimators.JobTracker` keeps.

- :class:`LevelEstimate`: a median over recent saves, robust to one outlier, that
  jumps to a new level once two saves in a row agree on it (an NFS storm that makes
  saves 10x slower is followed after two saves and left after two more);
- :class:`StepTime`: the same level over step batches weighted by their steps, fed
  only the steady part of each batch (:func:`steady_part`: no first step, no retrace);
- :func:`extra_time_from_util`: the time a save took from the GPUs, from their
  utilisation before and during it.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "LEVEL_JUMP",
    "SAVE_WINDOW",
    "STEP_JUMP",
    "STEP_OUTLIER",
    "STEP_WINDOW",
    "LevelEstimate",
    "StepTime",
    "extra_time_from_util",
    "steady_part",
]

#: Saves remembered for the cost estimates.
SAVE_WINDOW = 5

#: How far (as a factor) two consecutive saves must sit from the current estimate,
#: on the same side, for the estimate to jump to them.
LEVEL_JUMP = 2.0

#: Step batches remembered for the step time, and the factor two batches in a row
#: must sit from it, on the same side, for it to jump to them (a doubling is followed
#: after two reports; batch means of a steady job vary by a few percent).
STEP_WINDOW = 5
STEP_JUMP = 1.5

#: A step this many times slower than the mean of the other steps of its batch is an
#: outlier with a cause (a retrace, an eval, a compile), left out of the step time.
STEP_OUTLIER = 3.0


class LevelEstimate:
    """A robust running level: weighted median of a short window, with change detection.

    A median alone ignores one outlier but needs half the window to follow a real
    shift. Here, when the two newest observations both differ from the median by
    more than ``jump``x in the same direction, the window restarts from them, so a
    10x slow-down is tracked after two observations and recovery after two more.

    Each observation may carry a weight (default 1: the plain median): a batch of 50
    steps weighs 50 times a batch of one, so one slow step alone in its report
    cannot outvote the steps around it.
    """

    def __init__(self, window: int = SAVE_WINDOW, jump: float = LEVEL_JUMP) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2 observations, got {window}")
        if not jump > 1:
            raise ValueError(f"jump must be a factor > 1, got {jump}")
        self.jump = jump
        self._window = window
        # (value, weight) pairs, oldest first: a short list, lighter than a deque (the
        # daemon keeps four of these for each of up to a thousand remembered jobs)
        self._obs: list[tuple[float, float]] = []
        self._last: tuple[float, float] | None = None
        self._median: float | None = None

    def add(self, value: float, weight: float = 1.0) -> None:
        """Record one observation (non-negative seconds) of weight ``weight`` (> 0).

        Raises :class:`ValueError` for a value or weight that is not a finite
        number in range.
        """
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"observation must be a finite number >= 0, got {value!r}")
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"weight must be a finite number > 0, got {weight!r}")
        level = self.value
        prev = self._last
        self._last = (value, weight)
        obs = self._obs
        if level is not None and prev is not None and len(obs) > 2:
            hi, lo = level * self.jump, level / self.jump
            if (value > hi and prev[0] > hi) or (value < lo and prev[0] < lo):
                obs[:] = [prev]
        obs.append((value, weight))
        if len(obs) > self._window:
            del obs[0]
        self._median = _weighted_median(obs)

    def raise_last(self, value: float) -> bool:
        """Raise the newest observation to ``value`` when it is larger (a slower rank's
        cost of the same save); True when the level's input changed."""
        if not self._obs or not (math.isfinite(value) and value > self._obs[-1][0]):
            return False
        weight = self._obs[-1][1]
        self._obs[-1] = (value, weight)
        self._last = (value, weight)
        self._median = _weighted_median(self._obs)
        return True

    @property
    def value(self) -> float | None:
        return self._median

    def values(self) -> list[float]:
        return [v for v, _ in self._obs]

    def load(self, values: Iterable[float]) -> None:
        """Start again from ``values`` (each of weight 1), e.g. from the store."""
        self._obs = [(float(v), 1.0) for v in values][-self._window :]
        self._last = self._obs[-1] if self._obs else None
        self._median = _weighted_median(self._obs) if self._obs else None


def _weighted_median(obs: Iterable[tuple[float, float]]) -> float:
    """The value with half the weight on either side; between two values, their mean
    (so equal weights give :func:`statistics.median`)."""
    pairs = sorted(obs)
    half = sum(w for _, w in pairs) / 2
    acc = 0.0
    low: float | None = None
    for v, w in pairs:
        acc += w
        if low is None and acc >= half * (1 - 1e-12):
            low = v
        if acc > half * (1 + 1e-12):
            return (low + v) / 2 if low is not None else v
    return pairs[-1][0]


def steady_part(
    count: int, mean_s: float, max_s: float = 0.0, max_steps: int = 1, warmup: bool = False
) -> tuple[int, float] | None:
    """The steps of a batch that show the job's pace: ``(steps, mean seconds)``, or
    None when none do.

    A batch of ``count`` steps of mean ``mean_s`` whose slowest ``step()`` call
    took ``max_s`` for ``max_steps`` steps (``max_s`` 0: not measured). That call is
    left out when ``warmup`` says it is the run's first step (tracing, compiling),
    or when it is :data:`STEP_OUTLIER` times slower per step than the rest. A
    warm-up batch that is nothing but the warm-up, or whose slowest step was not
    measured, shows nothing.
    """
    if count <= 0 or not (mean_s >= 0 and math.isfinite(mean_s)):
        return None
    if max_s > 0 and math.isfinite(max_s):
        k = min(max(1, max_steps), count)
        rest = count - k
        if rest <= 0:
            return None if warmup else (count, mean_s)
        rest_mean = max(0.0, mean_s * count - max_s) / rest
        if warmup or max_s / k > STEP_OUTLIER * rest_mean:
            return rest, rest_mean
        return count, mean_s
    return None if warmup else (count, mean_s)


class StepTime:
    """The job's steady step time, from batches of step timings (see :func:`steady_part`).

    A :class:`LevelEstimate` over the batches' steady means weighted by their steps:
    it converges on the first steady batch, ignores a slow batch among steady ones,
    and follows a lasting change (a slower phase) after two batches.
    """

    def __init__(self, window: int = STEP_WINDOW, jump: float = STEP_JUMP) -> None:
        self._level = LevelEstimate(window, jump)
        #: Steps left out so far as warm-up or outliers.
        self.ignored_steps = 0

    def add(
        self,
        count: int,
        mean_s: float,
        *,
        max_s: float = 0.0,
        max_steps: int = 1,
        warmup: bool = False,
    ) -> None:
        """One batch of ``count`` steps (see :func:`steady_part` for the rest)."""
        part = steady_part(count, mean_s, max_s, max_steps, warmup)
        if part is None:
            self.ignored_steps += max(0, count)
            return
        steps, mean = part
        self.ignored_steps += count - steps
        if mean > 0:
            self._level.add(mean, weight=steps)

    @property
    def value(self) -> float | None:
        return self._level.value

    def load(self, value: float | None) -> None:
        """Start from a step time learned before (one observation's worth)."""
        self._level.load([] if value is None else [value])


def extra_time_from_util(util_before: float, util_during: float, in_flight_s: float) -> float:
    """Extra step time a write caused, seen from NVML: the utilisation it took away.

    A GPU that was ``util_before`` busy and sags to ``util_during`` while a write
    runs for ``in_flight_s`` lost ``(1 − during/before) · in_flight_s`` of compute:
    the same interference the hook measures as longer steps.
    """
    if in_flight_s <= 0 or util_before <= 0:
        return 0.0
    return max(0.0, 1.0 - util_during / util_before) * in_flight_s
