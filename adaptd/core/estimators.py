"""Turn a job's raw reports into the figures policies read.

:class:`JobTracker` is fed step reports, save requests, save reports and the
job's life-cycle (failure, restart) by the daemon for every job it serves, by the
client's embedded fallback for its own job, and by the simulator, and produces a
frozen :class:`~adaptd.core.snapshot.JobState`. It is pure bookkeeping: callers pass
the time in, so it is deterministic and testable; no clock, no I/O.

- δ (save cost) and L (durable latency) come from :class:`LevelEstimate`: a
  median over recent saves, robust to one outlier, that jumps to a new level once
  two saves in a row agree on it, so an NFS storm that makes saves 10x slower is
  followed after two saves and left after two more.
- The step time comes from :class:`StepTime`, the same level over step batches
  weighted by their steps, fed only the steady part of each batch: the run's first
  step (tracing, an XLA compile) and a step far slower than the rest of its batch (a
  retrace) are left out, so a 3 s first step followed by 20 ms steps gives 20 ms
  from the first batch after it, and a phase that doubles the step time is followed
  after two batches.
- M comes from :class:`FailureRate`, a Gamma–Poisson posterior on the per-GPU
  failure rate, shared by all the jobs on a host and fed by the failures and the
  GPU-seconds the trackers watch. Job M = per-GPU M ÷ the job's GPUs.
- With a local tier (issue 24), the local saves' δ₁, L₁ and the restarts in place
  (R₁) are learned apart from the durable figures, with the same estimates; and with
  :class:`~adaptd.core.failure_rates.FailureClasses`, the job's process and host failure
  rates and the share of failures a just-in-time save covered.
- A job that saves just in time (docs/multiworker.md) learns which of its failures
  were *covered*: the job came back resuming from a just-in-time save (a survivor
  saved the last completed step after a peer died), not otherwise (a whole-job or
  whole-host failure, the last replica lost, a save refused). The share covered, a
  Beta posterior mean with ``prior_uncovered`` pseudo-failures none of them covered
  (0 until a covered failure is seen, 2/3 after two covered ones), and what a
  just-in-time save took (the median of the newest) fill
  :class:`~adaptd.core.snapshot.JobState`'s ``jit_coverage`` and ``jit_save_s``
  (:class:`JitCoverage`), so the policy plans the periodic interval for the
  uncovered failures only (``policies/tiers.py``).
- :func:`extra_time_from_util`: the time a save took from the GPUs, from their
  utilisation before and during it.
- Everything learned exports to a plain JSON-able dict (:meth:`JobTracker.learned`,
  :meth:`FailureRate.to_dict`) for the daemon's store, and imports back.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptd.core.failure_rates import (
    LEARNED_VERSION,
    PRIOR_GPU_MTBF_S,
    FailureClasses,
    FailureRate,
)
from adaptd.core.snapshot import JobState

__all__ = [
    "LEARNED_VERSION",
    "LEVEL_JUMP",
    "PRIOR_GPU_MTBF_S",
    "SAVE_WINDOW",
    "STEP_JUMP",
    "STEP_OUTLIER",
    "STEP_WINDOW",
    "FailureRate",
    "JitCoverage",
    "JobTracker",
    "LevelEstimate",
    "StepTime",
    "extra_time_from_util",
    "steady_part",
    "weighted_median",
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
        self._median = weighted_median(obs)

    def raise_last(self, value: float) -> bool:
        """Raise the newest observation to ``value`` when it is larger (a slower rank's
        cost of the same save); True when the level's input changed."""
        if not self._obs or not (math.isfinite(value) and value > self._obs[-1][0]):
            return False
        weight = self._obs[-1][1]
        self._obs[-1] = (value, weight)
        self._last = (value, weight)
        self._median = weighted_median(self._obs)
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
        self._median = weighted_median(self._obs) if self._obs else None


def weighted_median(obs: Iterable[tuple[float, float]]) -> float:
    """The value of ``(value, weight)`` pairs with half the weight on either side;
    between two values, their mean (so equal weights give :func:`statistics.median`).
    ``obs`` must not be empty (IndexError)."""
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


#: Just-in-time save durations kept for the median.
JIT_KEEP = 16


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
        self.durations = [*self.durations, max(0.0, float(seconds))][-JIT_KEEP:]

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
            durations = [float(x) for x in data.get("save_s", ())][-JIT_KEEP:]
            return cls(int(data.get("covered", 0)), int(data.get("uncovered", 0)),
                       durations=durations)  # fmt: skip
        except (TypeError, ValueError):
            return cls()


def _check_tier(tier: str) -> None:
    if tier not in ("durable", "local"):
        raise ValueError(f'tier must be "durable" or "local", got {tier!r}')


#: The local tier's figures in a JobState, and their keys in :meth:`JobTracker.learned`.
_LOCAL_FIELDS = ("local_save_cost_s", "local_latency_s", "local_restore_s")
_LOCAL_KEYS = ("local_save_costs_s", "local_latencies_s", "local_restores_s")


class JobTracker:
    """Accumulates one job's reports into a :class:`JobState`."""

    def __init__(
        self,
        job: str,
        *,
        world_size: int = 1,
        gpus: int = 1,
        start_step: int = 0,
        state_bytes: int | None = None,
        gpu_mtbf_s: float = PRIOR_GPU_MTBF_S,
        failure_rate: FailureRate | None = None,
        local_tier: bool = False,
        failure_classes: FailureClasses | None = None,
    ) -> None:
        if gpu_mtbf_s <= 0:
            raise ValueError(f"gpu_mtbf_s must be > 0, got {gpu_mtbf_s}")
        self.job = job
        self.world_size = world_size
        self.gpus = max(1, gpus)
        self.start_step = start_step
        self.state_bytes = state_bytes
        #: Shared by the jobs of a host when the caller passes one in.
        self.failure_rate = failure_rate or FailureRate(prior_gpu_mtbf_s=gpu_mtbf_s)
        #: Whether this job's failures and exposure teach ``failure_rate``. False for a
        #: multi-host job whose plan another host's daemon decides: that daemon counts
        #: the job's failure, once (docs/multiworker.md).
        self.counts_failures = True
        #: The GPUs of this job that the shared posterior counts (:mod:`adaptd.core.gpu_claims`;
        #: set by the daemon from its host's GPU count, else the claim).
        self.exposure_gpus: Callable[[], int] = lambda: self.gpus
        #: The job saves to a local tier beside durable storage (two tiers, issue 24).
        self.local_tier = local_tier
        #: Process and host failure rates and the covered share, when learned.
        self.failure_classes = failure_classes
        #: Which failures a just-in-time save covered, and what such a save took.
        self.jit = JitCoverage()
        self._cost_step: int | None = None  # the save the newest cost observation is of
        self.step = start_step
        self.time = 0.0
        self._step_time = StepTime()
        self.last_save_step: int | None = None
        self.last_save_time: float | None = None
        self.last_durable_step: int | None = None
        self.last_durable_save_step: int | None = None  # newest requested durable
        self.save_in_flight = False
        self.saves = 0
        self.failed_saves = 0
        self.failures = 0
        self._costs = LevelEstimate()
        self._latencies = LevelEstimate()
        self._restores = LevelEstimate()
        self._local = (LevelEstimate(), LevelEstimate(), LevelEstimate())  # δ₁, L₁, R₁
        self.restore_s: float | None = None
        self.life_start: float | None = None  # first report of this incarnation
        self.last_failure_time: float | None = None
        self._watch_time: float | None = None  # exposure is counted from here
        self._last_accrued = 0.0

    # -------------------------------------------------------------- inputs

    def on_steps(
        self,
        time: float,
        step: int,
        count: int,
        mean_s: float,
        save_in_flight: bool = False,
        *,
        max_s: float = 0.0,
        max_steps: int = 1,
        warmup: bool = False,
    ) -> None:
        """A batch of ``count`` steps with mean duration ``mean_s`` ended at ``step``.

        ``max_s``/``max_steps``: the slowest ``step()`` call of the batch and the steps
        it covered (0: not measured); ``warmup``: the batch holds the run's first step,
        whose time is tracing or compiling, not the job's pace. See :class:`StepTime`
        for what the step time takes from them. ``count`` 0 only moves the step.

        The time since the previous report counts as watched exposure
        (job GPUs × seconds) for the failure-rate posterior.
        """
        if self.life_start is None:
            self.life_start = time
        if self._watch_time is not None and time > self._watch_time:
            self._last_accrued = time - self._watch_time
            if self.counts_failures:
                gpus = self.exposure_gpus()
                self.failure_rate.observe(self._last_accrued * gpus)
                if self.failure_classes is not None:
                    self.failure_classes.observe(self._last_accrued, gpus)
        self._watch_time = time if self._watch_time is None else max(self._watch_time, time)
        self.time = max(self.time, time)
        self.step = max(self.step, step)
        self.save_in_flight = save_in_flight
        if count > 0:
            self._step_time.add(count, mean_s, max_s=max_s, max_steps=max_steps, warmup=warmup)

    def on_save_requested(self, time: float, step: int, durable: bool = True) -> None:
        """A save of ``step`` was asked for; ``durable``: it goes to durable storage
        (always with one tier; with two, every k-th)."""
        self.time = max(self.time, time)
        self.last_save_step = step
        self.last_save_time = time
        self.save_in_flight = True
        if durable:
            self.last_durable_save_step = step

    def on_save_report(
        self,
        time: float,
        step: int,
        *,
        blocking_s: float,
        durable_s: float,
        extra_step_s: float = 0.0,
        ok: bool = True,
        gpu_sag_s: float | None = None,
        tier: str = "durable",
    ) -> None:
        """A save finished (or failed). Only successful saves teach the cost model.

        δ = ``blocking_s`` + the extra step time the write caused: the hook's
        ``extra_step_s``, or ``gpu_sag_s`` (the same interference seen as NVML
        utilisation sag, see :func:`extra_time_from_util`) when that is larger.
        ``tier``: "durable" (durable storage) or "local" (the local tier, whose δ₁ and
        L₁ are learned apart, and which makes nothing durable). Raises
        :class:`ValueError` for another tier.
        """
        _check_tier(tier)
        self.time = max(self.time, time)
        self.save_in_flight = False
        if self.last_save_step is None or step > self.last_save_step:
            self.last_save_step = step
            self.last_save_time = time
        if not ok:
            self.failed_saves += 1
            return
        self.saves += 1
        extra = max(extra_step_s, gpu_sag_s or 0.0)
        if tier == "local":
            self._local[0].add(blocking_s + extra)
            self._local[1].add(max(durable_s, blocking_s))
            return
        self.last_durable_step = max(step, self.last_durable_step or 0)
        self.last_durable_save_step = max(step, self.last_durable_save_step or 0)
        self._costs.add(blocking_s + extra)
        self._cost_step = step
        self._latencies.add(max(durable_s, blocking_s))

    def on_slower_rank(self, step: int, cost_s: float, latency_s: float = 0.0) -> bool:
        """Another rank's cost of the save at ``step``, already counted from the first
        rank's report: δ of a job is its slowest rank's, so the observation is raised
        to ``cost_s`` when larger (and the latency to ``latency_s``). Only the newest
        counted save can be revised; True when the cost changed."""
        if step != self._cost_step:
            return False
        if latency_s > 0:
            self._latencies.raise_last(latency_s)
        return self._costs.raise_last(cost_s)

    def on_restart(self, restore_s: float, tier: str = "durable") -> None:
        """The job is back after ``restore_s`` seconds away (vanished → first step),
        from a save of ``tier`` ("durable", or "local": a restart in place, R₁).

        The down time is not exposure: whatever the last step report counted of it
        is taken back from the failure-rate posterior. Raises :class:`ValueError` for
        another tier.
        """
        _check_tier(tier)
        if tier == "local":
            self._local[2].add(max(0.0, restore_s))
        else:
            self._restores.add(max(0.0, restore_s))
            self.restore_s = self._restores.value
        down = min(max(0.0, restore_s), self._last_accrued)
        if down > 0 and self.counts_failures:
            gpus = self.exposure_gpus()
            rate = self.failure_rate
            rate.gpu_seconds = max(0.0, rate.gpu_seconds - down * gpus)
            if self.failure_classes is not None:
                self.failure_classes.retract(down, gpus)
        self._last_accrued = 0.0

    def on_failure(self, time: float, kind: str | None = None, covered: bool = False) -> None:
        """The job failed: it vanished without a goodbye and came back (or will) from
        an older step. Counts one failure and restarts the age clock.

        ``kind`` ("process": it came back on the same host with its local tier intact;
        "host": elsewhere, or its local tier gone; None: not known) and ``covered`` (it
        came back from a just-in-time save) teach the failure classes, when learned.
        """
        self.failures += 1
        self.last_failure_time = time
        if self.counts_failures:
            self.jit.failure(covered)
            self.failure_rate.failure()
            classes = self.failure_classes
            if classes is not None:
                classes.failure(kind, covered)
            if self._watch_time is not None and time > self._watch_time:
                gpus = self.exposure_gpus()
                self.failure_rate.observe((time - self._watch_time) * gpus)
                if classes is not None:
                    classes.observe(time - self._watch_time, gpus)
        self._watch_time = None
        self._last_accrued = 0.0
        self.save_in_flight = False

    def on_resume(self, time: float, step: int, tier: str | None = None) -> None:
        """A new incarnation starts from checkpoint ``step`` at ``time`` (hello), from
        the ``tier`` it was restored from when known ("durable": that step is durable,
        e.g. a just-in-time save made durable; "local"). Raises :class:`ValueError` for
        another tier."""
        if tier is not None:
            _check_tier(tier)
        self.start_step = step
        self.step = step
        self.time = max(self.time, time)
        self.save_in_flight = False
        for name in ("last_save_step", "last_durable_step"):
            value = getattr(self, name)
            if value is not None and value > step:
                setattr(self, name, step)
        if tier == "durable":
            self.last_durable_step = step
        # a durable copy asked for but not reported done was lost with the job
        self.last_durable_save_step = self.last_durable_step
        self.last_save_time = None
        self.life_start = time
        self._watch_time = time
        self._last_accrued = 0.0

    # -------------------------------------------------------------- outputs

    @property
    def step_time_s(self) -> float | None:
        """The job's steady seconds per step (None until a steady batch was seen)."""
        return self._step_time.value

    @property
    def save_cost_s(self) -> float | None:
        return self._costs.value

    @property
    def save_latency_s(self) -> float | None:
        return self._latencies.value

    @property
    def gpu_mtbf_s(self) -> float:
        return self.failure_rate.gpu_mtbf_s

    @property
    def mtbf_s(self) -> float:
        return self.failure_rate.gpu_mtbf_s / self.gpus

    def time_since_failure_s(self, now: float | None = None) -> float | None:
        """Age of the job since its last failure, else since its first report."""
        now = self.time if now is None else now
        origin = self.last_failure_time if self.last_failure_time is not None else self.life_start
        return None if origin is None else max(0.0, now - origin)

    def state(self, **overrides: object) -> JobState:
        """The current :class:`JobState`; ``overrides`` set fields the tracker does not own."""
        fields: dict[str, Any] = {
            "job": self.job,
            "step": self.step,
            "time": self.time,
            "world_size": self.world_size,
            "gpus": self.gpus,
            "start_step": self.start_step,
            "step_time_s": self.step_time_s,
            "last_save_step": self.last_save_step,
            "last_save_time": self.last_save_time,
            "last_durable_step": self.last_durable_step,
            "save_in_flight": self.save_in_flight,
            "saves": self.saves,
            "save_cost_s": self._costs.value,
            "save_latency_s": self._latencies.value,
            "restore_s": self.restore_s,
            "mtbf_s": self.mtbf_s,
            "time_since_failure_s": self.time_since_failure_s(),
            "state_bytes": self.state_bytes,
            "last_durable_save_step": self.last_durable_save_step,
        }
        if self.local_tier:
            fields["local_tier"] = True
            for name, level in zip(_LOCAL_FIELDS, self._local, strict=True):
                fields[name] = level.value
        if self.failure_classes is not None:
            fields.update(self.failure_classes.fields(self.gpus))
        else:
            fields.update(self.jit.fields())
        if overrides:
            fields.update(overrides)
        return JobState(**fields)  # one constructor call: the simulator calls this a lot

    # -------------------------------------------------------------- persistence

    def learned(self) -> dict[str, Any]:
        """What this tracker learned about the job, as a plain JSON-able dict.

        The failure-rate posterior is not included: it belongs to the host (see
        :meth:`FailureRate.to_dict`).
        """
        out: dict[str, Any] = {
            "version": LEARNED_VERSION,
            "save_costs_s": self._costs.values(),
            "save_latencies_s": self._latencies.values(),
            "restores_s": self._restores.values(),
            "step_time_s": self.step_time_s,
            "saves": self.saves,
            "failures": self.failures,
            **self.jit.learned(),
        }
        if self.local_tier:
            out.update(
                {key: level.values() for key, level in zip(_LOCAL_KEYS, self._local, strict=True)}
            )
        if self.failure_classes is not None:
            out["failure_classes"] = self.failure_classes.to_dict()
        return out

    def load_learned(self, data: Mapping[str, Any]) -> None:
        """Restore what :meth:`learned` exported (e.g. after a daemon restart).

        Raises :class:`ValueError` for a dict of another version, so a stale record
        is reported instead of silently mis-read.
        """
        if data.get("version") != LEARNED_VERSION:
            raise ValueError(
                f"learned record for job {self.job!r} has version {data.get('version')!r}, "
                f"expected {LEARNED_VERSION}; discard it to relearn from scratch"
            )
        self._costs.load(data.get("save_costs_s", ()))
        self._latencies.load(data.get("save_latencies_s", ()))
        self._restores.load(data.get("restores_s", ()))
        self.restore_s = self._restores.value
        for key, level in zip(_LOCAL_KEYS, self._local, strict=True):
            if key in data:
                level.load(data[key])
        classes = data.get("failure_classes")
        if classes is not None and self.failure_classes is not None:
            self.failure_classes = FailureClasses.from_dict(classes)
        st = data.get("step_time_s")
        if st is not None:
            self._step_time.load(float(st))
        self.saves = int(data.get("saves", self.saves))
        self.failures = int(data.get("failures", self.failures))
        self.jit = JitCoverage.from_learned(data, self.jit)
