"""The checks the hook's settings share, one message per kind of value.

Each raises ``ValueError`` naming the setting and the value received, in the words
the rest of adaptd uses (``poll_interval must be > 0 seconds, got -1``). Pure: no
TensorFlow, no I/O, so every part (the link, the agreement, the options) may use them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from adaptd.protocol import job as protocol

__all__ = ["check_directory", "check_job", "check_seconds", "check_seconds_or_zero"]


def check_seconds(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a number of seconds > 0."""
    if not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")


def check_seconds_or_zero(name: str, value: Any) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is a number of seconds >= 0."""
    if not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")


def check_directory(directory: Any) -> Path:
    """``directory`` as a Path; ValueError unless it is a non-empty path."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise ValueError(f"directory must be a non-empty path, got {directory!r}")
    return Path(directory)


def check_job(job: Any) -> str:
    """``job``; ValueError unless it is a job id the daemon accepts."""
    try:
        return msgspec.convert(job, protocol.JobId)
    except msgspec.ValidationError:
        raise ValueError(
            f"job must be 1-256 characters of letters, digits and _.:@+- "
            f"(not starting with one of .:@+-), got {job!r}"
        ) from None
