"""Fixtures for the daemon tests; the helper classes live in daemon_helpers.py."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import DaemonProc


@pytest.fixture
def daemon_proc(short_dir: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(short_dir / "adaptd.sock")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[DaemonProc]:
    """One daemon for the tests that only need one to talk to (each uses its own job ids)."""
    d_dir = Path(tempfile.mkdtemp(prefix="adt-", dir="/tmp"))
    d = DaemonProc(d_dir / "adaptd.sock")
    yield d
    d.stop()
    shutil.rmtree(d_dir, ignore_errors=True)
