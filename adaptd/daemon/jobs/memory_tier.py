"""The daemon's budget for its jobs' memory tiers (docs/tiers.md, "Memory is bounded").

Each job whose hello says its local tier is in host memory (``local_tier == "memory"``)
holds its copies in the same RAM as every other job on the host, so the daemon splits
``daemon.memory_tier_share`` of the host's available memory (the telemetry snapshot's
``mem_available_bytes``, psutil's) evenly between the active ones
(:func:`budgets`), and tells each its share in bytes on the plan
(:attr:`~adaptd.protocol.job.Plan.memory_budget`). The hook keeps the smaller of its
own bound and this budget (:class:`adaptd.client.save.local_tier.LocalTier`).

:class:`MemoryTiers` is a tick hook: it recomputes the budgets from the newest
snapshot and sends the plan again to a job whose budget moved by more than
:data:`RESEND_CHANGE` (a job joining or leaving halves or doubles the others'). A job
whose plan is agreed in rounds or decided on another host is not sent one (its ranks
keep their own bound).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from adaptd.config.schema import MEMORY_TIER_SHARE  # the setting's default, defined with it
from adaptd.core.snapshot import Snapshot
from adaptd.daemon.jobs.delivery import Delivery, plan_message
from adaptd.daemon.jobs.table import Job

__all__ = ["MEMORY_TIER_SHARE", "RESEND_CHANGE", "MemoryTiers", "budgets", "check_share"]

#: A budget that moved by more than this fraction is sent again.
RESEND_CHANGE = 0.05


def check_share(share: object) -> float:
    """``share`` as a float in (0, 1]; raises :class:`ValueError` naming the setting."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(
            f"daemon.memory_tier_share must be a share of the available memory in (0, 1], "
            f"got {share!r}"
        )
    return float(share)


def budgets(available: int, share: float, jobs: Iterable[str]) -> dict[str, int]:
    """Each of ``jobs`` (ids of the active jobs with a memory tier) gets an equal part
    of ``share`` of ``available`` bytes."""
    ids = sorted(set(jobs))
    if not ids:
        return {}
    each = int(share * max(0, available)) // len(ids)
    return dict.fromkeys(ids, each)


class MemoryTiers:
    """The tick hook that budgets the memory tiers (see the module docstring).

    Args:
        jobs: the daemon's jobs (read; each one's ``memory_budget`` is set).
        snapshot: the newest host snapshot.
        delivery: sends a job's plan again when its budget changed.
        share: ``daemon.memory_tier_share``, as :class:`~adaptd.daemon.options.DaemonOptions`
            checked it (:func:`check_share`, once, where the setting enters).
    """

    def __init__(
        self,
        *,
        jobs: Iterable[Job],
        snapshot: Callable[[], Snapshot],
        delivery: Delivery,
        share: float = MEMORY_TIER_SHARE,
    ) -> None:
        self.jobs = jobs
        self.snapshot = snapshot
        self.delivery = delivery
        self.share = share

    def tick(self, now: float) -> None:
        host = self.snapshot().host
        if host is None or host.mem_available_bytes is None:
            return  # not sampled yet: the hooks keep their own bound
        tiers = [j for j in self.jobs if j.state == "active" and j.local_tier == "memory"]
        given = budgets(host.mem_available_bytes, self.share, (j.id for j in tiers))
        for job in tiers:
            if not job.budget_memory(given[job.id], RESEND_CHANGE):
                continue
            if job.decides and not job.runs_rounds and job.plan is not None:
                msg = plan_message(job)
                for rank in job.live_ranks():
                    self.delivery.send(rank, msg, now)
