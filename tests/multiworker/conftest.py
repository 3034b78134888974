"""One real 3-worker MultiWorkerMirroredStrategy job for the coordination and
restore-agreement tests (tests/multiworker/coord_worker.py runs every scenario), its
workers forked from the session's zygote (tests/multiworker/forked.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from multiworker.cluster import HERE
from multiworker.forked import ForkedCluster

WORKERS = 3
STEPS = 1000
#: The step at which the last worker's process ends in the "dead" scenario.
DIES_AT = 300
#: Steps the durable destination of the restore scenarios holds.
DEST_STEPS = (20, 30)


def _destination(root: Path) -> str:
    """A durable destination (a mounted path) holding DEST_STEPS, uploaded the way the
    daemon's replicator does."""
    from adaptd.tiers.replica import Replica
    from multiworker.restore_scenarios import write_checkpoint

    staging = root / "staging"
    for step in DEST_STEPS:
        write_checkpoint(staging, step)
    url = str(root / "dest" / "restore-pull")
    replica = Replica(url)
    for step in DEST_STEPS:
        replica.upload(staging, step, "restore-pull")
    return url


@pytest.fixture(scope="session")
def job(tmp_path_factory: pytest.TempPathFactory, zygote: Any) -> list[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("multiworker")
    env = {
        "STEPS": str(STEPS),
        "SEED": "12",
        "ADAPTD_TEST_LOG": "INFO",
        "RESTORE_ROOT": str(workdir / "restore"),
        "RESTORE_DEST": _destination(workdir),
    }
    scenarios = ["facade", "lockstep", "free", "restore", "dead"]
    script = HERE / "coord_worker.py"
    with ForkedCluster(zygote, workdir, WORKERS, script, scenarios, env=env) as cluster:
        return cluster.wait_ok(timeout=300)
