"""The operator commands this daemon answers, read from the one table of commands.

:class:`OperatorCommands` imports the modules of :data:`adaptd.commands.COMMANDS` when the
daemon is built and keeps those that are operator commands (``REQUEST``, ``REPLY`` and
``answer``: see :mod:`adaptd.commands`): the admin protocol's requests this daemon
accepts are their ``REQUEST`` types (one :class:`~adaptd.protocol.admin.RequestDecoder`
over them), and each is answered by its module's ``answer``. A command is added to the
daemon by adding it to the table, nowhere else.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType

from adaptd.commands import COMMANDS
from adaptd.daemon.admin.context import AdminContext
from adaptd.protocol import admin

__all__ = ["Answer", "CommandError", "OperatorCommands"]

#: A command's daemon side: its request and the daemon's context -> the reply (``None``:
#: sent later). Raises :class:`~adaptd.protocol.admin.AdminError` to refuse.
Answer = Callable[[admin.Request, AdminContext], "admin.Reply | None"]


class CommandError(Exception):
    """The table of commands names a module that is not a usable operator command."""


class OperatorCommands:
    """Request type -> its command's ``answer``, and the decoder of those requests."""

    def __init__(self, answers: Mapping[type[admin.Request], Answer]) -> None:
        self.answers = dict(answers)
        self.decoder = admin.RequestDecoder(self.answers)

    @classmethod
    def from_table(cls, table: Mapping[str, str] | None = None) -> OperatorCommands:
        """The operator commands of ``table`` (default :data:`adaptd.commands.COMMANDS`,
        read now). Raises :class:`CommandError` for a module that cannot be imported, or
        two commands that answer the same request."""
        answers: dict[type[admin.Request], Answer] = {}
        where: dict[type[admin.Request], str] = {}
        for name, module_name in (COMMANDS if table is None else table).items():
            module = _load(name, module_name)
            req = getattr(module, "REQUEST", None)
            if req is None:
                continue  # not an operator command (or one that reuses another's request)
            answer = getattr(module, "answer", None)
            if not (isinstance(req, type) and issubclass(req, admin.Request)) or answer is None:
                raise CommandError(
                    f"command {name!r} ({module_name}): REQUEST must be an "
                    "adaptd.protocol.admin.Request subclass, answered by answer(request, ctx)"
                )
            if req in answers:
                raise CommandError(
                    f"commands {where[req]!r} and {name!r} both answer {req.__name__}"
                )
            answers[req], where[req] = answer, name
        return cls(answers)

    def decode(self, frame: bytes) -> admin.Request:
        """One of these commands' requests; raises :class:`AdminError`."""
        return self.decoder.decode(frame)

    def answer(self, req: admin.Request, ctx: AdminContext) -> admin.Reply | None:
        return self.answers[type(req)](req, ctx)


def _load(name: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"command {name!r}: cannot import {module_name}: {exc}") from None
