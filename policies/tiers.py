"""``tiers``: a cheap local save every τ and a durable copy of every k-th, chosen together
(issue 24), for the failures no just-in-time save covers (issue 23).

The schedule is :func:`adaptd.core.multilevel.plan`'s, from the job's figures: δ₂, L₂, R₂
(``save_cost_s``, ``save_latency_s``, ``restore_s``: the durable tier), δ₁, L₁, R₁
(``local_*``: the local tier, when the job has one), the job's process and host MTBFs
(``process_mtbf_s``, ``host_mtbf_s``; unknown: every failure is taken for a lost host,
M = ``mtbf_s``, as one tier assumes) and the share of failures a just-in-time save
covers (``jit_coverage``, at most ``max_coverage``: a just-in-time save can fail too).
Without a local tier and without coverage it is exactly ``daly``'s answer.

Until a figure is measured: before any durable save, the ``daly`` probe (to both tiers,
so both costs are learned); a local tier whose save was never measured gets every save
to both tiers (``durable_every`` 1) on Daly's interval; a restart in place never seen
is taken to last as long as one from durable storage (no gain assumed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from adaptd.core import multilevel
from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies.daly import probe
from adaptd.policies.interval import plan

__all__ = [
    "MAX_COVERAGE",
    "Tiers",
    "failure_rates",
]

#: The largest share of failures planned as covered just in time: a just-in-time save
#: can fail too (two ranks lost at once, a failure mid-update), so some periodic
#: protection always stays.
MAX_COVERAGE = 0.95


@dataclass(frozen=True)
class Tiers:
    """Choose the local interval and the durable cadence (see the module doc).

    ``probe_s``: as ``daly``'s. ``max_durable_every``: the most local saves per durable
    one. ``max_coverage``: the largest share of failures taken as covered just in time.
    """

    probe_s: float = 300.0
    max_durable_every: int = multilevel.MAX_DURABLE_EVERY
    max_coverage: float = MAX_COVERAGE

    def __post_init__(self) -> None:
        if not self.probe_s > 0:
            raise PolicyError(f"tiers: probe_s must be > 0 seconds, got {self.probe_s}")
        if self.max_durable_every < 1:
            raise PolicyError(
                f"tiers: max_durable_every must be >= 1, got {self.max_durable_every}"
            )
        if not 0 <= self.max_coverage < 1:
            raise PolicyError(
                f"tiers: max_coverage must be a share in [0, 1), got {self.max_coverage}"
            )

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        rates = failure_rates(job, self.max_coverage)
        if job.save_cost_s is None or rates is None:
            d = probe(job, self.probe_s, "tiers")
            return dataclasses.replace(d, durable_every=1) if job.local_tier else d
        durable = multilevel.Tier(
            max(job.save_cost_s, 0.0), job.save_latency_s or 0.0, job.restore_s or 0.0
        )
        local = None
        if job.local_tier and job.local_save_cost_s is not None:
            local = multilevel.Tier(
                max(job.local_save_cost_s, 0.0),
                job.local_latency_s or 0.0,
                job.local_restore_s if job.local_restore_s is not None else durable.restart_s,
            )
        chosen = multilevel.plan(durable, rates, local, max_every=self.max_durable_every)
        reason = chosen.reason
        every = chosen.durable_every
        if job.local_tier and local is None:
            every = 1  # so that the local save gets measured
            reason += "; no local save measured yet: saving to both tiers"
        d = plan(job, chosen.interval_s, policy="tiers", reason=reason, waste=chosen.waste)
        return dataclasses.replace(d, durable_every=every) if d.next_step is not None else d


def failure_rates(job: JobState, max_coverage: float = MAX_COVERAGE) -> multilevel.Rates | None:
    """The job's uncovered failure rates by class, and the covered ones with what each
    costs (half a step, the just-in-time save, the restart); ``None`` while no MTBF is
    known. Coverage is capped at ``max_coverage`` (< 1)."""
    host = job.host_mtbf_s if job.host_mtbf_s is not None else job.mtbf_s
    if host is None or not host > 0:
        return None
    process = job.process_mtbf_s if job.host_mtbf_s is not None else None
    if process is not None and not process > 0:
        process = None
    coverage = min(max(job.jit_coverage, 0.0), max_coverage)
    restart = job.restore_s or 0.0
    if process is not None:
        local = job.local_restore_s if job.local_tier and job.local_restore_s is not None else None
        in_place = restart if local is None else local
        restart = (in_place / process + restart / host) / (1.0 / process + 1.0 / host)
    cost = (job.step_time_s or 0.0) / 2.0 + (job.jit_save_s or 0.0) + restart
    return multilevel.Rates.of(process, host, coverage, cost if coverage > 0 else 0.0)
