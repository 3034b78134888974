"""Step-time and save-cost accounting, with the times passed in (pure, no clock).

The loop is timed at step boundaries only: a batch report needs the number of
steps and the wall time between two boundaries, minus the time the loop spent
blocked in a save (that time is the save's cost, not the step's). The hook also
keeps the slowest ``step()`` call of the batch, and the first batch of a run is
marked as warm-up, so the daemon can leave tracing and retracing out of the step
time (:func:`adaptd.core.estimators.steady_part`).

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
    max_s: float = 0.0  # the slowest step() call (0: not measured)
    max_steps: int = 1  # steps that call covered
    warmup: bool = False  # the batch holds the run's first step


class StepClock:
    """Turns (step, time) at report ticks into step batches, excluding blocked time.

    The first batch it closes is the run's warm-up batch.
    """

    def __init__(self, step: int, now: float) -> None:
        self._step = step
        self._time = now
        self._blocked = 0.0
        self._first = True

    def blocked(self, seconds: float) -> None:
        """The loop was blocked ``seconds`` in a save since the last batch."""
        self._blocked += seconds

    def batch(
        self, step: int, now: float, slowest_s: float = 0.0, slowest_steps: int = 1
    ) -> StepBatch | None:
        """Close the current batch at ``step``/``now``; None when no step completed.

        ``slowest_s``/``slowest_steps``: the batch's slowest ``step()`` call, as the
        hook timed it (0: not timed).
        """
        count = step - self._step
        if count <= 0:
            return None
        mean = max(0.0, now - self._time - self._blocked) / count
        self._step, self._time, self._blocked = step, now, 0.0
        warmup, self._first = self._first, False
        return StepBatch(
            step=step,
            count=count,
            mean_s=mean,
            max_s=max(0.0, slowest_s),
            max_steps=max(1, min(slowest_steps, count)),
            warmup=warmup,
        )


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
