"""Helpers for the operations tests: the repository root and the Debian tools they run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The programs the suite runs and their Debian packages (what `make test` installs).
TEST_DEPS = ROOT / "scripts" / "test-deps.txt"


def packages() -> dict[str, str]:
    """``{program: Debian package}`` from scripts/test-deps.txt."""
    out = {}
    for line in TEST_DEPS.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2:
            out[fields[0]] = fields[1]
    return out


def tool(name: str) -> str:
    """The path of a command-line tool, or skip naming the package to install."""
    path = shutil.which(name)
    if path is None:
        package = packages().get(name, name)
        pytest.skip(
            f"{name} is not installed: install the Debian package {package} "
            "(`make test` does so as root or with passwordless sudo)"
        )
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
