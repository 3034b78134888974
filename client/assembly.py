"""The hook's parts, built once and handed to :class:`~adaptd.client.checkpointer.
AdaptiveCheckpointer`.

:class:`HookParts` is everything the hook runs: the checkpoint state, the writer's
priority, the socket to the daemon, the save schedule, whose plan the rank follows
(the authority), the saves and the daemon session, each given the others it needs when
it is built. :func:`parts` wires them from arguments the hook already checked.
"""

from __future__ import annotations

import os
import socket as _socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf

from adaptd.client import arguments
from adaptd.client.agreement import coordination, ranks
from adaptd.client.agreement.agreed import Coordinated, ViaDaemon
from adaptd.client.agreement.authority import Authority, Solo
from adaptd.client.agreement.daemon_rounds import DaemonRounds
from adaptd.client.agreement.rounds import Agreement
from adaptd.client.daemon.link import DaemonLink
from adaptd.client.daemon.session import DaemonSession
from adaptd.client.save import per_rank
from adaptd.client.save.rank_state import RankPart
from adaptd.client.save.saves import Saves
from adaptd.client.save.schedule import SaveSchedule
from adaptd.client.save.scratch import Scratch
from adaptd.client.save.state import CheckpointState
from adaptd.client.save.writer import Writer, WriterNice
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import DEFAULT_SPEC, Policy, parse
from adaptd.protocol import paths


@dataclass(frozen=True)
class HookParts:
    directory: Path
    rank: int
    world_size: int
    policy: Policy
    endpoint: str
    state: CheckpointState
    writer: Writer
    link: DaemonLink
    schedule: SaveSchedule
    authority: Authority
    saves: Saves
    session: DaemonSession
    part: RankPart | None  # this rank's own part of each save (a multi-worker rank)


def parts(
    *,
    directory: str | os.PathLike[str],
    job: str,
    max_to_keep: int | None,
    policy: str | Policy | None,
    socket: str | os.PathLike[str] | None,
    rank: int | None,
    world_size: int | None,
    daemon_timeout: float,
    poll_interval: float,
    report_interval: float,
    decide_interval: float,
    writer_nice: WriterNice,
    storage_options: Mapping[str, Any] | None,
    curve_server_key: str | os.PathLike[str] | None,
    curve_client_key: str | os.PathLike[str] | None,
    per_rank_keys: Any,
    trackables: Mapping[str, Any],
    manager: Callable[[], tf.train.CheckpointManager],
    options: Iterable[str],
    position: Callable[[], int],
    wake: Callable[[], None],
    pump: Callable[[float], None],
) -> HookParts:
    """The parts of one hook, from :class:`~adaptd.client.checkpointer.
    AdaptiveCheckpointer`'s arguments (checked here first); ``manager`` returns the
    hook's ``CheckpointManager``; ``options``: the hook's option names (for the
    did-you-mean of a misspelt one). For a job of several ranks: ``position`` returns
    the rank's newest completed step, ``wake`` makes its next step take the slow path
    (from any thread), ``pump(seconds)`` reads and handles the daemon's messages.

    A job of one rank follows its own plans (:class:`~adaptd.client.agreement.authority.Solo`);
    a job of several agrees in-band under ``tf.distribute`` (a coordination service
    runs in this process) and through the daemon otherwise
    (:mod:`adaptd.client.agreement.agreed`). Under ``tf.distribute`` the state is split
    (:mod:`adaptd.client.save.per_rank`): the replicated state, which a rank other than the
    chief writes to host-local scratch, and the rank's own part, which every rank
    writes into the job's directory (:mod:`adaptd.client.save.rank_state`).

    Raises:
        ValueError: an argument is invalid (the message names it and the value).
        PolicyError: ``policy`` does not parse.
    """
    arguments.check(
        directory=directory,
        job=job,
        max_to_keep=max_to_keep,
        seconds={
            "poll_interval": poll_interval,
            "report_interval": report_interval,
            "decide_interval": decide_interval,
        },
        writer_nice=writer_nice,
        storage_options=storage_options,
        trackables=trackables,
        options=options,
    )
    path = Path(directory)
    rank, world_size = ranks.resolve(rank, world_size)
    parsed = parse(policy if policy is not None else DEFAULT_SPEC)
    endpoint = paths.endpoint(socket)
    marked = per_rank.check_names(per_rank_keys, trackables)
    prepared = per_rank.prepared(trackables)  # a tf.distribute iterator made saveable
    coordinated = world_size > 1 and coordination.service_configured()
    part = None
    if coordinated:
        replicated, own = per_rank.split(prepared, marked)
        part = RankPart(own, rank=rank, world_size=world_size, directory=path, keep=max_to_keep)
        state = CheckpointState(replicated)
    else:
        state = CheckpointState(prepared)
    writer = Writer(state.checkpoint, writer_nice)
    path.mkdir(parents=True, exist_ok=True)
    link = DaemonLink(
        endpoint,
        timeout_s=daemon_timeout,
        curve_server_key=curve_server_key,
        curve_client_key=curve_client_key,
    )
    schedule = SaveSchedule()
    authority: Authority = Solo(schedule)
    scratch = None
    if coordinated:
        store = coordination.Coordination(rank, world_size)
        host = _socket.gethostname()
        agreement = Agreement(
            store, job=job, rank=rank, world_size=world_size, position=position, wake=wake,
            host=host,
        )  # fmt: skip
        authority = Coordinated(schedule, agreement, host=host)
        scratch = Scratch(job, rank) if rank else None
    elif world_size > 1:
        authority = ViaDaemon(schedule, DaemonRounds(job, rank), link, position=position, pump=pump)
    saves = Saves(state, manager, writer, path, job=job, rank=rank, scratch=scratch, part=part)
    session = DaemonSession(
        link,
        schedule,
        authority,
        job=job,
        rank=rank,
        world_size=world_size,
        directory=path,
        policy_spec=arguments.spec_of(policy),
        policy=parsed,
        # the spec as given (the package default's is "default"), or a policy object's
        # class name
        policy_label=policy
        if isinstance(policy, str)
        else (DEFAULT_SPEC if policy is None else type(parsed).__name__),
        # a policy object cannot be sent to the daemon, so it is run here and the
        # daemon's plans are ignored (its urgent SaveNow requests are still honoured)
        local_only=policy is not None and not isinstance(policy, str),
        report_s=float(report_interval),
        decide_s=float(decide_interval),
    )
    return HookParts(
        path, rank, world_size, parsed, endpoint, state, writer, link, schedule, authority,
        saves, session, part,
    )  # fmt: skip


def tracker(
    job: str, world_size: int, start: int, state_bytes: int, restore_s: float | None
) -> tuple[JobTracker, int]:
    """The embedded estimates of a run that starts at step ``start`` (after a restore
    that took ``restore_s``, None: fresh), and the GPUs this process sees."""
    gpus = len(tf.config.list_physical_devices("GPU"))
    tracker = JobTracker(
        job, world_size=world_size, gpus=max(1, gpus), start_step=start, state_bytes=state_bytes
    )
    if restore_s is not None:
        tracker.on_restart(restore_s)
    return tracker, gpus


__all__ = ["HookParts", "parts", "tracker"]
