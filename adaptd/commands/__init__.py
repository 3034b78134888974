"""One module per ``adaptd`` subcommand, and the one table that names them.

Adding a command is a module plus its line in :data:`COMMANDS`, as adding a policy is a
module plus its entry point. Every command module defines

- ``HELP``: one line, the command's help in ``adaptd --help`` (read from here only);
- ``configure(parser)``: its arguments;
- ``run(args) -> int``: what it does, returning the exit status.

An *operator command* (one that asks the running daemon, on its admin socket) sends a
:class:`adaptd.protocol.admin.Request` and shows the daemon's
:class:`~adaptd.protocol.admin.Reply` (``_operator.call``); that is all it knows of the
daemon. The daemon's side of it is its entry in the daemon's table,
:data:`adaptd.daemon.admin.commands.OPERATOR_COMMANDS` (the answers are in
:mod:`adaptd.daemon.admin.answers`): the daemon imports no command, and an operator
command reaches it only on its socket.

The CLI (:mod:`adaptd.cli`) reads :data:`COMMANDS`. A module is imported only when its
command runs (or for the list in ``adaptd --help``), so it imports what is heavy inside
``run``: ``adaptd status`` never pays for scipy or TensorFlow.
"""

from __future__ import annotations

__all__ = ["COMMANDS", "UsageError"]


class UsageError(Exception):
    """A problem the user can fix; printed as one line, exit status 2 (by
    :func:`adaptd.cli.main`, which also names it ``adaptd.cli.UsageError``). Defined here,
    beside the table, so that a command module never imports the CLI above it."""


#: Command name -> the module that is the command.
COMMANDS: dict[str, str] = {
    "serve": "adaptd.commands.serve",
    "status": "adaptd.commands.status",
    "history": "adaptd.commands.history",
    "save-now": "adaptd.commands.save_now",
    "drain": "adaptd.commands.drain",
    "set-policy": "adaptd.commands.set_policy",
    "pause": "adaptd.commands.pause",
    "resume": "adaptd.commands.resume",
    "simulate": "adaptd.commands.simulate",
    "report": "adaptd.commands.report",
    "verify": "adaptd.commands.verify",
    "restore": "adaptd.commands.restore",
    "policies": "adaptd.commands.policies",
    "demo": "adaptd.commands.demo",
}
