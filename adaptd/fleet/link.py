"""The daemon's side of the fleet: fleet facts into snapshots, job wishes out to etcd.

:class:`FleetLink` sits between the daemon (its loop, snapshots, events) and the
:class:`~adaptd.fleet.agent.FleetAgent` (etcd I/O, its own thread). Nothing here
blocks on etcd:

- :meth:`FleetLink.decorate` turns the agent's newest view into facts on the snapshot
  policies read: on each storage target the fleet shares, ``fleet_slots`` (the cap)
  and ``fleet_holding`` (this host's jobs holding a slot); on the snapshot,
  :class:`~adaptd.core.snapshot.FleetSample` (hosts up, the fitted Weibull shape). While
  etcd is away nothing is added: policies decide locally, as on a host without a
  fleet. A view that is up but stale (this process was stopped: its lease may have
  lapsed) holds every shared-target save until the agent's next round.
- :meth:`FleetLink.wishes` (the daemon's tick) asks the agent for a slot for each job
  whose latest decision waits for one (``fleet-wait``, set by ``io_aware``), and gives
  back wishes that no longer wait and grants no save used within ``grant_timeout_s``.
- :meth:`FleetLink.on_event` (a daemon event sink) releases a job's slot when its save
  is reported (durable or failed) or the job is gone, and notes the failures and
  lifetimes the fleet learns from.
- :meth:`FleetLink.upload_slot` is the replicator's gate: an upload to a destination
  several hosts share waits for a fleet slot (behind the jobs' own saves, which have
  more at risk), at most ``upload_wait_s``, and gives it back when it ends.
- :attr:`FleetLink.failure_rate` is the posterior the trackers use: this host's own
  observations (persisted as before) plus the other hosts' published totals for this
  host's GPU model, so a new job starts from what the fleet knows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from adaptd import events as ev
from adaptd.core.estimators import FailureRate
from adaptd.core.snapshot import FleetSample, Snapshot, StorageSample
from adaptd.fleet.agent import FleetAgent, FleetView
from adaptd.fleet.config import FleetConfig
from adaptd.fleet.failures import ShapeFit
from adaptd.fleet.knowledge import FleetKnowledge
from adaptd.fleet.targets import (
    declared_target,
    object_target,
    read_mounts,
    shared_target,
    target_of_mount,
)
from adaptd.logfmt import logfmt
from adaptd.telemetry.storage import Mount
from adaptd.tiers.urls import local_path

log = logging.getLogger("adaptd.fleet")


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the daemon knows of one job when it asks for slots (see :meth:`FleetLink.wishes`)."""

    job: str
    target: str | None  # the sampled storage target (StorageSample.target)
    tags: tuple[str, ...]  # of the job's latest decision
    gpus: int
    at_risk_gpu_s: float  # GPU-seconds since its last durable save
    age_s: float | None = None  # since its last failure or start (for survivals)


def job_facts(jobs: Iterable[Any], snapshot: Snapshot, now: float) -> list[JobFacts]:
    """:class:`JobFacts` of the daemon's active jobs (registry ``Job`` objects: ``id``,
    ``state``, ``latest`` decision, ``tracker``). Work at risk is the job's GPUs × the
    compute time of the steps since its last durable save (or since it resumed)."""
    out = []
    for j in jobs:
        if j.state != "active":
            continue
        t = j.tracker
        base = t.last_durable_step if t.last_durable_step is not None else t.start_step
        gpus = max(1, int(t.gpus))
        at_risk = max(0, t.step - base) * (t.step_time_s or 0.0) * gpus
        target = next((s.target for s in snapshot.storage if j.id in s.jobs), None)
        tags = tuple(j.latest.tags) if j.latest is not None else ()
        out.append(JobFacts(j.id, target, tags, gpus, at_risk, t.time_since_failure_s(now)))
    return out


@dataclass
class _Wish:
    target: str
    since: float
    granted_at: float | None = None
    writing: bool = False


class FleetLink:
    """One per daemon with a ``[fleet]``; see the module docstring."""

    def __init__(
        self,
        cfg: FleetConfig,
        *,
        failure_rate: FailureRate,
        agent: FleetAgent | None = None,
        mounts: Callable[[], list[Mount]] = read_mounts,
        resolve_paths: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        version: str = "",
        on_grant: Callable[[], None] | None = None,
    ) -> None:
        """``mounts`` reads the mount table; tests pass a recorded one and
        ``resolve_paths=False`` (its paths do not exist here). ``on_grant`` is called
        (from the agent's thread) when one of this host's jobs is granted a slot: the
        service gives the daemon's ``tick_soon``."""
        self.cfg = cfg
        self.on_grant = on_grant
        self.resolve_paths = resolve_paths
        self.host = cfg.settings.host
        self.agent = agent or FleetAgent(cfg.settings, clock=clock, wall=wall, version=version)
        self.agent.on_grant = self._granted
        self._mounts = mounts
        self.clock = clock
        self.wall = wall
        self.knowledge = FleetKnowledge(self.host, failure_rate, wall, clock)
        #: the trackers' shared posterior: this host's and the fleet's failures
        self.failure_rate = self.knowledge.failure_rate
        self._names: dict[str, str | None] = {}  # sampled target -> fleet-wide name
        self._caps: dict[str, int] = {}  # fleet-wide name -> cap
        self._wishes: dict[str, _Wish] = {}
        self._next_publish = 0.0
        self._was_usable: bool | None = None
        self.counts: Counter[str] = Counter()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FleetLink:
        self.agent.start()
        return self

    def stop(self) -> None:
        """Publish what was learned (bounded) and leave the fleet."""
        self._publish(force=True)
        self.agent.stop()

    def _granted(self) -> None:
        if self.on_grant is not None:
            self.on_grant()

    def granted(self) -> frozenset[str]:
        """This host's jobs holding a slot now (by the newest view)."""
        return self.agent.view().granted

    def usable(self, now: float | None = None) -> FleetView | None:
        """The agent's view if it can be decided on now, else ``None`` (decide locally)."""
        view = self.agent.view()
        ok = view.usable(self.clock() if now is None else now, self.cfg.stale_after_s)
        if ok != self._was_usable:
            self._was_usable = ok
            if not ok:
                log.warning(
                    logfmt(
                        "fleet_local",
                        host=self.host,
                        reason=view.reason or "view not refreshed",
                        hint="slots and fleet knowledge unused until etcd answers",
                    )
                )
        return view if ok else None

    # ------------------------------------------------------------------ facts in

    def shared_name(self, sample: StorageSample) -> str | None:
        """The fleet-wide name of a sampled target, or ``None`` when it is not shared."""
        if sample.target not in self._names:
            found = declared_target(sample.mountpoint, self.cfg.shared)
            if found is None:
                mount = next(
                    (m for m in reversed(self._mounts()) if m.mountpoint == sample.mountpoint),
                    None,
                )
                found = target_of_mount(mount) if mount is not None else None
            self._names[sample.target] = found.name if found else None
            if found is not None:
                log.info(
                    logfmt(
                        "fleet_shared_target",
                        mountpoint=sample.mountpoint,
                        name=found.name,
                        kind=found.kind,
                    )
                )
        return self._names[sample.target]

    def decorate(self, snapshot: Snapshot, caps: Mapping[str, int] | None = None) -> Snapshot:
        """``snapshot`` with the fleet's facts (module docstring); ``caps``: each sampled
        target's ``max_concurrent_saves`` (``[fleet] slots`` where it has none)."""
        self.knowledge.observe(snapshot)
        view = self.usable(snapshot.time if snapshot.time else None)
        if view is None:
            last = self.agent.view()
            if not last.up:
                return snapshot  # etcd away: decide locally
            # Up, but not refreshed: the agent had no failure, so this process was
            # stopped or starved since its last round, and its grants may have lapsed
            # with its lease. Saves to shared targets wait for the agent's next round
            # (fencing: a daemon resumed after SIGSTOP sent its job "save now" on a
            # grant of the lost lease, beside the new holder's write).
            view = dataclasses.replace(last, granted=frozenset())
        caps = caps or {}
        storage = []
        for st in snapshot.storage:
            name = self.shared_name(st)
            if name is None:
                storage.append(st)
                continue
            cap = caps.get(st.target, self.cfg.slots)
            self._caps[name] = cap
            holding = tuple(j for j in st.jobs if j in view.granted and self._target_of(j) == name)
            storage.append(dataclasses.replace(st, fleet_slots=cap, fleet_holding=holding))
        fit = self.shape(view)
        fleet = FleetSample(
            hosts=len(view.hosts),
            failure_shape=fit.shape if fit else None,
            failure_shape_high=fit.high if fit else None,
        )
        return dataclasses.replace(snapshot, storage=tuple(storage), fleet=fleet)

    def shape(self, view: FleetView | None = None) -> ShapeFit | None:
        """The Weibull shape fitted to the fleet's lifetimes (``None``: too few failures)."""
        return self.knowledge.shape(view or self.agent.view())

    # ------------------------------------------------------------------ wishes out

    def wishes(self, now: float, jobs: Iterable[JobFacts]) -> None:
        """The daemon's tick: ask for, keep or give back each job's slot."""
        view = self.agent.view()
        usable = self.usable(now) is not None
        seen = set()
        for f in jobs:
            seen.add(f.job)
            self.knowledge.running(f.job, f.age_s, f.gpus)
            wish = self._wishes.get(f.job)
            name = self._name_of_target(f.target)
            if wish is not None and wish.granted_at is None and f.job in view.granted:
                wish.granted_at = now
                self.counts["grants"] += 1
            if "fleet-wait" in f.tags and usable and name is not None:
                if wish is None or wish.target != name:
                    self._wishes[f.job] = _Wish(name, now)
                    self.agent.want(
                        f.job, name, cap=self._cap_of(name), at_risk_gpu_s=f.at_risk_gpu_s,
                        gpus=f.gpus,
                    )  # fmt: skip
                    self.counts["waits"] += 1
                continue
            if wish is None:
                continue
            if wish.granted_at is None:
                self._give_back(f.job, "no longer waiting")
            elif not wish.writing and now - wish.granted_at > self.cfg.grant_timeout_s:
                self._give_back(f.job, f"no save started within {self.cfg.grant_timeout_s:g}s")
        for job in [j for j in self._wishes if j not in seen]:
            self._give_back(job, "job gone")
        self.knowledge.refresh(view)
        self._publish()

    def _cap_of(self, name: str) -> int:
        return self._caps.get(name, self.cfg.slots)

    def _name_of_target(self, target: str | None) -> str | None:
        return None if target is None else self._names.get(target)

    def _target_of(self, job: str) -> str | None:
        wish = self._wishes.get(job)
        return wish.target if wish else None

    def _give_back(self, job: str, why: str) -> None:
        wish = self._wishes.pop(job, None)
        if wish is not None:
            self.agent.release(job)
            log.info(logfmt("fleet_slot_released", job=job, target=wish.target, reason=why))

    # ------------------------------------------------------------------ replicator

    def destination_name(self, url: str, storage_options: Mapping[str, Any]) -> str | None:
        """The fleet-wide name of a replication destination, or ``None`` (not shared)."""
        kwargs = storage_options.get("client_kwargs")
        endpoint = storage_options.get("endpoint_url") or (
            kwargs.get("endpoint_url") if isinstance(kwargs, Mapping) else None
        )
        found = object_target(url, endpoint if isinstance(endpoint, str) else None)
        if found is None:
            path = local_path(url)
            if path is None:
                return None
            found = shared_target(path, self._mounts(), self.cfg.shared, resolve=self.resolve_paths)
        return found.name if found else None

    @contextlib.contextmanager
    def upload_slot(self, dest: Any, job: str, stopping: Callable[[], bool]) -> Iterator[None]:
        """Hold a fleet slot on ``dest`` (a :class:`~adaptd.config.loader.Destination`) around one
        upload of ``job``; a replicator worker thread waits here. Without a usable fleet,
        or on a destination no other host shares, it does not wait."""
        name = self.destination_name(dest.job_url(job), dest.storage_options)
        if name is None or self.usable() is None:
            yield
            return
        key = f"upload:{dest.name}:{job}"
        self.agent.want(key, name, cap=self._cap_of(name), at_risk_gpu_s=0.0, gpus=1)
        deadline = self.clock() + self.cfg.upload_wait_s
        try:
            while not stopping():
                view = self.agent.view()
                if key in view.granted:
                    break
                if self.usable() is None:
                    log.info(logfmt("fleet_upload_local", destination=dest.name, job=job))
                    break
                if self.clock() > deadline:
                    log.warning(
                        logfmt(
                            "fleet_upload_unslotted",
                            destination=dest.name,
                            job=job,
                            waited_s=self.cfg.upload_wait_s,
                        )
                    )
                    break
                with contextlib.suppress(TimeoutError):
                    self.agent.wait_for(lambda v, seen=view: v is not seen, 1.0)
            yield
        finally:
            self.agent.release(key)

    # ------------------------------------------------------------------ events

    def on_event(self, event: ev.Event) -> None:
        """A daemon event sink (see the module docstring)."""
        if isinstance(event, ev.SaveInFlight):
            wish = self._wishes.get(event.job)
            if wish is not None and wish.granted_at is not None and event.writing:
                wish.writing = True
        elif isinstance(event, ev.SaveReported):
            wish = self._wishes.get(event.job)
            # granted, whether or not a tick has noticed it yet
            if wish is not None and (
                wish.granted_at is not None or event.job in self.agent.view().granted
            ):
                self._give_back(event.job, "save reported")
        elif isinstance(event, ev.JobLost | ev.JobFinished | ev.JobForgotten):
            self._give_back(event.job, "job gone")
        self.knowledge.on_event(event)

    # ------------------------------------------------------------------ knowledge out

    def _publish(self, *, force: bool = False) -> None:
        now = self.clock()
        if self.knowledge.classes.news() or force or now >= self._next_publish:
            self._next_publish = now + self.cfg.publish_every_s
            self.agent.publish(self.knowledge.record())

    # ------------------------------------------------------------------ status

    def status(self, now: float | None = None) -> dict[str, Any]:
        """The fleet section of ``adaptd status`` (JSON-able)."""
        view = self.agent.view()
        now = self.clock() if now is None else now
        fit = self.shape(view)
        return {
            "host": self.host,
            "up": self.usable(now) is not None,
            "reason": view.reason,
            "since_s": max(0.0, now - view.changed),
            "role": view.role,
            "hosts": list(view.hosts),
            "endpoints": list(self.cfg.settings.endpoints),
            "targets": {
                t: {
                    "cap": s.cap,
                    "holders": [f"{c.host}/{c.job}" for c in s.holders],
                    "waiters": [f"{c.host}/{c.job}" for c in s.waiters],
                }
                for t, s in view.targets.items()
            },
            # how old that view of the claims is: a host with nothing waiting near its
            # turn reads them less often in a large fleet (adaptd.fleet.agent.queue_every_s)
            "targets_age_s": None if view.targets_at is None else max(0.0, now - view.targets_at),
            "holding": sorted(view.granted),
            "waiting": sorted(view.waiting),
            "grants": view.grants,
            "errors": view.errors,
            "rejoins": view.rejoins,
            "gpu_model": self.knowledge.gpu_model,
            "gpu_mtbf_s": self.failure_rate.gpu_mtbf_s,
            "fleet_failures": self.failure_rate.failures + self.failure_rate.others_failures,
            "weibull_shape": None if fit is None else [fit.low, fit.shape, fit.high],
            "classes": self.knowledge.classes.status(),
        }
