"""A fleet's failure history drawn from a known distribution: the simulator's fleet input.

The daemon learns failures from what the other hosts published (:mod:`adaptd.fleet.failures`).
The simulator gives a simulated job the same input, drawn from the scenario's own failure
distribution, so per-job learning and fleet learning can be compared on the same truth:

- the fleet ran ``gpus`` GPUs (jobs of ``job_gpus`` each) for ``days``: that is the
  exposure, ``gpus × days`` GPU-seconds;
- each incarnation of a job lives a Weibull(k) number of GPU-seconds whose mean is the
  per-GPU MTBF (k = 1: exponential). A job of g GPUs whose own failures are Weibull
  with mean M/g lives exactly that many GPU-seconds (see :mod:`adaptd.fleet.failures`),
  so one stream of lifetimes serves jobs of every size;
- each of the fleet's ``gpus / job_gpus`` job slots draws lifetimes until its share of the
  exposure is used; every draw that ended inside it is a failure, the last one is cut
  off at the end (a survival, right-censored).

The result is the :class:`~adaptd.fleet.failures.FailureRecord` a host would have
published after watching that fleet: totals for the Gamma–Poisson rate, lifetimes and
survivals for the shape. Seeded and pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.core.estimators import FailureRate
from adaptd.core.snapshot import FleetSample
from adaptd.fleet.failures import FailureRecord, PooledFailureRate, fit_shape, fleet_rate

DAY = 86_400.0


@dataclass(frozen=True)
class FleetHistory:
    """How much fleet history a simulated job starts with."""

    gpus: int = 4096
    days: float = 30.0
    job_gpus: int = 512

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.job_gpus < 1 or self.job_gpus > self.gpus:
            raise ValueError(
                f"fleet history: need 1 <= job_gpus <= gpus, got job_gpus={self.job_gpus}, "
                f"gpus={self.gpus}"
            )
        if not self.days > 0:
            raise ValueError(f"fleet history: days must be > 0, got {self.days}")

    @property
    def exposure_gpu_s(self) -> float:
        return self.gpus * self.days * DAY


def draw_history(
    history: FleetHistory,
    *,
    gpu_mtbf_s: float,
    shape: float,
    seed: int,
    gpu_model: str = "sim",
) -> FailureRecord:
    """One fleet's record (see the module docstring); ``shape`` 1 is exponential."""
    import numpy as np

    from adaptd.core.model import weibull_scale

    if not gpu_mtbf_s > 0 or not shape > 0:
        raise ValueError(f"gpu_mtbf_s and shape must be > 0, got {gpu_mtbf_s}, {shape}")
    rng = np.random.default_rng(seed)
    scale = weibull_scale(gpu_mtbf_s, shape)
    slots = max(1, history.gpus // history.job_gpus)
    share = history.exposure_gpu_s / slots
    lifetimes: list[float] = []
    survivals: list[float] = []
    for _ in range(slots):
        used = 0.0
        while True:
            life = float(scale * rng.weibull(shape))
            if used + life >= share:
                if share - used > 0:
                    survivals.append(share - used)
                break
            lifetimes.append(max(life, 1e-9))
            used += life
    return FailureRecord(
        host="fleet-history",
        gpu_model=gpu_model,
        gpu_seconds=history.exposure_gpu_s,
        failures=float(len(lifetimes)),
        lifetimes=tuple(lifetimes),
        survivals=tuple(survivals),
    )


def job_inputs(
    record: FailureRecord, prior: FailureRate, *, hosts: int = 0
) -> tuple[PooledFailureRate, FleetSample]:
    """What a job of a daemon in that fleet starts from: the failure-rate posterior with
    the fleet's totals (its own observations still empty), and the snapshot's fleet facts
    (the fitted shape). The simulator gives its tracker and snapshots these."""
    rate = fleet_rate([record], prior)
    fit = fit_shape(record.lifetimes, record.survivals)
    sample = FleetSample(
        hosts=hosts,
        failure_shape=fit.shape if fit else None,
        failure_shape_high=fit.high if fit else None,
    )
    return rate, sample
