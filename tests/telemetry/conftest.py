"""Fixtures of the telemetry tests: a recorded host's procfs, read by psutil itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

#: /proc of a recorded 8-GPU host (meminfo, loadavg, diskstats, mountinfo, mountstats).
GPUHOST = Path(__file__).resolve().parents[1] / "fixtures" / "proc" / "gpuhost"


@pytest.fixture
def procfs(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], Path]:
    """Point psutil at a recorded procfs tree for this test: ``procfs(path)``.

    ``psutil.PROCFS_PATH`` is psutil's own setting for where procfs is mounted, so
    psutil's real parsers read the recorded files (restored after the test).
    """

    def use(path: Path) -> Path:
        monkeypatch.setattr(psutil, "PROCFS_PATH", str(path))
        return path

    return use
