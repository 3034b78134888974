"""``adaptd set-policy --job J SPEC``: change a running job's policy; ``--clear`` takes it back.

The spec is checked here first (:func:`adaptd.core.policy.parse`, so a typo fails without
a daemon round trip) and again by the daemon, which pushes the new plan to the
job's ranks at once. The setting outlives the job's restarts and, when the daemon
persists settings (``adaptd serve`` with a state database), the daemon's.
``--clear`` returns the job to the policy it would have without an operator's: the
config's ``[jobs]`` policy for it, else the spec its ranks asked for, else the daemon's
default; the new plan is pushed at once too. The daemon's side is
:func:`adaptd.daemon.admin.answers.set_policy`.
"""

from __future__ import annotations

import argparse

from adaptd.commands import _operator
from adaptd.protocol.admin import SetPolicyReply, SetPolicyRequest

HELP = "change a running job's policy, or --clear it (the new plan reaches it at once)"

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
    from adaptd.commands import UsageError
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
