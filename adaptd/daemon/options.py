"""Every setting of one daemon, in one frozen, validated object.

:class:`DaemonOptions` is what :func:`adaptd.daemon.assembly.build` builds a daemon from
(beside the collaborators of :class:`adaptd.daemon.assembly.Seams`): ``adaptd serve``
makes it from its validated config (:func:`adaptd.daemon.service.daemon_options`), the
tests and the demo write it out. Every option has a default, so
``build(DaemonOptions(socket=path)).start()`` is a whole daemon, and every option is
checked when the object is made: a bad one raises
:class:`~adaptd.daemon.transport.DaemonError` naming the option (and the ``adaptd serve``
flag that sets it) and what is allowed, before anything is bound or started.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from adaptd.core import policy as policy_mod
from adaptd.core.snapshot import REPLAN_TOLERANCE
from adaptd.daemon.jobs.delivery import RESEND_AFTER_S
from adaptd.daemon.jobs.memory_tier import MEMORY_TIER_SHARE, check_share
from adaptd.daemon.jobs.planner import PlannerOptions
from adaptd.daemon.transport import CurveKeys, DaemonError
from adaptd.protocol.admin import JobSettings
from adaptd.protocol.job import LIVENESS_TIMEOUT_S
from adaptd.protocol.relay_auth import RelayKey

__all__ = ["TICK_INTERVAL_S", "DaemonOptions"]

#: Liveness checks and tick hooks run this often.
TICK_INTERVAL_S = 1.0


@dataclass(frozen=True, kw_only=True)
class DaemonOptions:
    """One daemon's settings (see the module docstring). Raises :class:`DaemonError`.

    - ``socket``: the job socket: an ipc path, ``ipc://PATH``, ``tcp://HOST:PORT``
      (``curve`` required), or ``None`` for ``$ADAPTD_SOCKET`` / the runtime directory
      (:mod:`adaptd.protocol.paths`); checked when the daemon is built (the path's
      length, TCP without CURVE), and bound when it opens.
    - ``default_policy``: the spec of jobs that name none (``--policy``,
      ``policy.default``; :attr:`adaptd.config.loader.Config.default_policy`).
    - ``liveness_timeout_s``: a rank silent this long is lost (``--silence-timeout``,
      ``daemon.liveness_timeout_s``); > 0.
    - ``resend_after_s``: a rank that reports after this long without hearing from the
      daemon gets its plan (or Welcome) again; > 0.
    - ``tick_interval_s``: liveness, rounds and the tick hooks run this often; > 0.
    - ``replan_tolerance``: a decision whose saves moved by at most this fraction of the
      interval keeps the current plan; in [0, 1).
    - ``job_settings``: operators' settings the daemon starts with, by job id (what the
      store kept, and the config's exact-id ``[jobs]`` entries).
    - ``hostname``: this host's name in ranks' records and relayed requests (default:
      the kernel's).
    - ``admin_group``: the group whose members may use operator commands
      (``daemon.admin_group``); looked up when the daemon is built.
    - ``curve``: CURVE keys for a ``tcp://`` socket (``daemon.curve_*``).
    - ``relay_key``: signs operator requests relayed to other hosts and checks those
      relayed here (``daemon.relay_key_file``).
    - ``memory_tier_share``: the share (0, 1] of the host's available memory the jobs'
      memory tiers may hold together (``daemon.memory_tier_share``,
      :mod:`adaptd.daemon.jobs.memory_tier`).
    """

    socket: str | os.PathLike[str] | None = None
    default_policy: str = policy_mod.DEFAULT_SPEC
    liveness_timeout_s: float = LIVENESS_TIMEOUT_S
    resend_after_s: float = RESEND_AFTER_S
    tick_interval_s: float = TICK_INTERVAL_S
    replan_tolerance: float = REPLAN_TOLERANCE
    job_settings: Mapping[str, JobSettings] = field(default_factory=dict)
    hostname: str | None = None
    admin_group: str | None = None
    curve: CurveKeys | None = None
    relay_key: RelayKey | None = None
    memory_tier_share: float = MEMORY_TIER_SHARE
    #: The planner's part of these options (``replan_tolerance``), made and checked once.
    planner: PlannerOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            policy_mod.parse(self.default_policy)
        except policy_mod.PolicyError as exc:
            raise DaemonError(f"policy (--policy) {self.default_policy!r}: {exc}") from None
        for name, flag in (
            ("liveness_timeout_s", " (--silence-timeout)"),
            ("resend_after_s", ""),
            ("tick_interval_s", ""),
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise DaemonError(f"{name}{flag} must be > 0 seconds, got {value!r}")
        try:
            check_share(self.memory_tier_share)
        except ValueError as exc:
            raise DaemonError(str(exc)) from None
        try:
            planner = PlannerOptions(replan_tolerance=self.replan_tolerance)
        except ValueError as exc:
            raise DaemonError(str(exc)) from None
        object.__setattr__(self, "planner", planner)
        object.__setattr__(self, "job_settings", MappingProxyType(dict(self.job_settings)))
