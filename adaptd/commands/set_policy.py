"""``adaptd set-policy --job J SPEC``: change a running job's policy; ``--clear`` takes it back.

The spec is checked here first (:func:`adaptd.core.policy.parse`, so a typo fails without
a daemon round trip) and again by the daemon, which pushes the new plan to the
job's ranks at once. The setting outlives the job's restarts and, when the daemon
persists settings (``adaptd serve`` with a state database), the daemon's.
``--clear`` returns the job to the policy it would have without an operator's: the
config's ``[jobs]`` policy for it, else the spec its ranks asked for, else the daemon's
default; the new plan is pushed at once too. The daemon's side is :func:`answer`.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from adaptd.commands import _operator
from adaptd.core.policy import PolicyError
from adaptd.daemon.logfmt import logfmt
from adaptd.protocol.admin import AdminError, SetPolicyReply, SetPolicyRequest

if TYPE_CHECKING:
    from adaptd.daemon.admin.context import AdminContext

HELP = "change a running job's policy, or --clear it (the new plan reaches it at once)"
REQUEST = SetPolicyRequest
REPLY = SetPolicyReply

log = logging.getLogger("adaptd.server")

#: Where a job's policy comes from once an operator's is cleared (SetPolicyReply.source).
SOURCES = {
    "config": "the config's [jobs] entry for it",
    "job": "the spec its ranks asked for",
    "default": "the daemon's default",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", metavar="JOB", required=True, help="the job id")
    parser.add_argument(
        "spec", metavar="SPEC", nargs="?", help="a policy spec, e.g. 'fixed:steps=500'"
    )
    parser.add_argument(
        "--clear",
        action="store_true",
        help="take back the policy an operator set: the job gets the config's, its own or "
        "the daemon's default again",
    )
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace) -> int:
    from adaptd.cli import UsageError
    from adaptd.core import policy as policy_mod

    if args.clear == (args.spec is not None):
        raise UsageError("give a policy SPEC or --clear (one of them)")
    if args.spec is not None:
        try:
            policy_mod.parse(args.spec)
        except policy_mod.PolicyError as exc:
            raise UsageError(f"policy spec {args.spec!r}: {exc}") from None
    req = SetPolicyRequest(job=args.job, spec=args.spec or "", clear=args.clear)
    return _operator.call("set-policy", args, req, lambda r: print(text(r, args.clear)))


def text(reply: SetPolicyReply, clear: bool) -> str:
    if clear:
        return _cleared(reply)
    if reply.relayed_to:
        return f"{reply.job}: policy {reply.policy} relayed to {reply.relayed_to}, which decides it"
    return f"{reply.job}: policy {reply.policy} (was {reply.previous}); {_pushed(reply)}"


def _pushed(reply) -> str:
    return f"plan {reply.plan_seq} pushed" if reply.plan_seq else "no live ranks to tell yet"


def _cleared(reply) -> str:
    """What ``--clear`` changed, or that there was nothing to clear."""
    now = f"policy {reply.policy} ({SOURCES.get(reply.source, reply.source)})"
    if not reply.cleared:
        text = f"nothing to clear: {reply.job} has no policy set by an operator"
        return text + (f"; its {now}" if reply.source else "")
    text = f"{reply.job}: operator's policy {reply.previous} cleared"
    if not reply.source:  # a job not running here: only its setting changed
        then = f"; the config's {reply.policy} applies when it returns" if reply.policy else ""
        return text + then
    return f"{text}; now {now}; {_pushed(reply)}"


# ------------------------------------------------------------------ the daemon's side


def answer(req: SetPolicyRequest, ctx: AdminContext) -> SetPolicyReply:
    """The job's new policy, its plan pushed at once (or the request relayed to the host
    deciding the job); ``clear`` takes the operator's policy back."""
    if req.clear or not req.spec:
        if not req.clear or req.spec:
            raise AdminError("invalid", "set-policy: give a policy spec or clear")
        return _clear(req.job, ctx)
    job = ctx.known_job(req.job)
    try:
        if not job.decides:
            ctx.core.choice.check(req.spec)  # a bad spec is refused here, at once
            decider = ctx.relay(job, "set_policy", spec=req.spec)
            log.info(logfmt("operator_action", action="set_policy", job=job.id, policy=req.spec,
                            relayed_to=decider))  # fmt: skip
            return SetPolicyReply(
                job=job.id, policy=req.spec, previous="", plan_seq=0, relayed_to=decider
            )
        previous, seq = ctx.core.ops.set_policy(job, req.spec, ctx.now)
    except PolicyError as exc:
        raise AdminError("bad_policy", f"policy spec {req.spec!r}: {exc}") from None
    log.info(logfmt("operator_action", action="set_policy", job=job.id, policy=req.spec,
                    previous=previous, plan_seq=seq))  # fmt: skip
    return SetPolicyReply(job=job.id, policy=req.spec, previous=previous, plan_seq=seq)


def _clear(job_id: str, ctx: AdminContext) -> SetPolicyReply:
    """``set-policy --clear``: the operator's policy taken back (here, where the job is
    decided; a job decided on another host is cleared there)."""
    settings = ctx.core.settings
    job = ctx.core.registry.jobs.get(job_id)
    if job is None:
        if job_id not in settings:
            ctx.known_job(job_id)  # raises unknown_job
        before, after = settings.clear_policy(job_id, ctx.now)
        cleared, spec, source, seq = before if before != after else None, after or "", "", 0
    elif not job.decides:
        decider = job.agreed.decided_by if job.agreed is not None else ""
        raise AdminError(
            "not_deciding",
            f"job {job_id!r} is decided by {decider or 'its chief (rank 0)'}'s daemon: "
            f"run `adaptd set-policy --job {job_id} --clear` on that host",
        )
    else:
        cleared, spec, source, seq = ctx.core.ops.clear_policy(job, ctx.now)
    log.info(logfmt("operator_action", action="clear_policy", job=job_id, cleared=cleared,
                    policy=spec or None, source=source or None, plan_seq=seq))  # fmt: skip
    return SetPolicyReply(job=job_id, policy=spec, previous=cleared or "", plan_seq=seq,
                          cleared=cleared is not None, source=source)  # fmt: skip
