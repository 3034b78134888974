"""Failure-rate posteriors: the job's MTBF, and its two failure classes.

:class:`FailureRate` is the Gamma–Poisson posterior on failures per unit of exposure
(GPU-seconds for the per-GPU rate every policy reads as M, the job's MTBF being the
per-GPU MTBF ÷ the job's GPUs). :class:`FailureClasses` learns, with the same machinery,
the two classes two tiers plan for (DESIGN.md, "Two tiers and just-in-time saves"):

- *process* failures leave the host and its local tier up (the job restarts in place
  from its newest local save). Their prior is per *job*, not per GPU: software faults do
  not scale with the GPU count, so their exposure is the job's seconds;
- *host* failures lose the host and its local tier (the job restarts elsewhere from its
  newest durable save). Their prior is per GPU, exposure GPU-seconds, as M's;

and the share of failures a just-in-time save covered (issue 23: a survivor saved the
last completed step, so the job came back from it), a Beta posterior whose prior says
none is covered until some was seen. Pure bookkeeping, fed by :class:`~adaptd.core.estimators.
JobTracker`; everything exports to plain JSON-able dicts for the daemon's store.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "FAILURE_KINDS",
    "LEARNED_VERSION",
    "PRIOR_GPU_MTBF_S",
    "PRIOR_HOST_GPU_MTBF_S",
    "PRIOR_PROCESS_MTBF_S",
    "FailureClasses",
    "FailureRate",
]

#: Prior mean time between interruptions per GPU: Llama 3's 54-day run saw 419
#: unexpected interruptions on 16,384 GPUs, about 50,000 GPU-hours each.
PRIOR_GPU_MTBF_S = 16_384 * 54 * 24 * 3600 / 419

#: Version of the dicts :meth:`JobTracker.learned` and :meth:`FailureRate.to_dict` write.
LEARNED_VERSION = 1


@dataclasses.dataclass
class FailureRate:
    """Gamma–Poisson posterior on failures per GPU-second.

    Prior: Gamma(α₀, β₀) with α₀ = ``prior_failures`` pseudo-failures seen over
    β₀ = α₀ · ``prior_gpu_mtbf_s`` GPU-seconds, i.e. the prior mean rate is
    1/``prior_gpu_mtbf_s``. Observing ``n`` failures over ``E`` GPU-seconds gives
    Gamma(α₀ + n, β₀ + E); :attr:`gpu_mtbf_s` is 1 / posterior-mean rate. A weak
    prior (one pseudo-failure) lets a host's own history take over within a few
    failures, while a quiet host slowly earns a longer MTBF.
    """

    prior_gpu_mtbf_s: float = PRIOR_GPU_MTBF_S
    prior_failures: float = 1.0
    failures: float = 0.0
    gpu_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not (self.prior_gpu_mtbf_s > 0 and math.isfinite(self.prior_gpu_mtbf_s)):
            raise ValueError(f"prior_gpu_mtbf_s must be > 0 seconds, got {self.prior_gpu_mtbf_s!r}")
        if not self.prior_failures > 0:
            raise ValueError(f"prior_failures must be > 0, got {self.prior_failures!r}")
        if self.failures < 0 or self.gpu_seconds < 0:
            raise ValueError(
                f"failures and gpu_seconds must be >= 0, got {self.failures}, {self.gpu_seconds}"
            )

    @property
    def alpha(self) -> float:
        return self.prior_failures + self.failures

    @property
    def beta(self) -> float:
        return self.prior_failures * self.prior_gpu_mtbf_s + self.gpu_seconds

    @property
    def gpu_mtbf_s(self) -> float:
        """Per-GPU MTBF in seconds (1 / posterior mean of the rate)."""
        return self.beta / self.alpha

    def observe(self, gpu_seconds: float) -> None:
        """Add watched exposure (GPUs × seconds a job ran without failing)."""
        if gpu_seconds > 0:
            self.gpu_seconds += gpu_seconds

    def failure(self, count: int = 1) -> None:
        """Count ``count`` observed failures."""
        if count < 0:
            raise ValueError(f"failure count must be >= 0, got {count}")
        self.failures += count

    def credible_mtbf_s(self, q: float) -> float:
        """The ``q`` quantile of the per-GPU MTBF posterior (e.g. 0.05 / 0.95)."""
        from scipy.stats import gamma

        if not 0 < q < 1:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
        # MTBF = 1/rate, so its q quantile is 1 / the rate's (1-q) quantile
        return 1.0 / float(gamma.ppf(1.0 - q, self.alpha, scale=1.0 / self.beta))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": LEARNED_VERSION,
            "prior_gpu_mtbf_s": self.prior_gpu_mtbf_s,
            "prior_failures": self.prior_failures,
            "failures": self.failures,
            "gpu_seconds": self.gpu_seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FailureRate:
        """Rebuild from :meth:`to_dict`; raises :class:`ValueError` on a foreign dict."""
        _check_version(data, "failure-rate", "the prior")
        return cls(
            prior_gpu_mtbf_s=float(data["prior_gpu_mtbf_s"]),
            prior_failures=float(data["prior_failures"]),
            failures=float(data["failures"]),
            gpu_seconds=float(data["gpu_seconds"]),
        )


def _check_version(data: Mapping[str, Any], record: str, prior: str) -> None:
    if data.get("version") != LEARNED_VERSION:
        raise ValueError(
            f"{record} record has version {data.get('version')!r}, "
            f"expected {LEARNED_VERSION}; discard it to start from {prior}"
        )


#: Llama 3's run (54 days, 16,384 GPUs; "The Llama 3 Herd of Models", Table 5) by class:
#: of the 419 unexpected interruptions, software bugs (54), NCCL watchdog timeouts (7)
#: and dependencies (2) leave the hosts up. Per job: one every 54 days / 63, about 20.6 h.
PRIOR_PROCESS_MTBF_S = 54 * 24 * 3600 / 63

#: The other 356 (GPUs, their memory, network, hosts: the host is drained or lost) on
#: 16,384 GPUs: about 59,600 GPU-hours each. With the process prior, a 16,384-GPU job's
#: prior MTBF is Llama 3's 3.1 hours again.
PRIOR_HOST_GPU_MTBF_S = 16_384 * 54 * 24 * 3600 / 356

#: The classes a failure is observed as (``None``, unknown, counts as a host failure:
#: the safe assumption, what one tier assumes of every failure).
FAILURE_KINDS = ("process", "host")


@dataclasses.dataclass
class FailureClasses:
    """Posteriors on a job's process and host failure rates and on the share of its
    failures a just-in-time save covered.

    ``process`` counts its exposure in job-seconds (its ``gpu_seconds`` are the job's
    seconds, its ``gpu_mtbf_s`` the job's process MTBF), ``host`` in GPU-seconds. A
    failure counts for its class whether or not a just-in-time save covered it;
    ``covered`` and ``uncovered`` count that separately, and :attr:`coverage` is their
    Beta posterior mean with ``prior_uncovered`` pseudo-failures, none covered: 0 until
    a covered failure is seen, 2/3 after two covered ones, → 1 as they keep coming.
    """

    process: FailureRate = dataclasses.field(
        default_factory=lambda: FailureRate(prior_gpu_mtbf_s=PRIOR_PROCESS_MTBF_S)
    )
    host: FailureRate = dataclasses.field(
        default_factory=lambda: FailureRate(prior_gpu_mtbf_s=PRIOR_HOST_GPU_MTBF_S)
    )
    covered: float = 0.0
    uncovered: float = 0.0
    prior_uncovered: float = 1.0

    def __post_init__(self) -> None:
        if not self.prior_uncovered > 0:
            raise ValueError(f"prior_uncovered must be > 0, got {self.prior_uncovered!r}")
        if self.covered < 0 or self.uncovered < 0:
            raise ValueError(
                f"covered and uncovered must be >= 0, got {self.covered}, {self.uncovered}"
            )

    def observe(self, seconds: float, gpus: int) -> None:
        """Add ``seconds`` the job of ``gpus`` GPUs ran watched without failing."""
        if seconds > 0:
            self.process.observe(seconds)
            self.host.observe(seconds * max(1, gpus))

    def retract(self, seconds: float, gpus: int) -> None:
        """Take back exposure counted that was no exposure (a restart's down time)."""
        if seconds > 0:
            self.process.gpu_seconds = max(0.0, self.process.gpu_seconds - seconds)
            self.host.gpu_seconds = max(0.0, self.host.gpu_seconds - seconds * max(1, gpus))

    def failure(self, kind: str | None = None, covered: bool = False) -> None:
        """Count one failure of ``kind`` ("process", "host"; None: not known, counted
        as a host failure) that a just-in-time save did or did not cover.

        Raises :class:`ValueError` for another kind.
        """
        if kind not in (None, *FAILURE_KINDS):
            raise ValueError(f"failure kind must be one of {FAILURE_KINDS} or None, got {kind!r}")
        (self.process if kind == "process" else self.host).failure()
        if covered:
            self.covered += 1
        else:
            self.uncovered += 1

    @property
    def coverage(self) -> float:
        """The share of failures a just-in-time save covers (posterior mean)."""
        return self.covered / (self.covered + self.uncovered + self.prior_uncovered)

    @property
    def process_mtbf_s(self) -> float:
        """The job's mean time between process failures (seconds)."""
        return self.process.gpu_mtbf_s

    def host_mtbf_s(self, gpus: int) -> float:
        """The job's mean time between host failures: per-GPU MTBF ÷ its GPUs."""
        return self.host.gpu_mtbf_s / max(1, gpus)

    def fields(self, gpus: int) -> dict[str, float]:
        """The :class:`~adaptd.core.snapshot.JobState` fields these posteriors fill."""
        return {
            "process_mtbf_s": self.process_mtbf_s,
            "host_mtbf_s": self.host_mtbf_s(gpus),
            "jit_coverage": self.coverage,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": LEARNED_VERSION,
            "process": self.process.to_dict(),
            "host": self.host.to_dict(),
            "covered": self.covered,
            "uncovered": self.uncovered,
            "prior_uncovered": self.prior_uncovered,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FailureClasses:
        """Rebuild from :meth:`to_dict`; raises :class:`ValueError` on a foreign dict."""
        _check_version(data, "failure-class", "the priors")
        return cls(
            process=FailureRate.from_dict(data["process"]),
            host=FailureRate.from_dict(data["host"]),
            covered=float(data["covered"]),
            uncovered=float(data["uncovered"]),
            prior_uncovered=float(data["prior_uncovered"]),
        )
