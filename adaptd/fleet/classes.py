"""Failure classes learned by the fleet: process failures per job, host failures fleet-wide.

A daemon learns its jobs' two failure classes (:class:`~adaptd.core.failure_rates.
FailureClasses`). With a fleet, :class:`FleetClasses` shares them:

- the *host* class is one posterior for the whole fleet: this host's trackers share one
  :class:`~adaptd.fleet.failures.PooledFailureRate` (failures per GPU-second, every job of
  the host feeding it), plus the other hosts' published totals;
- the *process* class stays per job (software faults do not scale with the GPU count):
  the job's own posterior plus what the other hosts published *for the same job name*
  (a job that moved keeps what it taught its old host);
- *moves*: a job that comes back on another host is a new job to that host's daemon,
  so the failure that moved it is not seen by either daemon's tracker. Each host
  publishes when each job's run started there (``seen``); a job whose rank 0 says hello
  here as a new job, restored from durable storage (a step > 0, not from its local tier,
  no local copy intact), and whose newest ``seen`` entry is another host's, not ended
  cleanly and newer than this host's own, counts one host failure here. The check waits
  for a fleet round after the hello; it is kept across a daemon restart, and this host's
  own entry (kept in the store and in etcd) stops a second count.

What a host publishes travels as a :class:`ClassTotals` dict under the key ``classes`` of
its :class:`~adaptd.fleet.failures.FailureRecord` (a daemon before this one ignores the
key; a record without it counts as nothing). Without etcd the posteriors are this
host's own, as they would be without a fleet.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptd import events as ev
from adaptd.core.failure_rates import (
    PRIOR_HOST_GPU_MTBF_S,
    PRIOR_PROCESS_MTBF_S,
    FailureClasses,
    FailureRate,
)
from adaptd.fleet.failures import FailureRecord, PooledFailureRate
from adaptd.logfmt import logfmt

__all__ = ["MAX_JOBS", "ClassTotals", "FleetClasses"]

log = logging.getLogger("adaptd.fleet")

#: Jobs kept per host (the newest): bounds the record's process and seen tables.
MAX_JOBS = 500


@dataclass(frozen=True)
class ClassTotals:
    """What one host publishes about failure classes: its host-class failures and
    GPU-seconds, per job its process failures and job-seconds, and per job the wall time
    its newest run started here and whether that run ended cleanly."""

    host_failures: float = 0.0
    host_gpu_seconds: float = 0.0
    process: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    seen: Mapping[str, tuple[float, bool]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": [self.host_failures, self.host_gpu_seconds],
            "process": {job: list(v) for job, v in self.process.items()},
            "seen": {job: [t, ended] for job, (t, ended) in self.seen.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClassTotals:
        """Raises :class:`ValueError` for a malformed dict (the caller skips it)."""
        try:
            host_failures, host_gpu_seconds = (float(x) for x in data["host"])
            process = {str(j): (float(f), float(s)) for j, (f, s) in data["process"].items()}
            seen = {str(j): (float(t), bool(e)) for j, (t, e) in data["seen"].items()}
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"failure classes unreadable: {exc!r}") from None
        counts = [host_failures, host_gpu_seconds, *(x for v in process.values() for x in v)]
        if any(not x >= 0 for x in counts):
            raise ValueError("failure classes: counts must be >= 0")
        return cls(host_failures, host_gpu_seconds, process, seen)


@dataclass(frozen=True)
class _Move:
    """A job new here, restored from durable storage: was it on another host before?"""

    at: float  # monotonic time of the hello (a fleet round after it decides)
    prev_seen: float | None  # this host's own entry before the hello


def _newest(records: Iterable[FailureRecord], exclude: str) -> dict[str, ClassTotals]:
    """Each other host's classes from its newest record that has them."""
    best: dict[str, tuple[float, ClassTotals]] = {}
    for r in records:
        if r.host == exclude or r.classes is None:
            continue
        if r.host in best and best[r.host][0] >= r.updated:
            continue
        try:
            best[r.host] = (r.updated, ClassTotals.from_dict(r.classes))
        except ValueError as exc:
            log.warning(logfmt("fleet_record_skipped", host=r.host, error=str(exc)))
    return {host: totals for host, (_, totals) in best.items()}


class FleetClasses:
    """This host's failure classes in the fleet (module docstring). Used from the
    daemon's loop only (not thread-safe)."""

    def __init__(self, host: str, clock: Callable[[], float]) -> None:
        self.host = host
        self.clock = clock
        #: every tracker's host class on this host: its failures and the fleet's
        self.host_rate = PooledFailureRate(prior_gpu_mtbf_s=PRIOR_HOST_GPU_MTBF_S)
        self._process: dict[str, PooledFailureRate] = {}
        self._seen: dict[str, tuple[float, bool]] = {}
        self._others: dict[str, ClassTotals] = {}
        self._pending: dict[str, _Move] = {}
        #: host failures counted here for jobs that came from another host
        self.moves = 0
        self._published: object = None
        self._unsaved = False  # a run started, or a move was seen or counted

    # ------------------------------------------------------------------ trackers

    def bind(self, job: str, classes: FailureClasses) -> FailureClasses:
        """``classes`` (a new tracker's, as the store restored them) sharing this host's
        host class and pooling the job's process class with the fleet's."""
        own: FailureRate = classes.process
        kept = self._process.get(job)
        if kept is not None and kept.gpu_seconds > own.gpu_seconds:
            own = kept  # a forgotten job's count, kept longer than its tracker
        rate = PooledFailureRate(
            prior_gpu_mtbf_s=own.prior_gpu_mtbf_s, prior_failures=own.prior_failures,
            failures=own.failures, gpu_seconds=own.gpu_seconds,
        )  # fmt: skip
        rate.others_failures, rate.others_gpu_seconds = self._others_process(job)
        self._keep(self._process, job, rate)
        return dataclasses.replace(classes, process=rate, host=self.host_rate)

    def _others_process(self, job: str) -> tuple[float, float]:
        got = [t.process[job] for t in self._others.values() if job in t.process]
        return sum(f for f, _ in got), sum(s for _, s in got)

    @staticmethod
    def _keep(table: dict[str, Any], job: str, value: Any) -> None:
        table.pop(job, None)
        table[job] = value
        while len(table) > MAX_JOBS:
            del table[next(iter(table))]

    # ------------------------------------------------------------------ in

    def on_event(self, event: object) -> None:
        """Rank 0's hello (not a reconnect) starts the job's run here, and may be a move
        (the first run of the job this daemon sees: one check per job, whichever rank
        said hello first); a clean end."""
        if isinstance(event, ev.JobRegistered) and event.rank == 0:
            if event.hello_kind == "reconnect":
                return
            prev = self._seen.get(event.job)
            if (
                event.incarnation == 1  # the job's first run this daemon sees
                and event.resumed_from > 0
                and event.local_tier
                and event.resumed_tier != "local"
                and not event.local_intact
            ):
                # a check not decided yet (a daemon restart meanwhile) keeps its own
                prev_seen = None if prev is None else prev[0]
                self._pending.setdefault(event.job, _Move(event.time, prev_seen))
            self._keep(self._seen, event.job, (event.wall, False))
            self._unsaved = True
        elif isinstance(event, ev.JobFinished) and event.job in self._seen:
            self._seen[event.job] = (self._seen[event.job][0], True)

    def refresh(self, records: Iterable[FailureRecord], read_at: float | None) -> None:
        """The other hosts' published classes (``records``, read from etcd at monotonic
        ``read_at``) into the posteriors; decide the moves whose hello came before."""
        self._others = _newest(records, self.host)
        others = self._others.values()
        self.host_rate.others_failures = sum(t.host_failures for t in others)
        self.host_rate.others_gpu_seconds = sum(t.host_gpu_seconds for t in others)
        for job, rate in self._process.items():
            rate.others_failures, rate.others_gpu_seconds = self._others_process(job)
        for job, move in list(self._pending.items()):
            if read_at is not None and read_at >= move.at:
                del self._pending[job]
                self._decide(job, move)

    def _decide(self, job: str, move: _Move) -> None:
        came = [(t.seen[job], host) for host, t in self._others.items() if job in t.seen]
        if not came:
            return
        (seen, ended), host = max(came)
        if ended or (move.prev_seen is not None and move.prev_seen >= seen):
            return
        self.host_rate.failure()
        self.moves += 1
        self._unsaved = True
        log.info(logfmt("host_failure_moved", job=job, from_host=host, to_host=self.host))

    # ------------------------------------------------------------------ out

    def totals(self) -> ClassTotals:
        """What this host publishes."""
        return ClassTotals(
            host_failures=self.host_rate.failures,
            host_gpu_seconds=self.host_rate.gpu_seconds,
            process={job: (r.failures, r.gpu_seconds) for job, r in self._process.items()},
            seen=dict(self._seen),
        )

    def unsaved(self) -> bool:
        """Whether a run started or a move was counted since the last call: the store
        is to keep it now (a daemon killed later must not count the move again)."""
        out, self._unsaved = self._unsaved, False
        return out

    def news(self) -> bool:
        """Whether a failure was counted or a run started since the last call: worth
        publishing now (another host's move check reads it), not at the next period."""
        mark = (
            self.host_rate.failures,
            sum(r.failures for r in self._process.values()),
            tuple(self._seen.items()),
        )
        new, self._published = mark != self._published, mark
        return new

    def status(self) -> dict[str, Any]:
        """The fleet status's ``classes`` section."""
        r = self.host_rate
        return {
            "host_failures": r.failures,
            "fleet_host_failures": r.failures + r.others_failures,
            "host_gpu_mtbf_s": r.gpu_mtbf_s,
            "moves": self.moves,
            "moves_pending": len(self._pending),
            "process": {
                job: {
                    "failures": p.failures,
                    "fleet_failures": p.failures + p.others_failures,
                    "mtbf_s": p.gpu_mtbf_s,
                }
                for job, p in self._process.items()
            },
        }

    def history(self) -> dict[str, Any]:
        """What to keep across a daemon restart (the store's), moves not yet decided too."""
        pending = {job: m.prev_seen for job, m in self._pending.items()}
        return {**self.totals().to_dict(), "pending": pending, "moves": self.moves}

    def load_history(self, data: Mapping[str, Any]) -> None:
        """Restore what :meth:`history` returned; raises :class:`ValueError` if malformed."""
        totals = ClassTotals.from_dict(data)
        self.host_rate.failures = totals.host_failures
        self.host_rate.gpu_seconds = totals.host_gpu_seconds
        for job, (failures, seconds) in totals.process.items():
            self._process[job] = PooledFailureRate(
                prior_gpu_mtbf_s=PRIOR_PROCESS_MTBF_S, failures=failures, gpu_seconds=seconds
            )
        self._seen = dict(totals.seen)
        now = self.clock()
        try:
            pending = {
                str(j): (None if t is None else float(t))
                for j, t in data.get("pending", {}).items()
            }
            self.moves = int(data.get("moves", 0))
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"pending moves unreadable: {exc!r}") from None
        self._pending = {job: _Move(now, prev) for job, prev in pending.items()}
