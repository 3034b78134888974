"""This host's failure knowledge in the fleet: what it publishes, and the fleet's it uses.

:class:`FleetKnowledge` keeps, for the daemon's :class:`~adaptd.fleet.link.FleetLink`:

- the failure-rate posterior the trackers share, a
  :class:`~adaptd.fleet.failures.PooledFailureRate`: this
  host's own observations (persisted as before) plus the other hosts' published
  totals for this host's GPU model, so a new job starts from what the fleet knows;
- the lifetimes of this host's job incarnations, from the daemon's events: a job lost
  and then resumed from an older step (a failure) lived its age × GPUs GPU-seconds; a
  job that ended cleanly, or still runs, survived that long (censored);
- the :class:`~adaptd.fleet.failures.FailureRecord` it publishes and the Weibull shape
  fitted to everything the fleet published (refitted only when that changes);
- the failure classes (:class:`~adaptd.fleet.classes.FleetClasses`: process per job,
  host fleet-wide, jobs that moved hosts), published in the same record.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from adaptd import events as ev
from adaptd.core.estimators import FailureRate
from adaptd.core.snapshot import Snapshot
from adaptd.fleet.agent import FleetView
from adaptd.fleet.classes import FleetClasses
from adaptd.fleet.failures import (
    MAX_LIFETIMES,
    FailureRecord,
    PooledFailureRate,
    ShapeFit,
    fit_shape,
    fleet_totals,
    pooled,
)
from adaptd.logfmt import logfmt

log = logging.getLogger("adaptd.fleet")

UNKNOWN_MODEL = "unknown"


class FleetKnowledge:
    """See the module docstring. Used from the daemon's loop only (not thread-safe)."""

    def __init__(
        self,
        host: str,
        failure_rate: FailureRate,
        wall: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.wall = wall
        #: the failure classes this host shares (process per job, host fleet-wide)
        self.classes = FleetClasses(host, clock)
        self.failure_rate = PooledFailureRate(**dataclasses.asdict(failure_rate))
        self.gpu_model = UNKNOWN_MODEL
        self._lifetimes: list[float] = []
        self._survivals: list[float] = []
        self._lost_age: dict[str, float] = {}  # job -> lifetime (GPU-s) when it vanished
        self._running: dict[str, float] = {}  # job -> current lifetime (GPU-s)
        self._fit: tuple[int, ShapeFit | None] = (-1, None)

    # ------------------------------------------------------------------ in

    def observe(self, snapshot: Snapshot) -> None:
        """Learn this host's GPU model (the most common among its GPUs)."""
        names = Counter(g.name for g in snapshot.gpus if g.name)
        if names:
            self.gpu_model = names.most_common(1)[0][0]

    def running(self, job: str, age_s: float | None, gpus: int) -> None:
        """``job`` has run ``age_s`` since its last failure or start, on ``gpus`` GPUs."""
        if age_s is not None:
            self._running[job] = max(age_s, 1e-3) * max(1, gpus)

    def on_event(self, event: ev.Event) -> None:
        """Lifetimes from the daemon's events (see the module docstring)."""
        self.classes.on_event(event)
        if isinstance(event, ev.JobLost):
            life = self._running.pop(event.job, None)
            if life is not None:
                self._lost_age[event.job] = life
        elif isinstance(event, ev.JobResumed):
            life = self._lost_age.pop(event.job, None)
            if life is not None:  # it failed: resumed from an older step
                self._lifetimes.append(life)
        elif isinstance(event, ev.JobFinished | ev.JobForgotten):
            life = self._running.pop(event.job, None) or self._lost_age.pop(event.job, None)
            if life is not None:
                self._survivals.append(life)

    def refresh(self, view: FleetView) -> None:
        """Take the other hosts' published totals (same GPU model) into the posterior."""
        if view.last_ok is None:  # never replaced by "nothing" before etcd answered
            return
        failures, gpu_seconds = fleet_totals(
            view.records, gpu_model=self.gpu_model, exclude_host=self.host
        )
        self.failure_rate.others_failures = failures
        self.failure_rate.others_gpu_seconds = gpu_seconds
        self.classes.refresh(view.records, view.records_at)

    # ------------------------------------------------------------------ out

    def shape(self, view: FleetView) -> ShapeFit | None:
        """The Weibull shape fitted to the fleet's lifetimes and this host's."""
        records = [r for r in view.records if r.gpu_model == self.gpu_model and r.host != self.host]
        lifetimes, survivals = pooled(records)
        lifetimes += self._lifetimes
        survivals += self._survivals + list(self._running.values())
        key = hash((tuple(lifetimes), len(survivals)))
        if self._fit[0] != key:
            self._fit = (key, fit_shape(lifetimes, survivals))
        return self._fit[1]

    def record(self) -> FailureRecord:
        """What this host publishes about its GPU model."""
        return FailureRecord(
            host=self.host,
            gpu_model=self.gpu_model,
            gpu_seconds=self.failure_rate.gpu_seconds,
            failures=self.failure_rate.failures,
            lifetimes=tuple(self._lifetimes),
            survivals=tuple(self._survivals) + tuple(self._running.values()),
            updated=self.wall(),
            classes=self.classes.totals().to_dict(),
        )

    def history(self) -> dict[str, Any]:
        """The lifetimes to keep across a daemon restart (the store's)."""
        return {
            "lifetimes": self._lifetimes[-MAX_LIFETIMES:],
            "survivals": self._survivals[-MAX_LIFETIMES:],
            "classes": self.classes.history(),
        }

    def load_history(self, data: Mapping[str, Any] | None) -> None:
        """Restore what :meth:`history` returned."""
        if not data:
            return
        try:
            self._lifetimes = [float(t) for t in data.get("lifetimes", ()) if float(t) > 0]
            self._survivals = [float(t) for t in data.get("survivals", ()) if float(t) > 0]
            if "classes" in data:
                self.classes.load_history(data["classes"])
        except (TypeError, ValueError, AttributeError) as exc:
            log.warning(logfmt("learned_discarded", what="fleet_history", error=str(exc)))
