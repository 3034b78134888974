"""What the daemon learned, kept across its restarts: the host's failure rate and each
job's save and restore costs.

:func:`restore_failure_rate` and :class:`Learned` restore both from the state database
when ``adaptd serve`` starts; :class:`Learned` gives each new job a tracker that starts
from what the store knew about it (and shares the host's one failure-rate posterior),
and queues what was learned back to
the store: a job's costs after each counted save, the failure rate after each
failure, and everything every :data:`adaptd.daemon.upkeep.PERSIST_EVERY_S` and at exit. A
record written by another adaptd version is discarded with a warning, never trusted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

from adaptd.core.estimators import FailureRate, JobTracker
from adaptd.core.failure_rates import FailureClasses
from adaptd.core.gpu_claims import vouched_gpus
from adaptd.logfmt import logfmt
from adaptd.protocol.job import Hello
from adaptd.state.store import GLOBAL, Store, job_scope

__all__ = ["FAILURE_RATE_KEY", "LEARNED_KEY", "Learned", "restore_failure_rate"]

log = logging.getLogger("adaptd.service")

#: Store keys of the learned parameters.
FAILURE_RATE_KEY = "failure_rate"
LEARNED_KEY = "learned"


def restore_failure_rate(store: Store, gpu_mtbf_s: float) -> FailureRate:
    """The host's failure-rate posterior as the store kept it, with the configured prior
    ``gpu_mtbf_s`` (what was observed carries over a restart, the prior is the config's:
    it may have changed); a fresh one when none was kept or it cannot be used."""
    fresh = FailureRate(prior_gpu_mtbf_s=gpu_mtbf_s)
    data = store.param(GLOBAL, FAILURE_RATE_KEY)
    if data is None:
        return fresh
    try:
        restored = dataclasses.replace(FailureRate.from_dict(data), prior_gpu_mtbf_s=gpu_mtbf_s)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning(logfmt("learned_discarded", what="failure_rate", error=str(exc)))
        return fresh
    log.info(logfmt("learned_restored", what="failure_rate", gpu_mtbf_s=restored.gpu_mtbf_s))
    return restored


class Learned:
    """The learned parameters of one daemon, restored from ``store`` and written back to it.

    ``failure_rate``: the posterior every job's tracker shares (the host's, restored by
    :func:`restore_failure_rate`, or the fleet's pooled one built on it).
    ``gpu_mtbf_s`` is the configured prior. ``host_gpus``: the host's GPU count now
    (None: unknown), see :meth:`tracker_for`.
    """

    def __init__(
        self,
        store: Store,
        *,
        failure_rate: FailureRate,
        gpu_mtbf_s: float,
        host_gpus: Callable[[], int | None] = lambda: None,
        bind_classes: Callable[[str, FailureClasses], FailureClasses] | None = None,
    ) -> None:
        self.store = store
        self.failure_rate = failure_rate
        self.gpu_mtbf_s = gpu_mtbf_s
        #: The host's GPU count now (None: unknown), which bounds what a job's claim
        #: counts in the shared posterior (:mod:`adaptd.core.gpu_claims`).
        self.host_gpus = host_gpus
        #: With a fleet: a job's failure classes sharing the fleet's
        #: (:meth:`adaptd.fleet.classes.FleetClasses.bind`); None: the job's own.
        self.bind_classes = bind_classes

    def tracker_for(self, msg: Hello) -> JobTracker:
        """A new job's tracker: the host's shared failure rate, the configured GPU
        MTBF prior, and what the store learned about this job before a restart. The
        posterior counts at most the GPUs the host can vouch for
        (:func:`~adaptd.core.gpu_claims.vouched_gpus`), whatever the job claims."""
        tracker = JobTracker(
            msg.job,
            world_size=msg.world_size,
            gpus=max(1, msg.gpus * msg.world_size),
            start_step=msg.resumed_from,
            state_bytes=msg.state_bytes or None,
            gpu_mtbf_s=self.gpu_mtbf_s,
            failure_rate=self.failure_rate,
            local_tier=bool(msg.local_tier),
            # two tiers: the job's failures are told apart (failure_kind), per job
            failure_classes=FailureClasses() if msg.local_tier else None,
        )
        spans_hosts = msg.agreement == "coordination"
        tracker.exposure_gpus = lambda: vouched_gpus(
            tracker.gpus, tracker.world_size, host_gpus=self.host_gpus(), spans_hosts=spans_hosts
        )
        data = self.store.param(job_scope(msg.job), LEARNED_KEY)
        if data is not None:
            try:
                tracker.load_learned(data)
            except (ValueError, TypeError) as exc:
                log.warning(logfmt("learned_discarded", job=msg.job, error=str(exc)))
            else:
                log.info(logfmt("learned_restored", job=msg.job, saves=tracker.saves,
                                save_cost_s=tracker.save_cost_s))  # fmt: skip
        if self.bind_classes is not None and tracker.failure_classes is not None:
            tracker.failure_classes = self.bind_classes(msg.job, tracker.failure_classes)
        return tracker

    def keep_job(self, job: str, learned: dict[str, Any] | None, *, failure: bool) -> None:
        """Queue one job's learned costs (and, after a failure, the host's failure rate)
        for the store's next flush."""
        if learned is not None:
            self.store.set_param(job_scope(job), LEARNED_KEY, learned)
        if failure:
            self.store.set_param(GLOBAL, FAILURE_RATE_KEY, self.failure_rate.to_dict())

    def keep_all(self, jobs: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Queue the failure-rate posterior and every job's learned costs."""
        self.store.set_param(GLOBAL, FAILURE_RATE_KEY, self.failure_rate.to_dict())
        for job, learned in jobs:
            self.store.set_param(job_scope(job), LEARNED_KEY, learned)
