"""Operator actions on one job, whoever asked, and on whichever host the job is decided.

``set-policy``, ``pause``/``resume`` and ``save-now`` change what a job's plan is. One
daemon decides each job's plan (:attr:`~adaptd.daemon.jobs.table.Job.decides`): for a multi-host
job whose ranks agree on TensorFlow's coordination service, that is the daemon of
its chief (rank 0). :class:`JobOps` does an action where it belongs:

- on the deciding daemon it is done at once (the operator typed it here, or it came
  from another host as a :class:`~adaptd.protocol.job.Request` that the job's chief
  handed over: then it is logged with its ``origin``);
- on any other daemon it is handed to the job's local rank as a
  :class:`~adaptd.protocol.job.Relay`, which forwards it in-band to the chief, whose
  daemon then does it. Nothing is changed here: this host shows the plan the ranks
  agree on (:class:`~adaptd.protocol.job.JobPlan`).

A Request is accepted only from a rank of the job it names (the job handler checks
the connection), so a job's processes can ask for their own job only. ``save_now`` a
job could ask of itself anyway; ``set_policy``, ``pause`` and ``resume`` override what
the operator set, so they must carry the signature of the daemon they were typed at
(:mod:`adaptd.protocol.relay_auth`, ``daemon.relay_key_file``): a rank cannot make one up.
Without a key they are not relayed at all: the operator is told to type them on the
deciding host.

Which operations are relayed, what the deciding daemon does with each and which must be
signed is not written here: :class:`JobOps` is given them (``relayed``), from the table
of operator commands (:data:`adaptd.daemon.admin.commands.OPERATOR_COMMANDS`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adaptd.daemon.jobs.delivery import Delivery
from adaptd.daemon.jobs.planner import Planner
from adaptd.daemon.jobs.policy_choice import PolicyChoice
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.jobs.table import Job, JobTable, Rank
from adaptd.logfmt import logfmt
from adaptd.protocol import job as p
from adaptd.protocol.relay_auth import RelayKey

__all__ = ["JobOps", "NoRankToRelay", "Relayed", "RelayedOp", "RequestRefused"]

log = logging.getLogger("adaptd.server")


class NoRankToRelay(Exception):
    """A request for a job decided on another host, which has no live rank here to
    carry it there. The message says what to do."""


class RequestRefused(Exception):
    """A relayed request the deciding daemon does not carry out; the message says why
    (it goes back to the rank that handed it over)."""


#: What the deciding daemon does with a relayed operation: ``(ops, job, request, now)`` ->
#: the figures logged with it. Raises :class:`RequestRefused`.
Relayed = Callable[["JobOps", Job, p.Request, float], "dict[str, object]"]


@dataclass(frozen=True)
class RelayedOp:
    """A relayed operation as :class:`JobOps` handles it: what the deciding daemon does
    (``run``), and whether it travels only signed (``signed``: only an operator may ask it)."""

    run: Relayed
    signed: bool


class JobOps:
    """The operator's actions on one job (used by the admin and the job handler).

    ``hostname``: this host, named as the origin of the requests relayed from here.
    ``relay_key`` signs those, and checks the ones relayed here. ``relayed``: the
    operations relayed between hosts, by the job protocol's name (the table of operator
    commands'): any other is refused.
    """

    def __init__(
        self,
        *,
        planner: Planner,
        choice: PolicyChoice,
        settings: OperatorSettings,
        jobs: JobTable,
        delivery: Delivery,
        hostname: str,
        relayed: Mapping[str, RelayedOp],
        relay_key: RelayKey | None = None,
    ) -> None:
        self.planner = planner
        self.choice = choice
        self.settings = settings
        self.jobs = jobs
        self.delivery = delivery
        self.hostname = hostname
        self.relayed = relayed
        self.relay_key = relay_key

    # ------------------------------------------------------------------ on this host

    def set_policy(self, job: Job, spec: str, now: float) -> tuple[str, int]:
        """The operator's policy for ``job``, its plan pushed at once. Returns
        ``(previous spec, plan seq)``; raises :class:`PolicyError`."""
        previous = self.choice.set(job, spec, now)
        return previous, self.planner.replan(job, now)

    def clear_policy(self, job: Job, now: float) -> tuple[str | None, str, str, int]:
        """``set-policy --clear`` (:meth:`PolicyChoice.clear`), the new plan pushed when
        the policy changed. Returns ``(spec taken back or None, spec now, its source,
        plan seq)``."""
        cleared, spec, source, changed = self.choice.clear(job, now)
        return cleared, spec, source, self.planner.replan(job, now) if changed else 0

    def pause(self, job_id: str, paused: bool, now: float) -> bool:
        """Hold or release ``job_id``'s non-urgent saves; True when that changed."""
        if self.settings.paused(job_id) == paused:
            return False
        self.settings.change(job_id, now, paused=paused)
        job = self.jobs.get(job_id)
        if job is not None:
            self.planner.replan(job, now)
        return True

    def save_now(self, job: Job, reason: str, now: float) -> int:
        """Every live rank saves at one step soon (an operator's request, or a drain's,
        answered by the job's next durable save); returns how many ranks were asked."""
        job.ask_save(reason)
        return self.planner.save_now(job, reason, now)

    # ------------------------------------------------------------------ across hosts

    def relay(
        self, job: Job, op: p.Operation, now: float, *, spec: str = "", reason: str = ""
    ) -> str:
        """Hand ``op`` to the job's local rank for its chief's daemon; returns who decides
        (the host named by the ranks' last :class:`~adaptd.protocol.job.JobPlan`, else "the
        job's chief"). Raises :class:`NoRankToRelay` when no rank of the job is live here,
        and KeyError for an operation that is not in ``relayed`` (a command's answer
        naming an operation its table entry does not)."""
        signed = self.relayed[op].signed
        rank = _relay_rank(job)
        decider = job.agreed.decided_by if job.agreed is not None else ""
        where = f"{decider or 'its chief (rank 0)'}'s daemon"
        if rank is None:
            raise NoRankToRelay(
                f"job {job.id!r} is decided by {where} and has no live rank on this host to "
                "carry the request there: run the command on that host"
            )
        if signed and self.relay_key is None:
            raise NoRankToRelay(
                f"job {job.id!r} is decided by {where}; {op} is relayed there only signed, and "
                "this daemon has no daemon.relay_key_file: run the command on that host, or "
                "give every host's daemon the same relay key (docs/multiworker.md)"
            )
        spec, reason, origin = spec[: p.MAX_TEXT], reason[: p.MAX_TEXT], self.hostname[: p.MAX_TEXT]
        auth = ""
        if self.relay_key is not None and signed:
            auth = self.relay_key.sign(job.id, op, spec, reason, origin)
        msg = p.Relay(
            v=p.VERSION, job=job.id, op=op, spec=spec, reason=reason, origin=origin, auth=auth
        )
        self.delivery.send(rank, msg, now)
        log.info(logfmt("relayed", job=job.id, op=op, spec=spec or None, rank=rank.rank,
                        decided_by=decider or None))  # fmt: skip
        return decider or "the job's chief (rank 0)"

    def on_request(self, job: Job, msg: p.Request, now: float) -> str | None:
        """A request relayed from host ``msg.origin``, handed over by the job's chief:
        done as if typed here. Returns why it was refused, else None."""
        if not job.decides:
            return (
                f"job {job.id!r}: this daemon does not decide the job's plan (its chief, rank 0, "
                "is on another host); a request goes to the chief's daemon"
            )
        relayed = self.relayed.get(msg.op)
        if relayed is None:
            return f"{msg.op} for job {job.id!r} refused: this daemon relays no such operation"
        if relayed.signed:
            why = (
                self.relay_key.check(job.id, msg.op, msg.spec, msg.reason, msg.origin, msg.auth)
                if self.relay_key is not None
                else "this daemon has no daemon.relay_key_file to check its signature"
            )
            if why:
                log.warning(logfmt("request_refused", job=job.id, op=msg.op, via_rank=msg.rank,
                                   origin=msg.origin or "?", why=why))  # fmt: skip
                return f"{msg.op} for job {job.id!r} refused: {why}; only an operator may ask it"
        try:
            detail = relayed.run(self, job, msg, now)
        except RequestRefused as exc:
            return str(exc)
        log.info(logfmt("operator_action", action=msg.op, job=job.id, origin=msg.origin or "?",
                        via_rank=msg.rank, reason=msg.reason or None, **detail))  # fmt: skip
        return None


def _relay_rank(job: Job) -> Rank | None:
    return min(job.live_ranks(), key=lambda r: r.rank, default=None)
