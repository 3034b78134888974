"""What the daemon tells a rank that asks for its job's configured settings.

A rank whose hook has no local tier of its own asks its daemon before it restores
(:class:`~adaptd.protocol.job.AskConfig`); the daemon answers from its config's
``[jobs."ID"]`` entries (exact id first, then the matching globs:
:meth:`adaptd.config.loader.Config.job_override`) with a
:class:`~adaptd.protocol.job.JobConfig`, so an operator turns on a job's local tier
(docs/tiers.md) without a change to its training script. The answer needs no hello:
it comes before the run has anything to say in one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from adaptd.protocol import job as p

__all__ = ["JobConfigSource", "Overrides", "from_overrides", "nothing"]

#: The config's settings for a job id, as the answer to its ranks.
JobConfigSource = Callable[[str], p.JobConfig]


class _Override(Protocol):
    local_tier: str | None
    local_tier_memory: float | None
    local_tier_disk: str | None


#: A job id's merged ``[jobs."…"]`` entry (None: no entry matches it).
Overrides = Callable[[str], "_Override | None"]


def nothing(job: str) -> p.JobConfig:
    """A daemon without a config configures nothing."""
    return p.JobConfig(v=p.VERSION, job=job)


def from_overrides(override: Overrides) -> JobConfigSource:
    """The answers from the config's entries (``override``: ``Config.job_override``)."""

    def source(job: str) -> p.JobConfig:
        o = override(job)
        if o is None or o.local_tier is None:
            return nothing(job)
        return p.JobConfig(
            v=p.VERSION,
            job=job,
            local_tier=o.local_tier,
            local_tier_memory=o.local_tier_memory,
            local_tier_disk=o.local_tier_disk or "",
        )

    return source
