"""The daemon's parts, as :func:`adaptd.daemon.assembly.build` wires them.

:class:`Core` is what the two front doors (the job socket's
:class:`~adaptd.daemon.jobs.handler.JobHandler`, the admin socket's
:class:`~adaptd.daemon.admin.handler.AdminHandler`) work through, each part built with
the others it needs; :class:`DaemonParts` adds the handlers and what the loop runs
each tick. Both are frozen: a part never gets a collaborator after it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import zmq

from adaptd import events as ev
from adaptd.daemon.admin.drains import Drains
from adaptd.daemon.admin.status import StatusView
from adaptd.daemon.jobs.delivery import Delivery
from adaptd.daemon.jobs.ops import JobOps
from adaptd.daemon.jobs.planner import Planner
from adaptd.daemon.jobs.policy_choice import PolicyChoice
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.refusals import Refusals
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import Transport

__all__ = ["Core", "DaemonParts", "FrameHandler", "TickHook"]

#: Called about once a second in the daemon's loop with the monotonic time; must not block.
TickHook = Callable[[float], None]


class FrameHandler(Protocol):
    """A socket's handler: one message (its frames, the peer's identity first) at a time."""

    def on_frames(self, parts: list[zmq.Frame]) -> None: ...


@dataclass(frozen=True)
class Core:
    """The parts every message is handled through.

    - ``transport``: the sockets; ``events``: the bus to the sinks; ``stats``: the
      daemon's counters; ``refusals``: refused messages counted and logged;
      ``clock``: the loop's monotonic clock.
    - ``registry``: jobs and ranks (its ``table`` is what the readers read);
      ``settings``: the operators' per-job settings; ``choice``: each job's policy;
      ``planner``: decisions; ``delivery``: what ranks are told, and the rounds;
      ``ops``: operator actions on a job, here or relayed; ``drains``: saves someone
      waits for; ``status``: what ``adaptd status`` shows.
    """

    transport: Transport
    events: ev.EventBus
    stats: DaemonStats
    refusals: Refusals
    clock: Callable[[], float]
    registry: Registry
    settings: OperatorSettings
    choice: PolicyChoice
    planner: Planner
    delivery: Delivery
    ops: JobOps
    drains: Drains
    status: StatusView


@dataclass(frozen=True)
class DaemonParts:
    """Everything :class:`adaptd.daemon.server.Daemon` runs: the core, the two handlers,
    and the hooks its loop calls every ``tick_interval_s``."""

    core: Core
    jobs: FrameHandler
    admin: FrameHandler
    tick_hooks: tuple[TickHook, ...]
    tick_interval_s: float
    #: job ids to decide again at once, read after each tick's hooks (None: none ever)
    decide_again: Callable[[], Iterable[str]] | None = None
