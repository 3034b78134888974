"""Step-time and save-cost accounting, with the times passed in (pure, no clock).

The loop is timed at step boundaries only: a batch report needs the number of
steps and the wall time between two boundaries, minus the time the loop spent
blocked in a save (that time is the save's cost, not the step's).

The extra step time a save causes is measured over a *window*: from the moment the
save call returned until the first step boundary after the background write
finished (at least one step, since TF's deferred device-to-host work lands in the
first step after the call). ``extra = window wall time - steps * baseline``,
where the baseline is the mean step time between the previous save window and
this save. It is clamped at zero: noise can make a cheap save look negative.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepBatch:
    """Steps since the previous report: ``count`` steps ending at ``step``."""

    step: int
    count: int
    mean_s: float


class StepClock:
    """Turns (step, time) at report ticks into step batches, excluding blocked time."""

    def __init__(self, step: int, now: float) -> None:
        self._step = step
        self._time = now
        self._blocked = 0.0

    def blocked(self, seconds: float) -> None:
        """The loop was blocked ``seconds`` in a save since the last batch."""
        self._blocked += seconds

    def batch(self, step: int, now: float) -> StepBatch | None:
        """Close the current batch at ``step``/``now``; None when no step completed."""
        count = step - self._step
        if count <= 0:
            return None
        mean = max(0.0, now - self._time - self._blocked) / count
        self._step, self._time, self._blocked = step, now, 0.0
        return StepBatch(step=step, count=count, mean_s=mean)


class SaveWindow:
    """Measures one save's extra step time; see the module docstring."""

    def __init__(self, baseline_s: float | None, step: int, returned_at: float) -> None:
        self.baseline_s = baseline_s
        self.step = step
        self.returned_at = returned_at

    def extra(self, step: int, now: float) -> float:
        """Extra step time of the steps from the save's return to ``step``/``now``."""
        steps = step - self.step
        if steps <= 0 or self.baseline_s is None:
            return 0.0
        return max(0.0, (now - self.returned_at) - steps * self.baseline_s)


class Baseline:
    """Mean step time outside save windows: the yardstick for a save's extra time."""

    def __init__(self, step: int, now: float) -> None:
        self._step = step
        self._time = now
        self._blocked = 0.0
        self.mean_s: float | None = None

    def blocked(self, seconds: float) -> None:
        self._blocked += seconds

    def close(self, step: int, now: float) -> float | None:
        """A save starts at ``step``/``now``: the mean since the last restart point."""
        count = step - self._step
        if count > 0:
            self.mean_s = max(0.0, now - self._time - self._blocked) / count
        return self.mean_s

    def restart(self, step: int, now: float) -> None:
        """A save window ended at ``step``/``now``: measure afresh from here."""
        self._step, self._time, self._blocked = step, now, 0.0
