"""The fleet as one part of ``adaptd serve``: what :class:`adaptd.daemon.service.Service` calls.

:class:`FleetPart` owns the daemon's :class:`~adaptd.fleet.link.FleetLink` and wires it
to the service's other parts through the seams they already have:

- built before the registry, it gives the trackers' shared failure posterior the
  fleet's totals (``learned.failure_rate`` becomes the link's pooled one) and restores
  the lifetimes this host saw before a restart (the store's ``fleet_history``);
- :meth:`start`: the daemon's loop runs its tick at once when a slot is granted
  (``Daemon.tick_soon``), the metrics registry gets its collector, the thread starts;
- :meth:`decorate` (the snapshot source), :meth:`tick` (a tick hook: slot wishes out,
  and a job just granted a slot decided again at once), :meth:`status`,
  :meth:`persist` and :meth:`close`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from adaptd.core.snapshot import Snapshot
from adaptd.daemon.logfmt import logfmt
from adaptd.fleet.config import FleetConfig
from adaptd.fleet.link import FleetLink, job_facts
from adaptd.fleet.metrics import FleetCollector

log = logging.getLogger("adaptd.fleet")

#: Store key of the lifetimes and survivals this host saw in the fleet (docs/fleet.md).
FLEET_HISTORY_KEY = "fleet_history"


class FleetPart:
    """The fleet's part of the service (see the module docstring)."""

    def __init__(
        self, cfg: FleetConfig, *, learned: Any, store: Any, clock: Callable[[], float]
    ) -> None:
        """``learned``: the service's :class:`~adaptd.state.learned.Learned` (its failure rate
        is replaced by the pooled one); ``store``: the state database."""
        from adaptd import __version__
        from adaptd.state.store import GLOBAL

        self.store = store
        self.link = FleetLink(
            cfg, failure_rate=learned.failure_rate, clock=clock, version=__version__
        )
        learned.failure_rate = self.link.failure_rate
        self.link.knowledge.load_history(store.param(GLOBAL, FLEET_HISTORY_KEY))
        self._registry: Any = None
        self._decide: Callable[[Any, float], Any] | None = None
        log.info(
            logfmt(
                "fleet",
                endpoints=",".join(cfg.settings.endpoints),
                host=cfg.settings.host,
                prefix=cfg.settings.prefix,
            )
        )

    @classmethod
    def build(
        cls, cfg: FleetConfig | None, learned: Any, store: Any, clock: Callable[[], float]
    ) -> FleetPart | None:
        """The part for ``[fleet]``, or ``None`` without one (nothing changes)."""
        return None if cfg is None else cls(cfg, learned=learned, store=store, clock=clock)

    def start(self, registry: Any, daemon: Any, metrics_registry: Any) -> None:
        """Wire to the built daemon (its registry's jobs, its planner, its tick, the
        metrics registry) and start the fleet's thread."""
        self._registry = registry
        self._decide = daemon.parts.planner.decide
        self.link.on_grant = daemon.tick_soon  # a grant is acted on at once
        metrics_registry.register(FleetCollector(self.link))
        self.link.start()

    # ------------------------------------------------------------------ the loop's

    def view_key(self) -> tuple[int, bool]:
        """What the service's snapshot cache must also key on: the fleet's newest view."""
        return id(self.link.agent.view()), self.link.usable() is not None

    def decorate(self, snapshot: Snapshot, limits: Mapping[str, int]) -> Snapshot:
        return self.link.decorate(snapshot, limits)

    def tick(self, now: float, snapshot: Snapshot) -> None:
        """Slot wishes out (from each job's latest decision); a job whose slot was just
        granted is decided again at once, so its save starts at its next step."""
        assert self._registry is not None and self._decide is not None
        before = self.link.granted()
        self.link.wishes(now, job_facts(self._registry, snapshot, now))
        for job_id in self.link.granted() - before:
            job = self._registry.jobs.get(job_id)
            if job is not None:
                self._decide(job, now)

    def status(self) -> dict[str, Any]:
        return self.link.status()

    def persist(self) -> None:
        from adaptd.state.store import GLOBAL

        self.store.set_param(GLOBAL, FLEET_HISTORY_KEY, self.link.knowledge.history())

    def close(self) -> None:
        """Bounded: publishes, releases this host's claims, revokes its lease."""
        self.link.stop()
