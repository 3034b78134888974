"""The checks the hook's settings share, one message per kind of value.

Each raises ``ValueError`` naming the setting and the value received, in the words
the rest of adaptd uses (``poll_interval must be > 0 seconds, got -1``). Pure: no
TensorFlow, no I/O, so every part (the link, the agreement, the options) may use them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_seconds", "check_seconds_or_zero"]


def check_seconds(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a number of seconds > 0."""
    if not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")


def check_seconds_or_zero(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a number of seconds >= 0."""
    if not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")
