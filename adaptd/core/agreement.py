"""How the ranks of one job agree on save steps and on the step to restore: the rules.

Pure functions of their arguments (no clock, no I/O, no TensorFlow), shared by the
ranks' own agreement on TensorFlow's coordination service
(:mod:`adaptd.client.agreement.rounds`) and the daemon's agreement for ranks without one.
The records are the wire protocol's (:mod:`adaptd.protocol.job`).

One **round** changes one thing, modelled on TensorFlow's PreemptionCheckpointHandler
(a first-writer-wins key, acknowledgements, a commit only once every worker
acknowledged):

1. A rank (or the daemon) *proposes* ``action`` at step ``at_step``: the job's new
   plan from that step on, one save there, or one save there and then a stop. Ranks
   race for the round; the first proposal written is the round's, the others wait
   for the next round.
2. Every rank *acknowledges* (:func:`acknowledge`): ``ok`` only if its own step is
   still below ``at_step``. From then on it does not pass ``at_step`` until the round
   is decided (it waits there, bounded).
3. The proposer *decides* (:func:`decide`): commit only if every rank acknowledged
   ``ok``; otherwise abort, saying how far the ranks were, so the next proposal can
   name a later step (:func:`retry_step`). A rank that waited too long for the
   decision writes an abort itself; the decision is first-writer-wins too, so
   every rank reads the same outcome.

A committed change therefore takes effect at a step that every rank acknowledged
before reaching it, and every rank applies it at its first step boundary at or
after ``at_step`` (the same boundary on every rank of a data-parallel job, whose
ranks run the same steps).

**Restore** (:func:`choose_restore`): every rank offers the steps it holds complete
and the steps it could pull from a durable destination; all restore the newest step
that every rank holds or can pull. None in common while checkpoints exist is an
error, never a rank resuming alone.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from adaptd.checkpoints.rank_parts import world_changed
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as p

#: Default lead of a proposal, in wall time: the round's messages (a few round trips)
#: normally finish well within it, so ranks rarely wait at ``at_step``.
LEAD_TIME_S = 0.25
#: Fewest steps between the proposer's step and ``at_step``.
MIN_LEAD_STEPS = 2
#: Most steps between the proposer's step and ``at_step`` (a very slow step time
#: estimate must not push a save far away).
MAX_LEAD_STEPS = 10_000


def lead_steps(
    step_time_s: float | None,
    lead_time_s: float = LEAD_TIME_S,
    *,
    min_steps: int = MIN_LEAD_STEPS,
    max_steps: int = MAX_LEAD_STEPS,
) -> int:
    """Steps ahead to propose at: ``lead_time_s`` of steps, within [min, max].

    Unknown or non-positive step time: ``min_steps`` (then ranks wait at the step
    for the round instead; correct, only slower).
    """
    if step_time_s is None or not step_time_s > 0 or math.isinf(step_time_s):
        return min_steps
    return max(min_steps, min(max_steps, math.ceil(lead_time_s / step_time_s)))


def retry_step(step: int, lead: int, aborted: p.Decide | None, attempt: int) -> int:
    """``at_step`` for a proposal made at ``step``: ``lead`` steps ahead, and after an
    abort because ranks had passed the step, ahead of the furthest of them, with the
    lead doubled for each failed ``attempt`` (capped at 64 times)."""
    base = step
    if aborted is not None and aborted.retry_from is not None:
        base = max(base, aborted.retry_from)
    return base + lead * (1 << min(max(attempt, 0), 6))


# ---------------------------------------------------------------------- one round


def acknowledge(proposal: p.Propose, rank: int, step: int) -> p.Ack:
    """A rank's answer: ``ok`` when ``step`` (its newest completed step) is below
    ``at_step``, i.e. it can still hold there."""
    return p.Ack(
        v=p.VERSION,
        job=proposal.job,
        rank=rank,
        round=proposal.round,
        step=step,
        ok=step < proposal.at_step,
    )


def decide(
    proposal: p.Propose, acks: Mapping[int, p.Ack], ranks: int | Collection[int]
) -> p.Decide:
    """Commit when every rank acknowledged ``ok`` (``ranks``: the ranks that must, or
    the world size for ``0..ranks-1``); else abort, with the reason and, when ranks
    had passed ``at_step``, the furthest step seen."""
    members = set(range(ranks)) if isinstance(ranks, int) else set(ranks)
    missing = sorted(r for r in members if r not in acks)
    late = sorted(r for r, a in acks.items() if not a.ok and r in members)
    steps = [a.step for r, a in acks.items() if r in members]
    if not missing and not late:
        return p.Decide(v=p.VERSION, job=proposal.job, round=proposal.round, commit=True)
    parts = []
    if late:
        where = ", ".join(f"rank {r} at step {acks[r].step}" for r in late)
        parts.append(f"{where}: past step {proposal.at_step}")
    if missing:
        parts.append(f"no acknowledgement from rank(s) {_ranks(missing)}")
    return abort(proposal, "; ".join(parts), retry_from=max(steps) if late else None)


def abort(proposal: p.Propose, reason: str, retry_from: int | None = None) -> p.Decide:
    """An abort of ``proposal``'s round, e.g. by a rank that waited too long."""
    return p.Decide(
        v=p.VERSION,
        job=proposal.job,
        round=proposal.round,
        commit=False,
        reason=reason[: p.MAX_TEXT],
        retry_from=retry_from,
    )


# ---------------------------------------------------------------------- proposals


def plan_proposal(
    job: str,
    round: int,
    at_step: int,
    proposer: int,
    decision: Decision,
    *,
    decided_by: str = "",
    source: str = "",
) -> p.Propose:
    """Propose ``decision`` as the job's plan from ``at_step`` on. An urgent decision is
    not a plan: propose a save for it (:func:`save_proposal`)."""
    if decision.urgent:
        raise ValueError("an urgent decision is proposed as a save, not as a plan")
    return p.Propose(
        v=p.VERSION,
        job=job,
        round=round,
        action="plan",
        at_step=at_step,
        proposer=proposer,
        reason=decision.reason[: p.MAX_TEXT],
        next_step=decision.next_step,
        every_steps=decision.every_steps,
        policy=decision.policy[: p.MAX_TEXT],
        interval_s=decision.interval_s,
        waste=decision.waste,
        decided_by=decided_by[: p.MAX_TEXT],
        source=source[: p.MAX_TEXT],
        durable_every=decision.durable_every,
    )


def save_proposal(
    job: str, round: int, at_step: int, proposer: int, reason: str, *, stop: bool = False
) -> p.Propose:
    """Propose one save at ``at_step`` (and, with ``stop``, that the job stops after it)."""
    return p.Propose(
        v=p.VERSION,
        job=job,
        round=round,
        action="stop" if stop else "save",
        at_step=at_step,
        proposer=proposer,
        reason=reason[: p.MAX_TEXT],
    )


def decision_of(proposal: p.Propose) -> Decision:
    """The plan a ``"plan"`` proposal carries, as a :class:`Decision`."""
    if proposal.action != "plan":
        raise ValueError(f"a {proposal.action!r} proposal carries no plan")
    return Decision(
        next_step=proposal.next_step,
        every_steps=proposal.every_steps,
        reason=proposal.reason,
        policy=proposal.policy,
        interval_s=proposal.interval_s,
        waste=proposal.waste,
        durable_every=proposal.durable_every,
    )


def satisfies(committed: p.Propose, wish: str, since_step: int) -> bool:
    """Whether a committed round fulfils a rank's wish made at ``since_step``: a save
    wish by any save or stop at or after that step, a stop wish by a stop."""
    if committed.action == "plan" or committed.at_step < since_step:
        return False
    return wish == "save" or committed.action == "stop"


# ---------------------------------------------------------------------- restore


@dataclass(frozen=True)
class RestoreChoice:
    """What every rank restores. ``step`` None: a fresh start (no rank has any
    checkpoint). ``source[rank]`` is ``"local"`` (its directory has the step) or
    ``"pull"`` (fetch it from its destination first); ``newer[rank]``: its local
    steps after ``step``, which the job cannot resume from. ``error``: no step is
    complete for the whole job (then ``step`` is None and nobody may start)."""

    step: int | None
    source: Mapping[int, str] = field(default_factory=dict)
    newer: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    error: str = ""


def choose_restore(offers: Mapping[int, p.RestoreOffer], world_size: int) -> RestoreChoice:
    """The newest step every rank ``0..world_size-1`` has locally or can pull.

    A step counts only where it is complete for the job (its replicated part and every
    rank's part, :mod:`adaptd.checkpoints.rank_parts`); the offers say so. An error instead of a
    choice when a newer checkpoint was written by a job of another number of ranks
    (its ranks' own state cannot be handed to these), and when no step is readable by
    every rank while some step is whole across their directories (its parts are
    spread over hosts) or held by some rank only. Nothing anywhere: a fresh start.

    Raises ValueError when an offer is missing (the caller waits for all first).
    """
    missing = [r for r in range(world_size) if r not in offers]
    if missing:
        raise ValueError(f"no restore offer from rank(s) {_ranks(missing)}")
    ranks = range(world_size)
    local = {r: set(offers[r].local) for r in ranks}
    reachable = {r: local[r] | set(offers[r].pullable) for r in ranks}
    common = set.intersection(*(reachable[r] for r in ranks))
    step = max(common) if common else None
    other = _newest_other_world(offers)
    if other is not None and (step is None or other[0] > step):
        return RestoreChoice(step=None, error=other[1])
    if step is None:
        spread = _spread(offers, world_size)
        if spread is not None:
            return RestoreChoice(step=None, error=spread)
        if not any(reachable[r] for r in ranks):
            return RestoreChoice(step=None)
        newest = max(max(reachable[r]) for r in ranks if reachable[r])
        lacking = [r for r in ranks if newest not in reachable[r]]
        return RestoreChoice(step=None, error=_no_common(offers, lacking, newest))
    return RestoreChoice(
        step=step,
        source={r: "local" if step in local[r] else "pull" for r in ranks},
        newer={r: tuple(sorted(s for s in local[r] if s > step)) for r in ranks},
    )


def _newest_other_world(offers: Mapping[int, p.RestoreOffer]) -> tuple[int, str] | None:
    """The newest step written by a job of another world size, and the refusal."""
    best: tuple[int, p.RestoreOffer] | None = None
    for offer in offers.values():
        if offer.other_world and (best is None or max(offer.other_world) > best[0]):
            best = (max(offer.other_world), offer)
    if best is None:
        return None
    step, offer = best
    where = offer.directory or offer.url or f"rank {offer.rank}'s directory"
    return step, world_changed(step, where, offer.other_world_size, len(offers))


def _spread(offers: Mapping[int, p.RestoreOffer], world_size: int) -> str | None:
    """The refusal when some step is whole across the ranks' directories but not in
    one place each rank reads (no shared storage: each rank's part is on its host)."""
    replicated = set().union(*(set(o.replicated) for o in offers.values()))
    whole = replicated.intersection(*(set(offers[r].own) for r in range(world_size)))
    if not whole:
        return None
    step = max(whole)
    holders = [r for r in sorted(offers) if step in offers[r].replicated]
    return (
        f"step {step} is whole across the job's ranks (its replicated part in the "
        f"directory of rank(s) {_ranks(holders)}, each rank's own part in its own "
        "directory), but no rank can read all of it in one place. Give every rank the "
        "same checkpoint directory (shared storage), so that every rank's part and the "
        "replicated part are side by side (docs/multiworker.md)"
    )


def _no_common(offers: Mapping[int, p.RestoreOffer], lacking: list[int], newest: int) -> str:
    held = "; ".join(
        f"rank {r} ({offers[r].host or '?'}): {_steps(offers[r])}" for r in sorted(offers)
    )
    return (
        f"no checkpoint step is complete for the whole job ({held}); rank(s) "
        f"{_ranks(lacking)} cannot get step {newest}. Give every rank the same checkpoint "
        "directory (shared storage), or restore_from= the durable destination the "
        "checkpoints are replicated to (docs/multiworker.md), or remove the checkpoints "
        "to start afresh"
    )


def _steps(offer: p.RestoreOffer) -> str:
    parts = []
    if offer.local:
        parts.append(f"steps {_span(offer.local)} in {offer.directory or 'its directory'}")
    if offer.pullable:
        parts.append(f"steps {_span(offer.pullable)} at {offer.url or 'its destination'}")
    return ", ".join(parts) or f"nothing in {offer.directory or 'its directory'}"


def _span(steps: list[int]) -> str:
    s = sorted(steps, reverse=True)
    return ", ".join(map(str, s)) if len(s) <= 6 else f"{s[0]} .. {s[-1]} ({len(s)})"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


__all__ = [
    "LEAD_TIME_S",
    "RestoreChoice",
    "abort",
    "acknowledge",
    "choose_restore",
    "decide",
    "decision_of",
    "lead_steps",
    "plan_proposal",
    "retry_step",
    "satisfies",
    "save_proposal",
]
