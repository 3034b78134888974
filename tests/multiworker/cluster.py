"""The multi-worker tests' workers: :class:`adaptd.sim.local_cluster.Cluster`, run from the
repository root so that a worker script can import ``tests.*``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaptd.sim import local_cluster

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


class Cluster(local_cluster.Cluster):
    def __init__(self, *args: Any, cwd: Path = REPO, **kwargs: Any) -> None:
        super().__init__(*args, cwd=cwd, **kwargs)


__all__ = ["HERE", "REPO", "Cluster"]
