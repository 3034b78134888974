"""Which step a run continues from, and loading it: one rank alone, or the whole job.

:func:`restore_alone` (:class:`Alone`) is a single rank's resume: pull the newest
verified checkpoint from ``restore_from`` into an empty directory, then restore the
newest intact one (:mod:`adaptd.client.restore.intact`). :func:`restore_agreed`
(:class:`Agreed`) is a rank of a multi-worker job: the ranks agree on one step
(:class:`~adaptd.client.restore.job_restore.JobRestore`), a rank lacking it pulls it,
every rank loads exactly that step, the replicated part and its own part
(:class:`~adaptd.client.save.rank_state.RankPart`), and all wait for all, so no rank
resumes alone from another step or with another rank's data position.

Which checkpoint is chosen is decided in one place for each: the sources an alone
rank tries, in order (its directory, else the destination), here in
:func:`restore_alone`, then the newest intact one among them
(:func:`~adaptd.client.restore.intact.restore_newest_intact`); for a job, the newest step
every rank has or can pull (:func:`adaptd.core.agreement.choose_restore`, on the
offers of :mod:`adaptd.client.restore.job_steps`). A tier beside the durable one (a
local copy, newer than the durable) is one more source there.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Protocol

from adaptd.checkpoints import rank_parts
from adaptd.client.restore import intact, remote, tiers
from adaptd.client.restore import notes as resume_notes
from adaptd.client.restore.intact import WorldSizeChanged
from adaptd.client.restore.job_restore import JobRestore, RestoreAgreementError
from adaptd.client.save import files, replay
from adaptd.client.save.rank_state import RankPart
from adaptd.client.save.state import CheckpointState

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
    #: Two tiers: "local" when restored from the local tier (else "": durable or
    #: fresh), and whether the local tier held a copy of a previous run.
    tier: str = ""
    local_intact: bool = False


class Restorer(Protocol):
    """How a rank restores (built once, by :mod:`adaptd.client.assembly`)."""

    def restore(self, state: CheckpointState) -> Resumed:
        """Load the step the run continues from into ``state``; what was done."""
        ...


@dataclass(frozen=True)
class Alone:
    """A rank that restores by itself (:func:`restore_alone`): from ``directory``,
    filled first from ``source`` when it has no checkpoint."""

    directory: Path
    source: remote.Source | None = None
    local: tuple[Path, ...] = ()  # the local tier's directories (two tiers)

    def restore(self, state: CheckpointState) -> Resumed:
        return restore_alone(self.directory, state, self.source, self.local)


@dataclass(frozen=True)
class Agreed:
    """A rank of a job whose ranks agree in-band on the step they all restore
    (:func:`restore_agreed`); ``part`` is this rank's own part of each save."""

    job_restore: JobRestore
    part: RankPart
    local_part: RankPart | None = None  # this rank's part in its local tier (two tiers)

    def restore(self, state: CheckpointState) -> Resumed:
        tidy = self.job_restore.who.chief  # the others must not touch the leftovers
        return restore_agreed(self.job_restore, state, self.part, tidy=tidy,
                              local_part=self.local_part)  # fmt: skip


def restore_alone(
    directory: Path,
    state: CheckpointState,
    source: remote.Source | None,
    local: tuple[Path, ...] = (),
) -> Resumed:
    """Restore the newest intact checkpoint of ``directory`` (pulled first from
    ``source`` when the directory has none); with a local tier (``local``: its
    directories), its newest intact copy instead when it is at least as new
    (:func:`adaptd.client.restore.tiers.restore_local`).

    Raises:
        NoIntactCheckpoint: there are checkpoints, every one damaged.
        WorldSizeChanged: the newest complete one is a multi-worker job's (ranks' parts).
    """
    files.remove_orphans(directory)
    t0 = perf_counter()
    held = False
    if local:
        found = tiers.restore_local(local, directory, state.restore)
        held = found.intact
        if found.restored is not None:
            tiers.remove(found)
            start = state.restored_step(found.restored)
            restore_s = perf_counter() - t0
            resume_notes.say(resume_notes.resumed(
                step=start, checkpoint=found.restored, seconds=restore_s,
                tier=resume_notes.LOCAL, where=str(Path(found.restored).parent),
            ))  # fmt: skip
            resume = intact.Resume(found.restored, found.skipped)
            return Resumed(start, restore_s, resume, None, "local", held)
    pulled = None
    restore_from = source.url if source is not None else None
    if source is not None:
        pulled = remote.pull_if_empty(directory, source.url, storage_options=source.storage_options)
    refuse_other_world(directory, 1)
    resume = intact.restore_newest_intact(directory, state.restore)
    intact.set_aside(directory, resume)
    if local:
        tiers.remove(found)
    if not resume.restored:
        why = pulled.reason if pulled is not None else ""
        resume_notes.say(resume_notes.fresh(directory=str(directory), restore_from=restore_from,
                                            why=why))  # fmt: skip
        return Resumed(0, None, resume, pulled, local_intact=held)
    start = state.restored_step(resume.restored)
    restore_s = perf_counter() - t0
    from_destination = pulled is not None and pulled.step is not None
    resume_notes.say(resume_notes.resumed(
        step=start, checkpoint=resume.restored, seconds=restore_s,
        tier=resume_notes.tier(restore_from, from_destination),
        where=pulled.url if from_destination else str(directory),
    ))  # fmt: skip
    return Resumed(start, restore_s, resume, pulled, local_intact=held)


def restore_agreed(
    job_restore: JobRestore,
    state: CheckpointState,
    part: RankPart,
    *,
    tidy: bool,
    local_part: RankPart | None = None,
) -> Resumed:
    """Agree with the other ranks on one step, pull it if this rank lacks it, load it
    (the replicated part, then this rank's own), and wait until every rank did.
    ``tidy``: remove leftovers of interrupted writes first (the chief; the others
    must not touch the directory's leftovers). A step this rank offered from its local
    tier (two tiers) is loaded from there, its own part with ``local_part``.

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
    rank, world = job_restore.rank, job_restore.world_size
    skipped = tuple(d for d in job_restore.offerable.skipped if _newer(d, choice.step))
    for d in skipped:
        log.warning("not resuming from %s: %s", d.name, d.why)
    if choice.step is None:
        job_restore.confirm(0)
        resume_notes.say(resume_notes.fresh(rank=rank, world_size=world,
                                            directory=str(directory),
                                            restore_from=job_restore.restore_from))  # fmt: skip
        return Resumed(0, None, intact.Resume(None, skipped))
    # a rank with a local tier (two tiers) loads a step it offered from there
    held = local_part is not None and bool(job_restore.tier_steps)
    from_tier = held and choice.step in job_restore.tier_steps
    local = job_restore.local if from_tier else None
    prefix = os.path.join(str(local if from_tier else directory), f"ckpt-{choice.step}")
    error = ""
    try:
        job_restore.fetch(choice)
        state.restore(prefix)
        # as written, or rebuilt (just in time); from the local tier when it has it
        replay.restore(local_part if from_tier and local_part is not None else part, choice.step)
    except RestoreAgreementError as exc:
        error = str(exc)
    except Exception as exc:  # said to every rank first, so none waits for this one
        error = f"rank {job_restore.rank} could not restore {prefix}: {type(exc).__name__}: {exc}"
    job_restore.confirm(choice.step, error)
    if error:  # confirm() raised for the others' failures; this one's is raised here
        raise RestoreAgreementError(error)
    restore_s = perf_counter() - t0
    pulled = choice.source.get(rank) == "pull"
    tier = resume_notes.tier(job_restore.restore_from, pulled)
    resume_notes.say(resume_notes.resumed(
        rank=rank, world_size=world, step=choice.step, checkpoint=prefix, seconds=restore_s,
        tier=resume_notes.LOCAL if from_tier else tier,
        where=str(local) if from_tier else job_restore.restore_from if pulled else str(directory),
        agreed=True,
    ))  # fmt: skip
    return Resumed(choice.step, restore_s, intact.Resume(prefix, skipped),
                   tier="local" if from_tier else "", local_intact=held)  # fmt: skip


def _newer(damaged: intact.Damaged, step: int | None) -> bool:
    n = rank_parts.step_of(f"{damaged.name}.index")
    return step is None or (n is not None and n > step)


def refuse_other_world(directory: Path, world: int) -> None:
    """Raise :class:`WorldSizeChanged` when the newest step complete in ``directory``
    (for any number of ranks) was written by a job of another number than ``world``."""
    names = rank_parts.listing(directory)
    for step in rank_parts.steps(names):
        st = rank_parts.status(names, step)
        if not st.complete:
            continue
        if st.world != world:
            message = rank_parts.world_changed(step, str(directory), st.world, world)
            raise WorldSizeChanged(message)
        return


__all__ = [
    "Agreed",
    "Alone",
    "Restorer",
    "Resumed",
    "WorldSizeChanged",
    "refuse_other_world",
    "restore_agreed",
    "restore_alone",
]
