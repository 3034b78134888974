"""The hook's parts, built once and handed to :class:`~adaptd.client.checkpointer.
AdaptiveCheckpointer`.

:class:`HookParts` is everything the hook runs, by its role: what is saved (the
checkpoint state, the rank's own part), the save side (the schedule, the durable
target, the saves, the writer's priority: :class:`~adaptd.client.save.saver.Saver`),
whose plan the rank follows (the authority), the restore
(:class:`~adaptd.client.restore.resume.Restorer`) and the daemon link and session,
each given the others it needs when it is built. :func:`parts` wires them from the
hook's settings (:class:`~adaptd.client.options.HookOptions`) and state, checked
before; nothing is wired afterwards.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptd.client.agreement import coordination
from adaptd.client.agreement.agreed import Coordinated, ViaDaemon
from adaptd.client.agreement.authority import Authority, Solo
from adaptd.client.agreement.daemon_rounds import DaemonRounds
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import Agreement
from adaptd.client.daemon import job_config
from adaptd.client.daemon.link import DaemonLink
from adaptd.client.daemon.policy import PolicyChoice
from adaptd.client.daemon.session import DaemonSession
from adaptd.client.options import HookOptions
from adaptd.client.restore import remote
from adaptd.client.restore.job_restore import JobRestore
from adaptd.client.restore.resume import Agreed, Alone, Restorer
from adaptd.client.save import collective_timeout, just_in_time, per_rank
from adaptd.client.save.just_in_time import JustInTime
from adaptd.client.save.local_tier import LocalTier, MemoryBudget
from adaptd.client.save.rank_state import RankPart
from adaptd.client.save.saver import Saver
from adaptd.client.save.saves import Saves
from adaptd.client.save.schedule import SaveSchedule
from adaptd.client.save.scratch import Scratch, base_dir
from adaptd.client.save.state import CheckpointState
from adaptd.client.save.targets import Durable
from adaptd.client.save.writer import Writer
from adaptd.client.tensorflow_adapter import TensorFlowAdapter
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import Policy
from adaptd.protocol import paths
from adaptd.protocol.job import JobConfig

log = logging.getLogger("adaptd.client")


@dataclass(frozen=True)
class HookParts:
    directory: Path
    who: Identity
    policy: Policy
    endpoint: str
    source: remote.Source | None  # where an empty directory is filled from
    state: CheckpointState
    part: RankPart | None  # this rank's own part of each save (a multi-worker rank)
    jit: JustInTime | None  # the save after a peer's failure (a multi-worker rank)
    writer: Writer
    durable: Durable
    schedule: SaveSchedule
    saver: Saver
    authority: Authority
    restorer: Restorer
    link: DaemonLink
    session: DaemonSession
    collective_bound: float | None = None  # the collective watchdog's (a multi-worker rank)


def parts(
    directory: Path,
    job: str,
    options: HookOptions,
    trackables: Mapping[str, Any],
    *,
    position: Callable[[], int],
    wake: Callable[[], None],
) -> HookParts:
    """The parts of one hook: its checkpoint ``directory``, ``job`` id, settings and
    state (checked by :func:`adaptd.client.arguments.hook_arguments`). For a job of
    several ranks: ``position`` returns the rank's newest completed step, ``wake`` makes
    its next step take the slow path (from any thread).

    A job of one rank follows its own plans (:class:`~adaptd.client.agreement.authority.Solo`);
    a job of several agrees in-band under ``tf.distribute`` (a coordination service
    runs in this process) and through the daemon otherwise
    (:mod:`adaptd.client.agreement.agreed`); so does its restore
    (:class:`~adaptd.client.restore.resume.Agreed`, else
    :class:`~adaptd.client.restore.resume.Alone`). Under ``tf.distribute`` the state is
    split (:mod:`adaptd.client.save.per_rank`): the replicated state, which a rank other
    than the chief writes to host-local scratch, and the rank's own part, which every
    rank writes into the job's directory (:mod:`adaptd.client.save.rank_state`).

    Raises:
        ValueError: a setting that depends on the environment or the state is invalid
            (``rank``/``world_size``, ``restore_from``, ``per_rank``, the CURVE keys of a
            ``tcp://`` socket: the message names it and the value).
        PolicyError: ``policy`` does not parse.
    """
    who = Identity.here(job, options.rank, options.world_size)
    policy = PolicyChoice.of(options.policy)
    endpoint = paths.endpoint(options.socket)
    source = remote.Source.of(options.restore_from, job, options.storage_options)
    marked = per_rank.check_names(options.per_rank, trackables)
    prepared = per_rank.prepared(trackables)  # a tf.distribute iterator made saveable
    coordinated = who.world_size > 1 and coordination.service_configured()
    part = None
    jit = None
    bounded = None
    if coordinated:
        replicated, own = per_rank.split(prepared, marked)
        part = RankPart(own, rank=who.rank, world_size=who.world_size, directory=directory,
                        keep=options.max_to_keep)  # fmt: skip
        state = CheckpointState(replicated)
        moved = just_in_time.counters_of(trackables, options.step_counters)
        counters = just_in_time.Counters(moved)
        jit = JustInTime(state, part, counters, directory, enabled=options.just_in_time)
        bounded = collective_timeout.bound(collective_timeout.strategy_of(trackables),
                                           options.collective_timeout)  # fmt: skip
    else:
        state = CheckpointState(prepared)
    writer = Writer(state.checkpoint, options.writer_nice)
    directory.mkdir(parents=True, exist_ok=True)
    durable = Durable(state.checkpoint, directory, options.max_to_keep)
    link = DaemonLink(
        endpoint,
        timeout_s=options.daemon_timeout,
        curve_server_key=options.curve_server_key,
        curve_client_key=options.curve_client_key,
    )
    schedule = SaveSchedule()
    authority: Authority = Solo(schedule)
    ask = lambda: job_config.ask(link, job, who.rank)  # noqa: E731  (only when needed)
    local, local_part = local_tier(state, part, job, who.rank, options, configured=ask)
    restorer: Restorer = Alone(directory, source)
    scratch = None
    if coordinated:
        assert part is not None
        agreement = Agreement(coordination.Coordination(who.rank, who.world_size), who,
                              position=position, wake=wake)  # fmt: skip
        authority = Coordinated(schedule, agreement)
        job_restore = JobRestore(agreement.store, agreement.keys, who, directory, source,
                                 local=local.home if local is not None else None)  # fmt: skip
        restorer = Agreed(job_restore, part, local_part)
        scratch = None if who.chief else Scratch(job, who.rank)
    elif who.world_size > 1:
        # the rank holds at a step until its daemon decides a round: meanwhile the
        # session reads the daemon's messages (built below, before any step is taken)
        def pump(seconds: float) -> None:
            session.pump(seconds, position())

        authority = ViaDaemon(schedule, DaemonRounds(job, who.rank), link,
                              position=position, pump=pump)  # fmt: skip
    if local is not None and who.world_size == 1:  # ranks of a job restore one step
        restorer = Alone(directory, source, local.directories)
    saves = Saves(state, durable, writer, job=job, rank=who.rank, scratch=scratch, part=part,
                  local=local, local_part=local_part)  # fmt: skip
    session = DaemonSession(
        link, schedule, authority, who, directory, policy,
        report_s=float(options.report_interval), decide_s=float(options.decide_interval),
        memory_budget=local.budgeted if local is not None else None,
    )  # fmt: skip
    saver = Saver(schedule, saves, durable, session)
    return HookParts(
        directory, who, policy.policy, endpoint, source, state, part, jit, writer, durable,
        schedule, saver, authority, restorer, link, session, bounded,
    )  # fmt: skip


def local_tier(
    state: CheckpointState,
    part: RankPart | None,
    job: str,
    rank: int,
    options: HookOptions,
    *,
    configured: Callable[[], JobConfig | None] = lambda: None,
) -> tuple[LocalTier | None, RankPart | None]:
    """The job's local tier and this rank's own part of each local save (a multi-worker
    rank); None: one tier.

    The tier is ``options.local_tier``, else ``$ADAPTD_LOCAL_TIER``, else, when neither
    is set (``""`` in either says: one tier, whatever the daemon's config), what the
    daemon's config says (``configured()``: its ``[jobs."ID"]`` entry, with that
    entry's ``local_tier_memory`` and ``local_tier_disk`` where it sets them)."""
    chosen = options.local_tier if options.local_tier is not None else os.environ.get(LOCAL_ENV)
    memory, disk = options.local_tier_memory, options.local_tier_disk
    if chosen is None:
        given = configured()
        if given is not None and given.local_tier:
            chosen = given.local_tier
            if given.local_tier_memory is not None:
                memory = given.local_tier_memory
            disk = given.local_tier_disk or disk
            log.info("local tier %s from the daemon's config for job %s", chosen, job)
    if not chosen:
        return None, None
    home = _placed("local_tier", chosen, job, rank)
    fallback = (
        _placed("local_tier_disk", disk, job, rank)
        if disk
        else base_dir(None, os.environ) / f"adaptd-local-{job}-rank{rank}"
    )
    local = LocalTier(state.checkpoint, home, fallback=fallback,
                      budget=MemoryBudget(memory))  # fmt: skip
    local_part = None
    if part is not None:
        local_part = RankPart(part.trackables, rank=rank, world_size=part.world_size,
                              directory=local.directory, keep=local.keep)  # fmt: skip
    return local, local_part


def _placed(name: str, template: str | os.PathLike[str], job: str, rank: int) -> Path:
    """``template`` with ``{job}`` and ``{rank}`` replaced, as a directory path."""
    text = os.fspath(template)
    try:
        return Path(text.format(job=job, rank=rank)).expanduser()
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"{name} {text!r}: only {{job}} and {{rank}} can be replaced ({exc})"
        ) from None


def tracker(
    job: str,
    world_size: int,
    start: int,
    state_bytes: int,
    restore_s: float | None,
    *,
    local_tier: bool = False,
    restored_tier: str = "",
) -> tuple[JobTracker, int]:
    """The embedded estimates of a run that starts at step ``start`` (after a restore
    that took ``restore_s``, None: fresh; from ``restored_tier``, "local" or ""), and
    the GPUs this process sees; ``local_tier``: the job saves to a local tier."""
    gpus = TensorFlowAdapter().accelerators()
    tracker = JobTracker(
        job,
        world_size=world_size,
        gpus=max(1, gpus),
        start_step=start,
        state_bytes=state_bytes,
        local_tier=local_tier,
    )
    if restore_s is not None:
        tracker.on_restart(restore_s, "local" if restored_tier == "local" else "durable")
    return tracker, gpus


#: The environment variable naming the local tier's directory (``local_tier``).
LOCAL_ENV = "ADAPTD_LOCAL_TIER"

__all__ = ["LOCAL_ENV", "HookParts", "local_tier", "parts", "tracker"]
