"""Tables for the command line: rich on a terminal, aligned plain text when piped.

``status``, ``drain``, ``simulate`` and the telemetry report build their output as a
list of *parts*: :class:`Table` objects and blocks of text. :func:`emit` prints them:
on a terminal rich draws each table (bold header, rule under it, numbers
right-aligned); anywhere else (a pipe, a file,
a test) :func:`plain` gives the layout scripts read: columns left-aligned two spaces
apart, no trailing blanks, no escape codes. Both show the same cell strings, so
:func:`number` is the one place a figure is formatted for them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Union


def number(value: float | int | None, unit: str = "", digits: int = 3) -> str:
    """A figure with ``digits`` significant digits, never in exponent notation.

    ``None`` is ``-``; integers are shown whole; trailing zeros after the point go:
    ``4720.3`` -> ``4720``, ``0.811`` -> ``0.811``, ``0.25`` -> ``0.25``,
    ``40.0`` -> ``40``, ``1.234e-05`` -> ``0.0000123``. Raises ValueError for
    ``digits < 1``.
    """
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value}{unit}"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}{unit}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text}{unit}"


def size(n: float | None, unit: str = "") -> str:
    """Bytes in binary units: ``1.5GiB``, ``12.0MiB``, ``3.1KiB``, ``512B`` (``unit``
    appended: ``/s``); ``None`` is ``-``."""
    if n is None:
        return "-"
    for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f}{name}{unit}"
    return f"{n:.0f}B{unit}"


def duration(seconds: float | None) -> str:
    """A span in the unit a reader takes in at once: ``850ms``, ``2.14s``, ``3.5min``,
    ``1.2h`` (:func:`number`'s 3 significant digits); ``None`` is ``-``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return number(seconds * 1000, "ms")
    if seconds < 120:
        return number(seconds, "s")
    if seconds < 7200:
        return number(seconds / 60, "min", digits=2)
    return number(seconds / 3600, "h", digits=2)


@dataclass(frozen=True)
class Table:
    """A header and rows of cell strings; ``numeric`` names the columns (by index) to
    right-align on a terminal. Raises ValueError when a row's length differs from the
    header's."""

    header: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    numeric: frozenset[int] = field(default_factory=frozenset)
    title: str = ""

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.header):
                raise ValueError(
                    f"row {i} has {len(row)} cells for {len(self.header)} columns: {row!r}"
                )

    def plain(self) -> str:
        """Aligned text: every column as wide as its widest cell, two spaces apart."""
        everything = [self.header, *self.rows]
        widths = [max(len(r[i]) for r in everything) for i in range(len(self.header))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in everything
        )

    def to_rich(self):  # -> rich.table.Table (rich is imported only for a terminal)
        from rich import box
        from rich.table import Table as RichTable
        from rich.text import Text

        t = RichTable(
            title=self.title or None,
            box=box.SIMPLE_HEAD,
            show_edge=False,
            header_style="bold",
            pad_edge=False,
        )
        for i, name in enumerate(self.header):
            t.add_column(name, justify="right" if i in self.numeric else "left", overflow="fold")
        for row in self.rows:
            t.add_row(*(Text(cell) for cell in row))  # cells are text, never rich markup
        return t


#: A block of text (printed as it is) or a table.
Part = Union[str, Table]  # noqa: UP007


def plain(parts: Iterable[Part]) -> str:
    """The parts as plain text, one after another, ending in a newline."""
    return "\n".join(p.plain() if isinstance(p, Table) else p for p in parts) + "\n"


def emit(
    parts: Iterable[Part], file: IO[str] | None = None, *, terminal: bool | None = None
) -> None:
    """Print ``parts`` to ``file`` (stdout): rich tables when it is a terminal
    (``terminal=None`` asks the file), :func:`plain` otherwise."""
    out = file if file is not None else sys.stdout
    if terminal is None:
        isatty = getattr(out, "isatty", None)
        terminal = bool(isatty and isatty())
    if not terminal:
        out.write(plain(parts))
        return
    from rich.console import Console
    from rich.measure import Measurement
    from rich.text import Text

    console = Console(file=out, force_terminal=True, highlight=False)
    for part in parts:
        if isinstance(part, Table):
            table = part.to_rich()
            # never squeeze a table into a narrow terminal (a job id folded over three
            # lines); let the terminal wrap its lines, as it wraps the plain layout
            screen = console.width
            wide = console.options.update_width(1 << 14)
            console.width = max(screen, Measurement.get(console, wide, table).maximum)
            console.print(table)
            console.width = screen
        else:  # text is printed as text: a job called "[bold]" is not rich markup
            console.print(Text(part), soft_wrap=True)
