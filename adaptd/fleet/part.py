"""The fleet as one part of ``adaptd serve``: what :class:`adaptd.daemon.service.Service` calls.

:class:`FleetPart` owns the daemon's :class:`~adaptd.fleet.link.FleetLink` and is given
what it works with when it is built (nothing is wired to it afterwards):

- built before the registry, from the host's restored failure posterior: its pooled
  posterior (:attr:`FleetPart.failure_rate`, the fleet's totals on top of this host's)
  is the one every tracker shares; it restores the lifetimes this host saw before a
  restart (the store's ``fleet_history``);
- ``jobs``: the daemon's job table (read at each tick: each job's latest decision);
  ``on_grant``: the daemon's ``tick_soon`` (a grant is acted on at once);
- :meth:`collector` goes into the metrics registry; :meth:`start` starts the thread;
- :meth:`decorate` (the snapshot source), :meth:`tick` (a tick hook: slot wishes out),
  :meth:`decide_again` (the jobs just granted a slot: the daemon decides them again at
  once), :meth:`status`, :meth:`persist` and :meth:`close`;
- :attr:`peers` (:class:`RankPeers`): the stall watch's channel to the daemons of its
  jobs' other hosts (what is wrong with a rank, :mod:`adaptd.fleet.rank_facts`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from adaptd.core.estimators import FailureRate
from adaptd.core.snapshot import Snapshot
from adaptd.core.stall import RankFact
from adaptd.fleet.config import FleetConfig
from adaptd.fleet.link import FleetLink, job_facts
from adaptd.fleet.metrics import FleetCollector
from adaptd.logfmt import logfmt

log = logging.getLogger("adaptd.fleet")

#: Store key of the lifetimes and survivals this host saw in the fleet (docs/fleet.md).
FLEET_HISTORY_KEY = "fleet_history"


class RankPeers:
    """The stall watch's :class:`~adaptd.daemon.jobs.stall_watch.Peers` through the fleet's
    etcd: facts told are written by the agent's thread, facts of watched jobs read there
    every ``poll_s``; :meth:`facts` gives what was read within ``stale_after_s`` (an etcd
    that stopped answering is not read as "nothing wrong")."""

    channel = "the fleet's etcd"

    def __init__(self, link: FleetLink) -> None:
        self.link = link

    def tell(self, job: str, rank: int, state: str | None) -> None:
        self.link.agent.tell_rank(job, rank, state)

    def watch(self, jobs: frozenset[str]) -> None:
        self.link.agent.watch_ranks(jobs)

    def facts(self, job: str) -> Sequence[RankFact] | None:
        view = self.link.agent.view()
        link = self.link
        fresh = view.ranks_at is not None and view.usable(link.clock(), link.cfg.stale_after_s)
        return view.rank_facts.get(job) if fresh else None


class FleetPart:
    """The fleet's part of the service (see the module docstring)."""

    def __init__(
        self,
        cfg: FleetConfig,
        *,
        failure_rate: FailureRate,
        store: Any,
        jobs: Iterable[Any],
        clock: Callable[[], float],
        on_grant: Callable[[], None] | None = None,
    ) -> None:
        """``failure_rate``: this host's restored posterior (the pooled one is built on it);
        ``store``: the state database; ``jobs``: the daemon's job table."""
        from adaptd import __version__
        from adaptd.state.store import GLOBAL

        self.store = store
        self.jobs = jobs
        self.link = FleetLink(
            cfg, failure_rate=failure_rate, clock=clock, version=__version__, on_grant=on_grant
        )
        self.link.knowledge.load_history(store.param(GLOBAL, FLEET_HISTORY_KEY))
        self.peers = RankPeers(self.link)
        self._granted_now: list[str] = []
        log.info(
            logfmt(
                "fleet",
                endpoints=",".join(cfg.settings.endpoints),
                host=cfg.settings.host,
                prefix=cfg.settings.prefix,
            )
        )

    @property
    def failure_rate(self) -> FailureRate:
        """The trackers' shared posterior: this host's failures and the fleet's."""
        return self.link.failure_rate

    def collector(self) -> FleetCollector:
        """The fleet's series, for the metrics registry."""
        return FleetCollector(self.link)

    def start(self) -> None:
        """Start the fleet's thread."""
        self.link.start()

    # ------------------------------------------------------------------ the loop's

    def view_key(self) -> tuple[int, bool]:
        """What the service's snapshot cache must also key on: the fleet's newest view."""
        return id(self.link.agent.view()), self.link.usable() is not None

    def decorate(self, snapshot: Snapshot, limits: Mapping[str, int]) -> Snapshot:
        return self.link.decorate(snapshot, limits)

    def tick(self, now: float, snapshot: Snapshot) -> None:
        """Slot wishes out (from each job's latest decision); a job whose slot was just
        granted is to be decided again at once (:meth:`decide_again`), so its save
        starts at its next step."""
        before = self.link.granted()
        self.link.wishes(now, job_facts(self.jobs, snapshot, now))
        self._granted_now.extend(sorted(self.link.granted() - before))
        if self.link.knowledge.classes.unsaved():
            self.persist()

    def decide_again(self) -> list[str]:
        """The jobs granted a slot since the last call (the daemon decides them again)."""
        out, self._granted_now = self._granted_now, []
        return out

    def status(self) -> dict[str, Any]:
        return self.link.status()

    def persist(self) -> None:
        from adaptd.state.store import GLOBAL

        self.store.set_param(GLOBAL, FLEET_HISTORY_KEY, self.link.knowledge.history())

    def close(self) -> None:
        """Bounded: publishes, releases this host's claims, revokes its lease."""
        self.link.stop()
