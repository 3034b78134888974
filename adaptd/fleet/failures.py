"""Failures learned by the fleet: each host publishes what it saw, every host reads the sum.

One host sees a GPU failure every few months; a fleet of them sees one every few
hours. Each daemon publishes, per GPU model, a :class:`FailureRecord` under
``{prefix}failures/{host}/{model}`` (not leased: knowledge outlives the daemon):

- ``gpu_seconds`` and ``failures``: the exposure it watched and the failures it
  counted, the two sufficient statistics of the Gamma–Poisson posterior
  (:class:`adaptd.core.estimators.FailureRate`). :func:`fleet_rate` adds every host's
  to the prior, so a new job starts from what the fleet knows.
- ``lifetimes``: the GPU-seconds each incarnation of a job lived before it failed
  (age × GPUs), and ``survivals``: the same for incarnations that have not failed
  (still running, or ended cleanly: right-censored). A job of ``g`` GPUs whose
  failures are Weibull with shape k and mean ``M_gpu / g`` lives ``age × g``
  GPU-seconds, Weibull with the same shape and a scale set by ``M_gpu`` alone, so
  incarnations of jobs of every size pool into one fit (:func:`fit_shape`).

The shape's posterior is exact on a grid: with the Weibull written through
θ = scale^k and Jeffreys' prior 1/θ, θ integrates out in closed form, leaving
p(k | data) ∝ p(k) · k^d · Π tᵢ^(k−1) · (Σ tⱼ^k)^(−d) over the d failures tᵢ and all
lifetimes tⱼ (failed and censored). The prior on k is log-normal around 1
(exponential) with σ = 1, wide enough for anything from 0.2 to 5. The default
policy switches to the age-aware Weibull optimum only when the upper end of the
90% credible interval is below 1 (:meth:`ShapeFit.credibly_below`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from adaptd.core.estimators import FailureRate
from adaptd.fleet.session import EtcdSession

#: Version of the published record.
RECORD_VERSION = 1
#: Lifetimes and survivals kept per record (the newest): bounds the record near 20 KiB.
MAX_LIFETIMES = 500
#: The shape grid: log-spaced over the range the ``weibull`` policy accepts.
_GRID = 400
_K_MIN, _K_MAX = 0.05, 20.0


@dataclass(frozen=True)
class FailureRecord:
    """What one host learned about failures of one GPU model."""

    host: str
    gpu_model: str
    gpu_seconds: float = 0.0
    failures: float = 0.0
    lifetimes: tuple[float, ...] = ()  # GPU-seconds lived by incarnations that failed
    survivals: tuple[float, ...] = ()  # GPU-seconds lived by incarnations that did not
    updated: float = 0.0  # wall-clock time of the record
    #: The host's failure classes (:class:`~adaptd.fleet.classes.ClassTotals`, as a dict)
    #: under the JSON key ``classes``; None: not published (a daemon before them, whose
    #: records are read as ever; a daemon before them ignores the key).
    classes: Mapping[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not (self.gpu_seconds >= 0 and self.failures >= 0):
            raise ValueError(
                f"failure record of {self.host}/{self.gpu_model}: gpu_seconds and failures "
                f"must be >= 0, got {self.gpu_seconds!r}, {self.failures!r}"
            )
        if any(not (t > 0 and math.isfinite(t)) for t in (*self.lifetimes, *self.survivals)):
            raise ValueError(
                f"failure record of {self.host}/{self.gpu_model}: lifetimes and survivals "
                "must be finite GPU-seconds > 0"
            )
        object.__setattr__(self, "lifetimes", tuple(self.lifetimes[-MAX_LIFETIMES:]))
        object.__setattr__(self, "survivals", tuple(self.survivals[-MAX_LIFETIMES:]))

    def to_json(self) -> bytes:
        out: dict[str, Any] = {
            "version": RECORD_VERSION,
            "gpu_seconds": self.gpu_seconds,
            "failures": self.failures,
            "lifetimes": list(self.lifetimes),
            "survivals": list(self.survivals),
            "updated": self.updated,
        }
        if self.classes is not None:
            out["classes"] = dict(self.classes)
        return json.dumps(out).encode()

    @classmethod
    def from_json(cls, host: str, gpu_model: str, raw: bytes) -> FailureRecord:
        """Raises :class:`ValueError` for a malformed or foreign record."""
        try:
            d = json.loads(raw)
            if d.get("version") != RECORD_VERSION:
                raise ValueError(f"version {d.get('version')!r}, expected {RECORD_VERSION}")
            return cls(
                host=host,
                gpu_model=gpu_model,
                gpu_seconds=float(d["gpu_seconds"]),
                failures=float(d["failures"]),
                lifetimes=tuple(float(t) for t in d.get("lifetimes", ())),
                survivals=tuple(float(t) for t in d.get("survivals", ())),
                updated=float(d.get("updated", 0.0)),
                classes=d["classes"] if isinstance(d.get("classes"), dict) else None,
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"failure record of {host}/{gpu_model} unreadable: {exc}") from None


@dataclass
class PooledFailureRate(FailureRate):
    """This host's failure-rate posterior plus what the rest of the fleet published.

    ``failures``/``gpu_seconds`` stay this host's own (they are what it publishes and
    persists, :meth:`FailureRate.to_dict`); ``others_*`` are the other hosts' totals,
    refreshed from etcd, and kept while etcd is away (knowledge does not expire).
    """

    others_failures: float = 0.0
    others_gpu_seconds: float = 0.0

    @property
    def alpha(self) -> float:
        return self.prior_failures + self.failures + self.others_failures

    @property
    def beta(self) -> float:
        return (
            self.prior_failures * self.prior_gpu_mtbf_s
            + self.gpu_seconds
            + (self.others_gpu_seconds)
        )

    def local(self) -> FailureRate:
        """This host's own posterior (what it publishes)."""
        return FailureRate(
            prior_gpu_mtbf_s=self.prior_gpu_mtbf_s,
            prior_failures=self.prior_failures,
            failures=self.failures,
            gpu_seconds=self.gpu_seconds,
        )


def fleet_totals(
    records: Iterable[FailureRecord],
    *,
    gpu_model: str | None = None,
    exclude_host: str | None = None,
) -> tuple[float, float]:
    """(failures, GPU-seconds) summed over ``records`` of ``gpu_model`` (``None``: all),
    leaving out ``exclude_host``'s (this host's own, which it knows fresher)."""
    failures = gpu_seconds = 0.0
    for r in records:
        if (gpu_model is None or r.gpu_model == gpu_model) and r.host != exclude_host:
            failures += r.failures
            gpu_seconds += r.gpu_seconds
    return failures, gpu_seconds


def fleet_rate(
    records: Iterable[FailureRecord],
    local: FailureRate,
    *,
    gpu_model: str | None = None,
    host: str | None = None,
) -> PooledFailureRate:
    """The Gamma–Poisson posterior over the whole fleet: ``local`` (a host's own
    posterior, or a bare prior) plus every other host's published totals."""
    failures, gpu_seconds = fleet_totals(records, gpu_model=gpu_model, exclude_host=host)
    own = local.local() if isinstance(local, PooledFailureRate) else local
    return PooledFailureRate(
        **dataclasses.asdict(own), others_failures=failures, others_gpu_seconds=gpu_seconds
    )


@dataclass(frozen=True)
class ShapeFit:
    """The Weibull shape's posterior: median and the ``level`` credible interval."""

    shape: float
    low: float
    high: float
    failures: int
    level: float = 0.9
    survivals: int = 0
    grid: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def credibly_below(self, k: float = 1.0) -> bool:
        """True when the whole credible interval is below ``k`` (bursty failures)."""
        return self.high < k


def fit_shape(
    lifetimes: Sequence[float],
    survivals: Sequence[float] = (),
    *,
    level: float = 0.9,
    prior_sigma: float = 1.0,
    min_failures: int = 2,
) -> ShapeFit | None:
    """The posterior of the Weibull shape from failed and censored lifetimes (module
    docstring); ``None`` with fewer than ``min_failures`` failures."""
    import numpy as np
    from scipy.special import logsumexp

    if not 0 < level < 1:
        raise ValueError(f"credible level must be in (0, 1), got {level}")
    t_fail = np.asarray([t for t in lifetimes if t > 0], dtype=float)
    d = t_fail.size
    if d < max(1, min_failures):
        return None
    t_all = np.concatenate([t_fail, np.asarray([t for t in survivals if t > 0], dtype=float)])
    scale = float(np.exp(np.mean(np.log(t_all))))  # work in units near 1 (exact: k is scale-free)
    log_fail = np.log(t_fail / scale)
    log_all = np.log(t_all / scale)
    ks = np.geomspace(_K_MIN, _K_MAX, _GRID)
    log_k = np.log(ks)
    # log p(k|data) up to a constant
    log_sum = logsumexp(np.outer(ks, log_all), axis=1)  # log Σ t_j^k
    logp = (
        -0.5 * (log_k / prior_sigma) ** 2
        - log_k  # log-normal prior density on k (the 1/k of the change of variable)
        + d * log_k
        + (ks - 1.0) * log_fail.sum()
        - d * log_sum
    )
    # integrate over k on the log grid (dk = k dlogk)
    a = logp + log_k
    w = np.exp(a - a.max())
    cdf = np.cumsum(w) / w.sum()
    tail = (1.0 - level) / 2.0

    def quantile(q: float) -> float:
        return float(np.interp(q, cdf, ks))

    return ShapeFit(
        shape=quantile(0.5),
        low=quantile(tail),
        high=quantile(1.0 - tail),
        failures=int(d),
        level=level,
        survivals=int(t_all.size - d),
    )


def pooled(
    records: Iterable[FailureRecord], gpu_model: str | None = None
) -> tuple[list[float], list[float]]:
    """Every record's lifetimes and survivals (of ``gpu_model``, or all), pooled."""
    lifetimes: list[float] = []
    survivals: list[float] = []
    for r in records:
        if gpu_model is None or r.gpu_model == gpu_model:
            lifetimes.extend(r.lifetimes)
            survivals.extend(r.survivals)
    return lifetimes, survivals


def publish(session: EtcdSession, record: FailureRecord) -> None:
    """Write this host's record (kept after the daemon stops: it is knowledge)."""
    session.put(session.keys.failure(record.host, record.gpu_model), record.to_json(), leased=False)


def read_records(session: EtcdSession, *, since: int = 0) -> tuple[list[FailureRecord], list[str]]:
    """Every host's records (or those written at or after revision ``since``), and a
    line per unreadable one (skipped)."""
    out: list[FailureRecord] = []
    skipped: list[str] = []
    for e in session.get_prefix(session.keys.failures, min_mod_revision=since):
        parts = session.keys.failure_parts(e.key)
        if parts is None:
            continue
        try:
            out.append(FailureRecord.from_json(parts[0], parts[1], e.value))
        except ValueError as exc:
            skipped.append(str(exc))
    return out, skipped
