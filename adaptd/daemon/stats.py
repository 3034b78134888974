"""What the daemon counts about itself, for ``adaptd status`` and the tests.

One :class:`DaemonStats` is shared by the daemon's parts (the transport counts what
it sent and dropped, the job handler the messages by kind and the refusals by
code, the planner the plans and policy faults...), so ``status`` shows one set of
counters however the work is divided.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["DaemonStats"]


@dataclass
class DaemonStats:
    """The daemon's counters.

    ``counters``: ``messages``, ``sent``, ``send_dropped``, ``plans_sent``,
    ``policy_errors``, ``snapshot_errors``, ``internal_errors``, ``tick_errors``,
    ``admin_requests``, ``status_extra_errors``. ``by_kind``: job messages by wire
    name (``hello``, ``steps``...). ``rejected``: refused messages by error code.
    """

    counters: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
