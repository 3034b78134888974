"""The daemon's log lines: one ``key=value`` line per event, and a limit on repeats.

Every part of the daemon logs through :func:`logfmt`, so a line can be grepped and
parsed the same way whoever wrote it (``event=plan job=a seq=2 reason="every 50
steps"``). :class:`Throttle` keeps a fault that repeats (a flood of bad frames, a
sink failing on every event) from filling the journal: the first few are logged,
then every 1000th.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["Throttle", "logfmt"]


def logfmt(event: str, **fields: object) -> str:
    """One structured log line: ``event=plan job=a seq=2 reason="every 50 steps"``.

    ``None`` is written ``-``, floats with six significant digits; a value that is
    empty or holds a space, quote, ``=`` or newline is quoted and escaped.
    """
    parts = [f"event={event}"]
    for key, value in fields.items():
        if value is None:
            text = "-"
        elif isinstance(value, float):
            text = f"{value:.6g}"
        else:
            text = str(value)
        if not text or any(c in text for c in ' "=\n'):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


class Throttle:
    """Says whether to log the n-th occurrence of a key: the first ``first``, then
    every ``every``-th."""

    def __init__(self, first: int = 5, every: int = 1000) -> None:
        self.first, self.every = first, every
        self.seen: Counter[str] = Counter()

    def __call__(self, key: str) -> bool:
        self.seen[key] += 1
        n = self.seen[key]
        return n <= self.first or n % self.every == 0
