"""Restore agreement: every rank of a multi-worker job restores the same step.

Before the first step, each rank offers what it could restore
(:class:`~adaptd.protocol.job.RestoreOffer`: the steps complete in its checkpoint
directory, and those at its durable destination when ``restore_from`` is set) on the
job's key-value store; every rank reads all offers and computes the same choice
(:func:`adaptd.core.agreement.choose_restore`): the newest step every rank has or can pull.
A rank that lacks it locally pulls it; then each rank says how its restore went
(:class:`~adaptd.protocol.job.Restored`), and all wait for all, so one rank's failure
stops every rank with the same clear error instead of leaving the others to hang in
their first collective. Every wait is bounded.

Under ``MultiWorkerMirroredStrategy`` the replicated state is the same on every
worker and only the chief writes it; every rank writes its own part (its data
position) beside it. A step counts only where it is complete for the job and was
written by a job of this many ranks (:mod:`adaptd.client.restore.job_steps`): a worker that
sees the job's directory (shared storage) restores from it, a worker on a host where
that directory is empty pulls from the destination, or, without one, every rank stops
with a message saying so; a newer step of another number of ranks stops every rank
with a message naming both (:func:`adaptd.checkpoints.rank_parts.world_changed`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptd.client.agreement.kv import Keys, Store
from adaptd.client.agreement.ranks import Identity
from adaptd.client.checks import check_seconds
from adaptd.client.restore import job_steps
from adaptd.client.restore.remote import Source
from adaptd.core import agreement as rules
from adaptd.protocol import job as p

log = logging.getLogger("adaptd.client")


@dataclass(frozen=True)
class JobRestoreOptions:
    """Bounds on the restore agreement's two waits: for every rank's offer
    (``offer_timeout_s``; all ranks start together, their strategy connected them
    before the hook runs) and for every rank's restore, pulls included
    (``restore_timeout_s``). Raises ValueError for a bound that is not > 0 seconds."""

    offer_timeout_s: float = 300.0
    restore_timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        check_seconds("offer_timeout_s", self.offer_timeout_s)
        check_seconds("restore_timeout_s", self.restore_timeout_s)


class RestoreAgreementError(RuntimeError):
    """The job's ranks cannot restore one common step (the message says why and what
    to do); raised on every rank, so none starts alone."""


class JobRestore:
    """One rank's part of the restore agreement (one session's keys).

    Args:
        store: the job's key-value store.
        keys: the session's key names.
        who: this rank (its host is named in messages).
        directory: this rank's checkpoint directory.
        source: the durable destination to pull from (None: none).
        options: the bounds on the two waits.
        check: the quick check of one local checkpoint (default
            :func:`~adaptd.client.restore.job_steps.quick_check`).
        local: this rank's local tier (two tiers), whose steps are offered beside the
            directory's (:func:`~adaptd.client.restore.job_steps.tier_offer`), or None.
    """

    def __init__(
        self,
        store: Store,
        keys: Keys,
        who: Identity,
        directory: str | os.PathLike[str],
        source: Source | None = None,
        *,
        options: JobRestoreOptions = JobRestoreOptions(),
        check: job_steps.Check = job_steps.quick_check,
        local: str | os.PathLike[str] | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.who = who
        self.job, self.rank, self.world_size = who.job, who.rank, who.world_size
        self.directory = Path(directory)
        self.source = source
        self.options = options
        self._check = check
        #: Every rank's offer, once :meth:`agree` returned.
        self.offers: dict[int, p.RestoreOffer] = {}
        #: This rank's directory as it offered it (the steps skipped, and why).
        self.offerable = job_steps.Offerable()
        self.local = Path(local) if local is not None else None
        #: The steps this rank offered from its local tier (it restores them from there).
        self.tier_steps: list[int] = []

    @property
    def restore_from(self) -> str | None:
        """The destination's URL (None: none)."""
        return self.source.url if self.source is not None else None

    def agree(self) -> rules.RestoreChoice:
        """Offer this rank's steps, read every rank's, and choose.

        Raises:
            RestoreAgreementError: a rank's offer did not arrive in time, or no step is
                complete for the whole job while some rank has checkpoints.
            CoordinationError: the store stopped answering.
        """
        mine = job_steps.local_offer(self.directory, self.rank, self.world_size, self._check)
        if self.local is not None:
            self.tier_steps = job_steps.tier_offer(
                self.local, self.rank, self.world_size, self._check
            )
        here = sorted({*mine.local, *self.tier_steps}, reverse=True)[: p.MAX_OFFERED]
        remote = job_steps.pullable(self.source, self.world_size)
        self.offerable = mine
        other, other_size = mine.other_world, mine.other_world_size
        if remote.other_world and (not other or max(remote.other_world) > max(other)):
            other, other_size = remote.other_world, remote.other_world_size
        offer = p.RestoreOffer(
            v=p.VERSION,
            job=self.job,
            rank=self.rank,
            local=here,
            pullable=remote.steps,
            directory=str(self.directory)[: p.MAX_TEXT],
            url=(self.restore_from or "")[: p.MAX_TEXT],
            host=self.who.host[: p.MAX_TEXT],
            replicated=mine.replicated,
            own=mine.own,
            other_world=other,
            other_world_size=other_size,
        )
        self.store.put(self.keys.offer(self.rank), p.encode_json(offer))
        self.offers = self._gather(
            self.keys.offer, p.RestoreOffer, self.options.offer_timeout_s, "offer"
        )
        choice = rules.choose_restore(self.offers, self.world_size)
        if choice.error:
            raise RestoreAgreementError(choice.error)
        return choice

    def fetch(self, choice: rules.RestoreChoice) -> float:
        """Pull the chosen step into the directory when this rank's source is
        ``"pull"``; returns the seconds it took (0 when nothing was pulled).

        Raises:
            RestoreAgreementError: the pull failed (the message names the step, the
                destination and the reason).
        """
        if choice.step is None or choice.source.get(self.rank) != "pull":
            return 0.0
        from adaptd.tiers.replica import TierError, is_storage_error
        from adaptd.tiers.restore import restore

        assert self.source is not None  # "pull" is chosen only with a destination
        t0 = time.perf_counter()
        try:
            result = restore(
                self.source.url,
                self.directory,
                storage_options=dict(self.source.storage_options),
                step=choice.step,
            )
        except TierError as exc:
            raise RestoreAgreementError(
                f"rank {self.rank} could not pull step {choice.step} from "
                f"{self.restore_from}: {exc}"
            ) from None
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            raise RestoreAgreementError(
                f"rank {self.rank} could not pull step {choice.step} from "
                f"{self.restore_from}: {type(exc).__name__}: {exc}"
            ) from None
        seconds = time.perf_counter() - t0
        log.info(
            "pulled step %d from %s into %s: %.2f MB in %.2fs",
            result.step,
            self.restore_from,
            self.directory,
            result.bytes / 1e6,
            seconds,
        )
        return seconds

    def confirm(self, step: int, error: str = "") -> None:
        """Say how this rank's restore went (``error`` "" when it restored ``step``) and
        wait until every rank said so.

        Raises:
            RestoreAgreementError: a rank failed (its error is in the message), or did
                not report within the restore timeout.
        """
        done = p.Restored(
            v=p.VERSION,
            job=self.job,
            rank=self.rank,
            step=step,
            ok=not error,
            error=error[: p.MAX_TEXT],
        )
        self.store.put(self.keys.restored(self.rank), p.encode_json(done))
        results = self._gather(
            self.keys.restored, p.Restored, self.options.restore_timeout_s, "restore"
        )
        failed = [r for r in results.values() if not r.ok]
        if failed:
            raise RestoreAgreementError(
                "the job cannot resume: "
                + "; ".join(f"rank {r.rank} failed to restore: {r.error}" for r in failed)
            )
        steps = {r.step for r in results.values()}
        if len(steps) != 1:  # cannot happen with one choice; refuse rather than diverge
            raise RestoreAgreementError(
                "the ranks restored different steps: "
                + ", ".join(f"rank {r.rank}: {r.step}" for r in results.values())
            )

    def _gather(self, key_of: Any, kind: type, timeout_s: float, what: str) -> dict[int, Any]:
        deadline = time.monotonic() + timeout_s
        raws: dict[int, str] = {}
        for r in range(self.world_size):
            left = deadline - time.monotonic()
            key = key_of(r)
            raw = self.store.get(key, left) if left > 0 else self.store.try_get(key)
            if raw is not None:
                raws[r] = raw
        missing = [r for r in range(self.world_size) if r not in raws]
        if missing:
            raise RestoreAgreementError(
                f"no {what} from rank(s) {', '.join(map(str, missing))} within "
                f"{timeout_s:g}s: every rank of job {self.job!r} must start (and reach "
                "restore_or_initialize) together; check the other workers' logs"
            )
        out: dict[int, Any] = {}
        for r, raw in raws.items():
            try:
                msg = p.decode_rank(raw)
            except p.ProtocolError as exc:
                raise RestoreAgreementError(f"rank {r}'s {what} is unreadable: {exc}") from None
            if not isinstance(msg, kind) or msg.rank != r:
                raise RestoreAgreementError(f"rank {r}'s {what} key holds something else")
            out[r] = msg
        return out


__all__ = ["JobRestore", "JobRestoreOptions", "RestoreAgreementError"]
