"""Which rank of how many this process is, from arguments or the environment.

Order: explicit arguments, then ``RANK``/``WORLD_SIZE`` (torchrun, Slurm wrappers,
most launchers), then ``TF_CONFIG`` (``tf.distribute`` multi-worker: the task
index among chief + workers), else rank 0 of 1. :class:`Identity` is the answer as
the hook's parts get it: the job, this rank, the job's size and this host.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "Identity",
    "check_place",
    "resolve",
]


@dataclass(frozen=True)
class Identity:
    """Who a hook is: rank ``rank`` of the ``world_size`` ranks of job ``job``, on host
    ``host`` (named in messages and in who decided a plan; "" where it is not told)."""

    job: str
    rank: int = 0
    world_size: int = 1
    host: str = ""

    def __post_init__(self) -> None:
        check_place(self.rank, self.world_size)

    @classmethod
    def here(cls, job: str, rank: int | None = None, world_size: int | None = None) -> Identity:
        """This process: ``rank``/``world_size`` as :func:`resolve` finds them, this host.

        Raises ValueError naming the bad argument or environment variable."""
        r, w = resolve(rank, world_size)
        return cls(job, r, w, socket.gethostname())

    @property
    def chief(self) -> bool:
        """Rank 0: the one that decides a job's plan and tidies its directory."""
        return self.rank == 0


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def resolve(
    rank: int | None = None,
    world_size: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[int, int]:
    """``(rank, world_size)``; raises ValueError naming the bad argument or variable."""
    env = os.environ if environ is None else environ
    env_rank = env_world = None
    if "RANK" in env:
        env_rank = _int("RANK", env["RANK"])
    if "WORLD_SIZE" in env:
        env_world = _int("WORLD_SIZE", env["WORLD_SIZE"])
    if (env_rank is None or env_world is None) and env.get("TF_CONFIG"):
        try:
            config = json.loads(env["TF_CONFIG"])
            cluster = config.get("cluster", {})
            task = config.get("task", {})
            members = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
            index = int(task.get("index", 0))
            if task.get("type") == "worker" and cluster.get("chief"):
                index += len(cluster["chief"])
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"environment variable TF_CONFIG is not valid: {exc}") from None
        if env_rank is None:
            env_rank = index
        if env_world is None and members:
            env_world = members
    r = rank if rank is not None else (env_rank if env_rank is not None else 0)
    w = world_size if world_size is not None else (env_world if env_world is not None else 1)
    check_place(r, w)
    return r, w


def check_place(rank: object, world_size: object) -> None:
    """Raise ValueError unless ``rank`` is an integer in ``0 .. world_size - 1``."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if rank >= world_size:
        raise ValueError(f"rank {rank} is not below world_size {world_size}")
