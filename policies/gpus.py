"""Which GPUs of a snapshot belong to a job.

A rank's hello names its own pid, but the process NVML lists on a GPU may be a
child of it (a launcher that forks its workers). The telemetry sampler therefore
also names the owning jobs of each GPU (``GpuSample.jobs``); a GPU is the job's
when either its job names or its pids say so.
"""

from __future__ import annotations

from adaptd.core.snapshot import GpuSample, JobState, Snapshot

__all__ = [
    "job_gpus",
]


def job_gpus(snapshot: Snapshot, job: JobState) -> tuple[GpuSample, ...]:
    """The GPUs ``job`` runs on: named for it by telemetry, or running one of its pids."""
    pids = set(job.pids)
    return tuple(
        g
        for g in snapshot.gpus
        if job.job in getattr(g, "jobs", ()) or (pids and pids.intersection(g.pids))
    )
