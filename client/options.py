"""The hook's settings: one frozen, validated, documented object, :class:`HookOptions`.

Modelled on orbax's ``CheckpointManagerOptions``: every setting has a default, so the
quick start names none, and the settings travel as one value instead of as a score of
constructor arguments. :class:`~adaptd.client.checkpointer.AdaptiveCheckpointer` takes
them as keywords (its public API: ``max_to_keep=3``), as ``options=HookOptions(...)``,
or both (a keyword overrides the object's field); the Keras callback passes them on.

Each check raises ``ValueError`` naming the option and the value received, and says what
is accepted, so a typo fails at construction instead of during training. What depends
on the environment or on the state (``rank``/``world_size`` against ``RANK``/``TF_CONFIG``,
``restore_from`` against ``$ADAPTD_RESTORE_FROM``, ``per_rank`` against the trackables'
keywords, the CURVE keys of a ``tcp://`` socket) is checked where the hook is assembled
(:mod:`adaptd.client.assembly`), with the same kind of message.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from adaptd.client.checks import check_seconds
from adaptd.client.daemon.link import DAEMON_TIMEOUT_S
from adaptd.client.save.collective_timeout import COLLECTIVE_TIMEOUT_S
from adaptd.client.save.local_tier import MEMORY_SHARE, MemoryBudget
from adaptd.client.save.writer import AUTO, WriterNice, WriterPriority
from adaptd.core.policy import Policy, parse
from adaptd.core.stall import DEFAULT_CAP_S, DEFAULT_FLOOR_S, check_limits
from adaptd.protocol.job import REPORT_INTERVAL_S

__all__ = ["HookOptions"]


@dataclass(frozen=True)
class HookOptions:
    """How the hook saves, talks to its daemon and restores; every field has a default.

    Attributes:
        max_to_keep: checkpoints kept by the ``CheckpointManager`` (None: all).
        policy: a spec such as ``"fixed:steps=100"`` or a policy object; overrides the
            daemon's choice (sent in Hello) and drives the embedded fallback. Default:
            the daemon's choice, and :data:`adaptd.core.policy.DEFAULT_SPEC` embedded. A
            policy object cannot be sent to the daemon: it is run in-process and the
            daemon's plans are ignored (its urgent save-now requests are still honoured).
        socket: daemon endpoint or socket path (default
            :func:`adaptd.protocol.paths.endpoint`).
        curve_server_key, curve_client_key: for a ``tcp://`` socket, the daemon's public
            key file and this client's ``*.key_secret`` (default:
            ``$ADAPTD_CURVE_SERVER_KEY``/``$ADAPTD_CURVE_CLIENT_KEY``; see
            :class:`adaptd.client.daemon.link.DaemonLink`).
        rank, world_size: this process's place in the job (default: environment, see
            :mod:`adaptd.client.agreement.ranks`).
        daemon_timeout: seconds of silence after a send before the daemon counts as
            gone (also how long to wait for the first Welcome).
        handle_sigterm: on SIGTERM save at the next step, wait until durable, then let
            the signal take effect. Installed only from the main thread.
        poll_interval: wall seconds between socket polls in ``step()``.
        report_interval: wall seconds between step-time reports to the daemon.
        decide_interval: wall seconds between embedded re-decisions.
        writer_nice: priority of TensorFlow's async-save thread. ``"auto"`` (the
            default): nice 19 while the measured time until durable is at most a
            quarter of the planned interval and the host is not overloaded, the training
            thread's own priority once it exceeds half of it (see
            :mod:`adaptd.client.save.writer`); a
            :class:`~adaptd.client.save.writer.WriterPriority`: the same rule with other
            settings; an int 0-19: that nice value always; ``None`` or 0: left alone.
            Linux per-thread nice; elsewhere nothing changes.
        restore_from: a durable destination (fsspec URL or path: the job's folder there,
            ``{job}`` is replaced by the job id) to pull the newest verified checkpoint
            from when the directory has none, e.g. on a new host (default
            ``$ADAPTD_RESTORE_FROM``; see :mod:`adaptd.client.restore.remote`).
        storage_options: fsspec options for ``restore_from`` (e.g. ``endpoint_url``);
            kept as a read-only copy.
        save_on_close: ``close()`` (and leaving a ``with`` block without an exception)
            saves the current step when the run advanced since its last save, so even a
            run shorter than the first planned interval leaves a checkpoint (as the Keras
            callback saves at the end of ``fit``).
        per_rank: keywords of trackables that differ between the ranks of a multi-worker
            job, beside those that do by their kind (data iterators, generators made
            outside the strategy's scope): each rank saves and restores its own (see
            :mod:`adaptd.client.save.per_rank`).
        local_tier: a directory for the job's local tier (two tiers, docs/tiers.md):
            host memory when it is on a tmpfs (``"/dev/shm/adaptd/{job}"``), else a
            local disk; ``{job}`` and ``{rank}`` are replaced. The plan's saves go
            there, and every ``durable_every``-th (the plan's) to ``directory`` too;
            a restart on the same host restores the newest of either. Default
            ``$ADAPTD_LOCAL_TIER``, else the daemon's ``[jobs."ID"] local_tier`` (with
            that entry's ``local_tier_memory``/``local_tier_disk``), asked for when the
            hook is built (:mod:`adaptd.client.daemon.job_config`); else, or "": one
            tier, every save to ``directory``.
        local_tier_memory: the share (0-1] of the host's available memory a memory
            tier may hold (the copies kept and the one being written).
        local_tier_disk: the local-disk directory a full memory tier falls back to
            (``{job}``/``{rank}`` replaced; default: ``adaptd-local-<job>-rank<rank>``
            in ``$ADAPTD_SCRATCH`` or the system's temporary directory).
        just_in_time: in a multi-worker job, when a peer fails (TensorFlow's error for a
            lost peer or a timed-out collective reaches the hook's ``with`` block or
            :meth:`~adaptd.client.checkpointer.AdaptiveCheckpointer.save_on_peer_failure`),
            a survivor saves the last completed step before the process exits, where it
            can prove that step's state (:mod:`adaptd.client.save.just_in_time`,
            docs/multiworker.md). False: a peer failure saves nothing.
        step_counters: keywords of scalar integer variables among the state that each
            step moves (as ``optimizer.iterations``, which is found by itself): a
            just-in-time save puts them back to the last completed step's value.
        collective_timeout: seconds after which a collective of a multi-worker job with a
            silent peer fails, bounded by one watchdog thread of the hook (not TensorFlow's per-
            collective timeout, which holds a thread per collective for the whole timeout); ten
            times the typical step time if longer. When the ``MultiWorkerMirroredStrategy``'s
            ``CommunicationOptions`` has a timeout, the user's own is kept and there is no
            watchdog; None turns the bound off. It bounds what TensorFlow's heartbeat (about 10
            s) does not see, a peer whose process lives but does not take part; it must exceed
            the longest wait between two collectives of a healthy rank (see docs/multiworker.md,
            "Just-in-time saves").
        stall_floor, stall_cap: seconds; the shortest and the longest silence (no step
            completed by any rank) the daemon takes for a hang of this multi-worker job,
            whatever its step times say (None: the daemon's config, else 7 and 300;
            see docs/multiworker.md, "Hangs"). Sent with the rank's heartbeat; they win
            over the config's ``stall_floor_s``/``stall_cap_s``.

    Raises:
        ValueError: a field is invalid (the message names it and the value).
        PolicyError: ``policy`` is a spec that does not parse, or neither a spec nor a
            policy object.
    """

    max_to_keep: int | None = 5
    policy: str | Policy | None = None
    socket: str | os.PathLike[str] | None = None
    curve_server_key: str | os.PathLike[str] | None = None
    curve_client_key: str | os.PathLike[str] | None = None
    rank: int | None = None
    world_size: int | None = None
    daemon_timeout: float = DAEMON_TIMEOUT_S
    handle_sigterm: bool = True
    poll_interval: float = 0.025
    report_interval: float = REPORT_INTERVAL_S
    decide_interval: float = 5.0
    writer_nice: WriterNice = AUTO
    restore_from: str | None = None
    storage_options: Mapping[str, Any] | None = None
    save_on_close: bool = True
    per_rank: Collection[str] = ()
    local_tier: str | os.PathLike[str] | None = None
    local_tier_memory: float = MEMORY_SHARE
    local_tier_disk: str | os.PathLike[str] | None = None
    just_in_time: bool = True
    step_counters: Collection[str] = ()
    collective_timeout: float | None = COLLECTIVE_TIMEOUT_S
    stall_floor: float | None = None
    stall_cap: float | None = None

    def __post_init__(self) -> None:
        keep = self.max_to_keep
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"max_to_keep must be an integer >= 1 or None, got {keep!r}")
        for name in ("daemon_timeout", "poll_interval", "report_interval", "decide_interval"):
            check_seconds(name, getattr(self, name))
        if self.collective_timeout is not None:
            check_seconds("collective_timeout", self.collective_timeout)
        if self.stall_floor is not None or self.stall_cap is not None:
            floor = DEFAULT_FLOOR_S if self.stall_floor is None else self.stall_floor
            cap = self.stall_cap
            if cap is None:  # the default cap, or the floor where the floor is above it
                above = isinstance(floor, (int, float)) and floor > DEFAULT_CAP_S
                cap = floor if above else DEFAULT_CAP_S
            check_limits(floor, cap, names=("stall_floor", "stall_cap"))
        if not isinstance(self.just_in_time, bool):
            raise ValueError(f"just_in_time must be True or False, got {self.just_in_time!r}")
        _check_writer_nice(self.writer_nice)
        MemoryBudget(self.local_tier_memory)  # raises naming local_tier_memory
        for name in ("local_tier", "local_tier_disk"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(
                    f"{name} must be a directory path or None, got {type(value).__name__}"
                )
        storage = self.storage_options
        if storage is not None and not isinstance(storage, Mapping):
            raise ValueError(
                f"storage_options must be a mapping of fsspec options or None, "
                f"got {type(storage).__name__}"
            )
        if self.policy is not None:
            parse(self.policy)  # a spec that does not parse fails here, not at the start
        object.__setattr__(self, "storage_options", MappingProxyType(dict(storage or {})))
        if isinstance(self.per_rank, Collection) and not isinstance(self.per_rank, str):
            object.__setattr__(self, "per_rank", tuple(self.per_rank))  # else refused at assembly
        counters = self.step_counters
        if isinstance(counters, str) or not isinstance(counters, Collection):
            raise ValueError(
                f"step_counters must be a collection of the state's keywords, e.g. "
                f"step_counters=('steps',), got {counters!r}"
            )
        object.__setattr__(self, "step_counters", tuple(counters))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every option's name (the hook's keywords that are not state)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes: Any) -> HookOptions:
        """A copy with ``changes`` (checked like a new object)."""
        return dataclasses.replace(self, **changes)


def _check_writer_nice(value: Any) -> None:
    if value is None or value == AUTO or isinstance(value, WriterPriority):
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 19:
        raise ValueError(
            f"writer_nice must be 'auto', a WriterPriority, an integer from 0 to 19, or "
            f"None to leave the writer's priority alone, got {value!r}"
        )
