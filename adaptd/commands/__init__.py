"""One module per ``adaptd`` subcommand, and the one table that names them.

Adding a command is a module plus its line in :data:`COMMANDS`, as adding a policy is a
module plus its entry point. Every command module defines

- ``HELP``: one line, the command's help in ``adaptd --help`` (read from here only);
- ``configure(parser)``: its arguments;
- ``run(args) -> int``: what it does, returning the exit status.

An *operator command* (one that asks the running daemon, on its admin socket) also
defines its two ends of the admin protocol and its daemon side:

- ``REQUEST`` and ``REPLY``: a :class:`adaptd.protocol.admin.Request` and a
  :class:`~adaptd.protocol.admin.Reply` subclass, each with a tag (``op``) of its own;
  the built-in commands' are in :mod:`adaptd.protocol.admin`, a new command may define
  its own in its module;
- ``answer(request, ctx) -> reply | None``: run by the daemon for each ``REQUEST``, in
  its loop, with an :class:`adaptd.daemon.admin.context.AdminContext` (the daemon's
  parts and who asked); ``None`` when the reply is sent later (``drain``). An
  :class:`~adaptd.protocol.admin.AdminError` becomes the caller's error reply.

The CLI (:mod:`adaptd.cli`) and the daemon's admin handler
(:mod:`adaptd.daemon.admin.commands`) both read :data:`COMMANDS`: the daemon answers the
requests of the operator commands in it, and nothing else. A module is imported only
when its command runs (or for the list in ``adaptd --help``, or by the daemon at start
for its operator commands), so it imports what is heavy inside ``run``: ``adaptd status``
never pays for scipy or TensorFlow.
"""

from __future__ import annotations

__all__ = ["COMMANDS"]

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
