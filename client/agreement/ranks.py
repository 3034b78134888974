"""Which rank of how many this process is, from arguments or the environment.

Order: explicit arguments, then ``RANK``/``WORLD_SIZE`` (torchrun, Slurm wrappers,
most launchers), then ``TF_CONFIG`` (``tf.distribute`` multi-worker: the task
index among chief + workers), else rank 0 of 1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

__all__ = [
    "resolve",
]


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
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ValueError(f"rank must be an integer >= 0, got {r!r}")
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {w!r}")
    if r >= w:
        raise ValueError(f"rank {r} is not below world_size {w}")
    return r, w
