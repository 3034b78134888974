"""How many of the GPUs a job claims its host's failure-rate posterior counts.

A job's hello says how many GPUs each rank uses (``Hello.gpus``) and how many ranks
it has; nothing checks it, and the product weighs in the host's shared posterior
(exposure: GPU-seconds watched without a failure). A job claiming 10,000 GPUs on an
8-GPU host lengthened every other job's interval and, through the fleet, every
other host's. The daemon can check one thing: its host's own GPU count (NVML). So
the exposure it counts for a job is at most:

- ``host_gpus`` for a job whose ranks all talk to this daemon (one rank, or ranks
  agreeing through it): they share this host's GPUs;
- ``host_gpus`` per rank for a job whose ranks span hosts (``agreement =
  "coordination"``): a rank cannot use more GPUs than a host has. Its world size is
  the job's word (the other hosts' ranks are not visible here).

Without a GPU count (no NVML: a CPU host, or a driver that does not answer) the claim
is counted as it is. The job's own M (MTBF ÷ its GPUs) still uses its claim: that
only shortens its own interval.
"""

from __future__ import annotations

__all__ = ["vouched_gpus"]


def vouched_gpus(claimed: int, world_size: int, *, host_gpus: int | None, spans_hosts: bool) -> int:
    """The GPUs of a job claiming ``claimed`` in all (``world_size`` ranks) that its
    host's posterior counts (see the module docstring); at least 1."""
    if not host_gpus or host_gpus < 1:
        return max(1, claimed)
    cap = host_gpus * max(1, world_size) if spans_hosts else host_gpus
    return max(1, min(claimed, cap))
