"""The operator commands this daemon answers: one entry each, in one table.

An operator command's daemon side is one :class:`OperatorCommand` in
:data:`OPERATOR_COMMANDS`: its request and reply on the admin protocol
(:mod:`adaptd.protocol.admin`), the function that answers the request here
(:mod:`adaptd.daemon.admin.answers`), and, for a command that acts on a job decided on
another host, the operations it is relayed there as (the job protocol's
:data:`~adaptd.protocol.job.Operation`: ``pause`` travels as ``pause`` or ``resume``),
what the deciding daemon does with each, and whether it travels only signed
(:mod:`adaptd.protocol.relay_auth`: what only an operator may ask). Nothing else names
an operator command in the daemon: the admin socket decodes the requests of this table
and no other (``invalid``), and :class:`~adaptd.daemon.jobs.ops.JobOps` relays, checks
and runs the operations it names. Adding one is its entry plus its answer.

The command line's side of each (:mod:`adaptd.commands`) is not read here: the two meet
only on the admin socket, through the request and reply types, so the daemon imports no
command.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from adaptd.daemon.admin import answers
from adaptd.daemon.admin.context import AdminContext
from adaptd.daemon.jobs.ops import Relayed, RelayedOp
from adaptd.protocol import admin

__all__ = ["OPERATOR_COMMANDS", "Answer", "CommandError", "OperatorCommand", "OperatorCommands"]

#: A command's daemon side: its request and the daemon's context -> the reply (``None``:
#: sent later). Raises :class:`~adaptd.protocol.admin.AdminError` to refuse.
Answer = Callable[[admin.Request, AdminContext], "admin.Reply | None"]


class CommandError(Exception):
    """The table of operator commands holds an entry that cannot be one."""


@dataclass(frozen=True)
class OperatorCommand:
    """One operator command, as the daemon knows it.

    ``request``, ``reply``: its two messages on the admin socket; ``answer``: what
    answers the request here. ``relayed``: the job protocol's operations the answer hands
    to the host deciding a job (``ctx.relay(job, op)``), each with what that host does
    with it; ``signed``: those travel only with the signature of the daemon the operator
    typed at, since a job's own ranks carry them (``save_now`` a job may ask of itself;
    ``set_policy``, ``pause``, ``resume`` override the operator).
    """

    request: type[admin.Request]
    reply: type[admin.Reply]
    answer: Answer
    relayed: Mapping[str, Relayed] = field(default_factory=dict)
    signed: bool = False


#: The operator commands this daemon answers.
OPERATOR_COMMANDS: tuple[OperatorCommand, ...] = (
    OperatorCommand(admin.StatusRequest, admin.StatusReply, answers.status),
    OperatorCommand(admin.HistoryRequest, admin.HistoryReply, answers.history),
    OperatorCommand(admin.SaveNowRequest, admin.SaveNowReply, answers.save_now,
                    relayed={"save_now": answers.relayed_save_now}),
    OperatorCommand(admin.DrainRequest, admin.DrainReply, answers.drain),
    OperatorCommand(admin.SetPolicyRequest, admin.SetPolicyReply, answers.set_policy,
                    relayed={"set_policy": answers.relayed_set_policy}, signed=True),
    # pause and resume: one request (`paused` says which), two relayed operations
    OperatorCommand(admin.PauseRequest, admin.PauseReply, answers.pause,
                    relayed={"pause": answers.relayed_pause, "resume": answers.relayed_resume},
                    signed=True),
)  # fmt: skip


class OperatorCommands:
    """The table as the daemon uses it: request type -> its answer, the decoder of those
    requests, and the relayed operations (:class:`~adaptd.daemon.jobs.ops.JobOps`'s)."""

    def __init__(self, table: Iterable[OperatorCommand]) -> None:
        self.table = tuple(table)
        self.answers: dict[type[admin.Request], Answer] = {c.request: c.answer for c in self.table}
        self.relayed: Mapping[str, RelayedOp] = MappingProxyType({
            op: RelayedOp(run=run, signed=c.signed)
            for c in self.table for op, run in c.relayed.items()
        })  # fmt: skip
        self.decoder = admin.RequestDecoder(self.answers)

    @classmethod
    def from_table(cls, table: Iterable[OperatorCommand] | None = None) -> OperatorCommands:
        """The operator commands of ``table`` (default :data:`OPERATOR_COMMANDS`, read
        now). Raises :class:`CommandError` for an entry whose request or reply is no
        admin message type, whose answer cannot be called, a request or a relayed
        operation named twice, or one signed with nothing relayed."""
        entries = list(OPERATOR_COMMANDS if table is None else table)
        requests: set[type] = set()
        relayed: set[str] = set()
        for c in entries:
            if not isinstance(c, OperatorCommand):
                raise CommandError(f"{c!r} in the table of operator commands is no OperatorCommand")
            name = getattr(c.request, "__name__", repr(c.request))
            if not (isinstance(c.request, type) and issubclass(c.request, admin.Request)):
                raise CommandError(f"{name}: the request must be an adaptd.protocol.admin.Request")
            if not (isinstance(c.reply, type) and issubclass(c.reply, admin.Reply)):
                raise CommandError(f"{name}: the reply must be an adaptd.protocol.admin.Reply")
            if not callable(c.answer):
                raise CommandError(
                    f"{name} is answered by {c.answer!r}: it must be a function "
                    "answer(request, ctx) -> reply"
                )
            if c.request in requests:
                raise CommandError(f"{name} is in the table of operator commands twice")
            if c.signed and not c.relayed:
                raise CommandError(f"{name}: signed, but it names no relayed operation")
            twice = relayed & set(c.relayed)
            if twice:
                raise CommandError(f"{name}: the relayed operation {sorted(twice)[0]!r} is "
                                   "another command's too")  # fmt: skip
            requests.add(c.request)
            relayed |= set(c.relayed)
        return cls(entries)

    def decode(self, frame: bytes) -> admin.Request:
        """One of these commands' requests; raises :class:`AdminError`."""
        return self.decoder.decode(frame)

    def answer(self, req: admin.Request, ctx: AdminContext) -> admin.Reply | None:
        return self.answers[type(req)](req, ctx)
