"""What a setting is, and the walk that checks a config document against settings.

A :class:`Setting` declares one key: how a value in the file is checked and turned
into the value the daemon uses (its *kind*, a :data:`Parse`), its default, its meaning
and how the file writes it back. :class:`Check` walks a parsed TOML document: each
error names the file, the dotted key and the value as TOML wrote it (:func:`show`),
and an unknown key gets a did-you-mean.

The kinds themselves are in :mod:`adaptd.config.kinds`, the settings of the file in
:mod:`adaptd.config.schema`; both build on this module, which builds on neither.
"""

from __future__ import annotations

import difflib
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Check",
    "ConfigError",
    "Parse",
    "Setting",
    "did_you_mean",
    "show",
]


class ConfigError(ValueError):
    """The configuration cannot be used; the message says where, what and what is allowed.

    ``key`` is the dotted path of the offending setting (``""`` for the file itself).
    """

    def __init__(self, message: str, *, key: str = "", source: str = "") -> None:
        prefix = f"{source}: " if source else ""
        super().__init__(prefix + message)
        self.key = key
        self.source = source


def show(v: Any) -> str:
    """A value as TOML writes it, with its TOML type: ``true (boolean)``, ``"x" (string)``."""
    kinds = {bool: "boolean", int: "integer", float: "float", str: "string"}
    kind = next((n for t, n in kinds.items() if type(v) is t), None)
    if kind is None:
        return (
            "a table"
            if isinstance(v, Mapping)
            else "an array"
            if isinstance(v, list)
            else "a value"
        )
    return f"{json.dumps(v)} ({kind})"


def did_you_mean(name: str, choices: Iterable[str], *, ignore_case: bool = False) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to a misspelt ``name``, else ``""``.

    Shared by the config file's checks and the hook's arguments, so a typo gets the
    same hint wherever it is made.
    """
    keys = {(c.lower() if ignore_case else c): c for c in choices}
    near = difflib.get_close_matches(name.lower() if ignore_case else name, list(keys), 1, 0.6)
    return f"; did you mean {keys[near[0]]!r}?" if near else ""


class Check:
    """Walks a document: each error names the file (``source``), the dotted key and the
    value; an unknown key gets a did-you-mean."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{key}: {message}", key=key, source=self.source)

    def table(self, data: Any, where: str, allowed: Sequence[str]) -> Mapping[str, Any]:
        """``data`` as a table whose keys are all ``allowed`` (``where``: its dotted name,
        ``""`` for the top level)."""
        if not isinstance(data, Mapping):
            raise self.fail(where, f"must be a table, got {show(data)}")
        for key in data:
            if key not in allowed:
                dotted = f"{where}.{key}" if where else key
                hint = did_you_mean(key, allowed)
                listed = ", ".join(allowed)
                what = "setting" if where else "section"
                raise self.fail(dotted, f"unknown {what}{hint} (allowed here: {listed})")
        return data

    def read(
        self, settings: Sequence[Setting], where: str, data: Mapping[str, Any], **context: Any
    ) -> dict[str, Any]:
        """The settings' values from table ``data`` (dotted name ``where``), by field:
        parsed where the table has the key, the default where it has not. ``context``
        is handed to parsers and defaults beside the values read so far."""
        values: dict[str, Any] = {}
        for s in settings:
            ctx = {**context, **values}
            if s.key in data:
                values[s.field] = s.parse(self, data[s.key], f"{where}.{s.key}", ctx)
            elif s.required:
                raise self.fail(f"{where}.{s.key}", f"is required{s.required}")
            else:
                values[s.field] = s.default(ctx) if callable(s.default) else s.default
        return values


#: ``parse(check, value, dotted key, context) -> value``: check one value of the file.
Parse = Callable[[Check, Any, str, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Setting:
    """One key of a section or table: how it is checked (``parse``), its ``default``
    (a value, or a function of the settings read before it), its ``meaning`` and the
    default as the docs table says it (``default_text``).

    ``field_name``: the attribute of the config record it sets (default: the key); a
    dotted name reaches into a part of the record (``"settings.host"``).
    ``show``: how the file writes the value back (``serve --check-config``).
    ``required``: a key that must be there (the text says what it is:
    ``" (the target's mount point)"``).
    """

    key: str
    parse: Parse
    default: Any
    meaning: str
    default_text: str
    field_name: str = ""
    show: Callable[[Any], Any] = lambda v: v
    required: str = ""

    @property
    def field(self) -> str:
        return self.field_name or self.key

    def shown(self, record: Any) -> Any:
        """This setting's value in ``record`` (a config record), as the file writes it."""
        return self.show(operator.attrgetter(self.field)(record))
