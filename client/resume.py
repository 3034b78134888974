"""Which step a run continues from, and loading it: one rank alone, or the whole job.

:func:`restore_alone` is a single rank's resume: pull the newest verified checkpoint
from ``restore_from`` into an empty directory, then restore the newest intact one
(:mod:`adaptd.client.intact`). :func:`restore_agreed` is a rank of a multi-worker job:
the ranks agree on one step (:class:`~adaptd.client.job_restore.JobRestore`), a rank
lacking it pulls it, every rank loads exactly that step and all wait for all, so no
rank resumes alone from another step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from adaptd.client import files, intact, remote
from adaptd.client.agreed import Coordinated
from adaptd.client.authority import Authority
from adaptd.client.job_restore import JobRestore, RestoreAgreementError
from adaptd.client.state import CheckpointState

log = logging.getLogger("adaptd.client")


@dataclass(frozen=True)
class Resumed:
    """What a restore did: the step to continue from (0: fresh), how long it took
    (None: nothing restored), the checkpoints skipped, and the pull from
    ``restore_from`` (None: none was tried)."""

    start: int
    restore_s: float | None
    resume: intact.Resume
    pulled: remote.Pull | None = None


def restore(
    authority: Authority,
    directory: Path,
    state: CheckpointState,
    *,
    restore_from: str | None,
    storage_options: Mapping[str, Any],
) -> Resumed:
    """The rank's restore: agreed with the other ranks when they agree in-band
    (:class:`~adaptd.client.agreed.Coordinated`), else :func:`restore_alone`."""
    if isinstance(authority, Coordinated):
        agreement = authority.agreement
        job_restore = JobRestore(
            agreement.store,
            agreement.keys,
            job=agreement.job,
            rank=agreement.rank,
            world_size=agreement.world_size,
            directory=directory,
            restore_from=restore_from,
            storage_options=storage_options,
            host=authority.host,
        )
        return restore_agreed(job_restore, state, tidy=agreement.rank == 0)
    return restore_alone(
        directory, state, restore_from=restore_from, storage_options=storage_options
    )


def restore_alone(
    directory: Path,
    state: CheckpointState,
    *,
    restore_from: str | None,
    storage_options: Mapping[str, Any],
) -> Resumed:
    """Restore the newest intact checkpoint of ``directory`` (pulled first from
    ``restore_from`` when the directory has none). Raises
    :class:`~adaptd.client.intact.NoIntactCheckpoint` when every one is damaged."""
    files.remove_orphans(directory)
    t0 = perf_counter()
    pulled = None
    if restore_from is not None:
        pulled = remote.pull_if_empty(directory, restore_from, storage_options=storage_options)
    resume = intact.restore_newest_intact(directory, state.restore)
    intact.set_aside(directory, resume)
    if not resume.restored:
        return Resumed(0, None, resume, pulled)
    start = state.restored_step(resume.restored)
    restore_s = perf_counter() - t0
    log.info("restored %s: continuing from step %d (%.3fs)", resume.restored, start, restore_s)
    return Resumed(start, restore_s, resume, pulled)


def restore_agreed(job_restore: JobRestore, state: CheckpointState, *, tidy: bool) -> Resumed:
    """Agree with the other ranks on one step, pull it if this rank lacks it, load it,
    and wait until every rank did. ``tidy``: remove leftovers of interrupted writes
    first (the rank that writes the directory; the others must not touch it).

    Raises:
        RestoreAgreementError: the ranks cannot restore one step, or one of them
            failed (the same error on every rank).
        CoordinationError: the job's coordination service stopped answering.
    """
    directory = job_restore.directory
    if tidy:
        files.remove_orphans(directory)
    t0 = perf_counter()
    choice = job_restore.agree()
    if choice.step is None:
        job_restore.confirm(0)
        return Resumed(0, None, intact.Resume(None))
    prefix = os.path.join(str(directory), f"ckpt-{choice.step}")
    error = ""
    try:
        job_restore.fetch(choice)
        state.restore(prefix)
    except RestoreAgreementError as exc:
        error = str(exc)
    except Exception as exc:  # said to every rank first, so none waits for this one
        error = f"rank {job_restore.rank} could not restore {prefix}: {type(exc).__name__}: {exc}"
    job_restore.confirm(choice.step, error)
    if error:  # confirm() raised for the others' failures; this one's is raised here
        raise RestoreAgreementError(error)
    restore_s = perf_counter() - t0
    log.info(
        "restored %s, the step the job's %d ranks agreed on (%.3fs)",
        prefix,
        job_restore.world_size,
        restore_s,
    )
    return Resumed(choice.step, restore_s, intact.Resume(prefix))


__all__ = ["Resumed", "restore", "restore_agreed", "restore_alone"]
