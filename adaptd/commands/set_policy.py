"""``adaptd set-policy --job J SPEC``: change a running job's policy.

The spec is checked here first (:func:`adaptd.policy.parse`, so a typo fails without
a daemon round trip) and again by the daemon, which pushes the new plan to the
job's ranks at once. The setting outlives the job's restarts and, when the daemon
persists settings (``adaptd serve`` with a state database), the daemon's.
"""

from __future__ import annotations

import argparse

from adaptd.commands import _operator

HELP = "change a running job's policy (the new plan reaches it at once)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", metavar="JOB", required=True, help="the job id")
    parser.add_argument("spec", metavar="SPEC", help="a policy spec, e.g. 'fixed:steps=500'")
    _operator.add_socket_args(parser)


def run(args: argparse.Namespace) -> int:
    from adaptd import admin
    from adaptd import policy as policy_mod
    from adaptd.cli import UsageError

    try:
        policy_mod.parse(args.spec)
    except policy_mod.PolicyError as exc:
        raise UsageError(f"policy spec {args.spec!r}: {exc}") from None
    req = admin.SetPolicyRequest(job=args.job, spec=args.spec)
    reply = _operator.ask("set-policy", args, req, args.answer_timeout)
    if reply is None:
        return 1
    assert isinstance(reply, admin.SetPolicyReply)
    if args.json:
        _operator.print_json(reply)
    elif reply.relayed_to:
        print(f"{reply.job}: policy {reply.policy} relayed to {reply.relayed_to}, which decides it")
    else:
        pushed = f"plan {reply.plan_seq} pushed" if reply.plan_seq else "no live ranks to tell yet"
        print(f"{reply.job}: policy {reply.policy} (was {reply.previous}); {pushed}")
    return 0
