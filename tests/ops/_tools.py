"""Helpers for the operations tests: the repository root and the Debian tools they run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    """The path of a command-line tool, or skip with how to install it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed; run scripts/install-test-deps.sh")
    return path


def run(*argv: str | Path, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run a tool, capturing text output; never raises on a non-zero exit."""
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kw,  # type: ignore[arg-type]
    )
