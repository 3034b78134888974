"""A multi-worker job whose workers are forked from a zygote (tests/faults/zygote.py):
the workers of :class:`adaptd.sim.local_cluster.Cluster` (a ``TF_CONFIG`` on free
localhost ports each, no GPU, ``$RESULT``, every wait with a deadline), without
TensorFlow's import in each (about 3.5 s of CPU per worker); each ends as a process
does (its ``atexit`` handlers, the hook's close among them, run). For tests that start
many short jobs; a forked job's results are bit-identical to a started one's
(tests/multiworker/test_crash_matrix.py's uninterrupted run has the digests of
scripts/exact_resume.py's). Leaving the ``with`` block kills what still runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from faults.zygote import Child, Zygote

from adaptd.sim import local_cluster
from multiworker.cluster import REPO

__all__ = ["ForkedCluster", "cluster_of"]


class ForkedCluster(local_cluster.Cluster):
    """``n`` workers of ``script`` forked from ``zygote``; rank ``r`` writes its results
    to ``<workdir>/rank<r>.json``. ``env`` is added to each worker's environment.
    :attr:`procs` are the zygote's :class:`Child` handles (``poll``, ``pid``,
    ``returncode``, ``kill``); their output is in memory (:meth:`tails`)."""

    def __init__(
        self,
        zygote: Zygote,
        workdir: Path,
        n: int,
        script: Path,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(workdir, n, script, list(args), env=env)
        self.zygote = zygote
        self.procs: list[Any] = []

    def start(self) -> ForkedCluster:
        ports = local_cluster.free_ports(self.n)
        for rank in range(self.n):
            env = {
                "TF_CONFIG": local_cluster.tf_config(ports, rank),
                "CUDA_VISIBLE_DEVICES": "",
                "RESULT": str(self.result_path(rank)),
                **self.env,
            }
            # as a started worker's: the caller's variables, not the test process's
            unset = tuple(k for k in ("ADAPTD_SOCKET", "RANK", "WORLD_SIZE") if k not in env)
            child = self.zygote.spawn(
                list(self.args), script=self.script, env=env, unset=unset, normal_exit=True
            )
            self.procs.append(child)
        return self

    def signal(self, rank: int, sig: int) -> None:
        os.kill(self.procs[rank].pid, sig)

    def kill(self) -> None:
        child: Child
        for child in self.procs:
            with contextlib.suppress(TimeoutError):
                child.kill()

    def tails(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- rank {rank} ---\n" + "\n".join(child.log.lines[-lines:])
            for rank, child in enumerate(self.procs)
        )


def cluster_of(
    zygote: Zygote | None, workdir: Path, n: int, script: Path, env: Mapping[str, str]
) -> local_cluster.Cluster:
    """The job's workers: forked from ``zygote``, or started (``python SCRIPT``, from the
    repository root, as scripts/ and benchmarks/ run them) when there is none."""
    if zygote is None:  # a crash in TensorFlow's C++ prints the Python stacks, as forked
        env = {"PYTHONFAULTHANDLER": "1", **env}
        return local_cluster.Cluster(workdir, n, script, env=env, cwd=REPO)
    return ForkedCluster(zygote, workdir, n, script, env=env)
