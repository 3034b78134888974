"""What the daemon's loop runs, as :func:`adaptd.daemon.assembly.build` wires it.

:class:`DaemonParts` holds the parts :class:`adaptd.daemon.server.Daemon` itself uses,
by name, and the two front doors (the job socket's
:class:`~adaptd.daemon.jobs.handler.JobHandler`, the admin socket's
:class:`~adaptd.daemon.admin.handler.AdminHandler`), each of which was given the parts
it uses by name when it was built: nothing hands every part every other part. Frozen:
a part never gets a collaborator after it is built.
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
from adaptd.daemon.jobs.planner import Planner
from adaptd.daemon.jobs.policy_choice import PolicyChoice
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import Transport

__all__ = ["DaemonParts", "FrameHandler", "TickHook"]

#: Called about once a second in the daemon's loop with the monotonic time; must not block.
TickHook = Callable[[float], None]


class FrameHandler(Protocol):
    """A socket's handler: one message (its frames, the peer's identity first) at a time."""

    def on_frames(self, parts: list[zmq.Frame]) -> None: ...


@dataclass(frozen=True)
class DaemonParts:
    """Everything :class:`adaptd.daemon.server.Daemon` runs: the two handlers, the
    hooks its loop calls every ``tick_interval_s``, and the parts the loop itself uses.

    - ``transport``: the sockets; ``events``: the bus to the sinks; ``stats``: the
      daemon's counters; ``clock``: the loop's monotonic clock.
    - ``registry``: jobs and ranks; ``settings``: the operators' per-job settings;
      ``choice``: each job's policy; ``planner``: decisions; ``delivery``: what ranks
      are told, and the rounds; ``drains``: saves someone waits for; ``status``: what
      ``adaptd status`` shows.
    """

    transport: Transport
    events: ev.EventBus
    stats: DaemonStats
    clock: Callable[[], float]
    registry: Registry
    settings: OperatorSettings
    choice: PolicyChoice
    planner: Planner
    delivery: Delivery
    drains: Drains
    status: StatusView
    jobs: FrameHandler
    admin: FrameHandler
    tick_hooks: tuple[TickHook, ...]
    tick_interval_s: float
    #: job ids to decide again at once, read after each tick's hooks (None: none ever)
    decide_again: Callable[[], Iterable[str]] | None = None
