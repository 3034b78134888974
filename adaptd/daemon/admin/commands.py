"""The operator requests this daemon answers: one table, request type -> its answer.

:data:`ANSWERS` names, for each request of the admin protocol, the function that answers
it in the daemon (:mod:`adaptd.daemon.admin.answers`). :class:`OperatorCommands` is that
table as the admin handler uses it: one :class:`~adaptd.protocol.admin.RequestDecoder`
over its request types (a request of any other type is refused as ``invalid``) and the
answer of each. The command line's side of an operator command (:mod:`adaptd.commands`)
is not read here: the two meet only on the admin socket, through the request and reply
types of :mod:`adaptd.protocol.admin`, so the daemon imports no command.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from adaptd.daemon.admin import answers
from adaptd.daemon.admin.context import AdminContext
from adaptd.protocol import admin

__all__ = ["ANSWERS", "Answer", "CommandError", "OperatorCommands"]

#: A command's daemon side: its request and the daemon's context -> the reply (``None``:
#: sent later). Raises :class:`~adaptd.protocol.admin.AdminError` to refuse.
Answer = Callable[[admin.Request, AdminContext], "admin.Reply | None"]

#: Request type -> the function that answers it: what the daemon's admin socket accepts.
ANSWERS: dict[type[admin.Request], Answer] = {
    admin.StatusRequest: answers.status,
    admin.HistoryRequest: answers.history,
    admin.SaveNowRequest: answers.save_now,
    admin.DrainRequest: answers.drain,
    admin.SetPolicyRequest: answers.set_policy,
    admin.PauseRequest: answers.pause,  # pause and resume: one request, `paused` says which
}


class CommandError(Exception):
    """The table of answers holds an entry that is not a request type and a function."""


class OperatorCommands:
    """Request type -> its answer, and the decoder of those requests."""

    def __init__(self, answers: Mapping[type[admin.Request], Answer]) -> None:
        self.answers = dict(answers)
        self.decoder = admin.RequestDecoder(self.answers)

    @classmethod
    def from_table(
        cls, table: Mapping[type[admin.Request], Answer] | None = None
    ) -> OperatorCommands:
        """The operator commands of ``table`` (default :data:`ANSWERS`, read now). Raises
        :class:`CommandError` for a key that is no :class:`~adaptd.protocol.admin.Request`
        subclass, or an answer that cannot be called."""
        table = ANSWERS if table is None else table
        for req, answer in table.items():
            if not (isinstance(req, type) and issubclass(req, admin.Request)):
                raise CommandError(
                    f"{req!r} in the table of answers: the key must be an "
                    "adaptd.protocol.admin.Request subclass"
                )
            if not callable(answer):
                raise CommandError(
                    f"{req.__name__} is answered by {answer!r}: it must be a function "
                    "answer(request, ctx) -> reply"
                )
        return cls(table)

    def decode(self, frame: bytes) -> admin.Request:
        """One of these commands' requests; raises :class:`AdminError`."""
        return self.decoder.decode(frame)

    def answer(self, req: admin.Request, ctx: AdminContext) -> admin.Reply | None:
        return self.answers[type(req)](req, ctx)
