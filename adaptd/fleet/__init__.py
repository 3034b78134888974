"""The fleet: daemons on many hosts share write slots and failure knowledge through etcd.

Without a ``[fleet]`` section no fleet part is built (no thread, no etcd client) and
each daemon decides alone.
With one, the daemon runs a :class:`FleetAgent` (all etcd I/O, in its own thread) and
reads its :class:`FleetView` as facts. Implementation, one concern per module:

- :mod:`adaptd.fleet.session`: the leased, bounded, authenticated etcd session;
- :mod:`adaptd.fleet.keys`: the key layout (each host writes only under its own prefixes);
- :mod:`adaptd.fleet.membership`: hosts up, this host's role;
- :mod:`adaptd.fleet.slots`: the fair, leased semaphore on shared storage targets;
- :mod:`adaptd.fleet.failures`: failure totals and the Weibull shape from the fleet;
- :mod:`adaptd.fleet.classes`: process failures per job, host failures fleet-wide;
- :mod:`adaptd.fleet.targets`: which storage targets are shared, by fleet-wide name;
- :mod:`adaptd.fleet.agent`: the thread that ties them together.

See docs/fleet.md for deployment and failure modes.
"""

from adaptd.fleet.agent import FleetAgent, FleetView
from adaptd.fleet.failures import FailureRecord, ShapeFit, fit_shape, fleet_rate
from adaptd.fleet.session import (
    FleetAuthError,
    FleetError,
    FleetSettings,
    FleetUnavailable,
    LeaseLost,
)
from adaptd.fleet.slots import TargetSlots
from adaptd.fleet.targets import SharedTarget, object_target, shared_target

__all__ = [
    "FailureRecord",
    "FleetAgent",
    "FleetAuthError",
    "FleetError",
    "FleetSettings",
    "FleetUnavailable",
    "FleetView",
    "LeaseLost",
    "ShapeFit",
    "SharedTarget",
    "TargetSlots",
    "fit_shape",
    "fleet_rate",
    "object_target",
    "shared_target",
]
