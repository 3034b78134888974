"""``risk``: save at the next step when losing the job becomes likely or is announced.

Triggers: an operator's save-now (``JobState.urgent``), a host drain, an XID event
on one of the job's GPUs, and a degraded GPU (uncorrected ECC errors in the
volatile counter, retired pages or remapped rows pending). A degraded GPU stays
degraded until it is reset, so it gives an urgent save and then saves every
``degraded_every_s`` instead of once per sample. Without a trigger it plans
nothing; compose it with an interval policy (``daly+risk``).
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import Decision, GpuSample, JobState, Snapshot
from adaptd.policies.gpus import job_gpus
from adaptd.policies.interval import anchor, steps_ceil

__all__ = [
    "Risk",
    "degraded_reason",
]


@dataclass(frozen=True)
class Risk:
    """Urgent saves on health events and operator requests (see the module doc)."""

    on_xid: bool = True
    on_ecc: bool = True
    on_drain: bool = True
    degraded_every_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.degraded_every_s > 0:
            raise PolicyError(
                f"risk: degraded_every_s must be > 0 seconds, got {self.degraded_every_s}"
            )

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        if job.urgent:
            return self._urgent(f"requested: {job.urgent}")
        if (
            self.on_drain
            and snapshot.host is not None
            and snapshot.host.draining
            and not job.save_in_flight
            and job.last_save_step != job.step
        ):
            return self._urgent("host is draining")
        gpus = job_gpus(snapshot, job)
        if self.on_xid and not job.save_in_flight:
            xids = sorted({x for g in gpus for x in g.xid_events})
            if xids:
                return self._urgent(f"XID {', '.join(map(str, xids))} on the job's GPUs")
        if self.on_ecc:
            degraded = [g for g in gpus if degraded_reason(g)]
            if degraded:
                why = f"GPU {degraded[0].index}: {degraded_reason(degraded[0])}"
                every = steps_ceil(self.degraded_every_s, job.step_time_s)
                since = job.time - job.last_save_time if job.last_save_time is not None else None
                if not job.save_in_flight and (since is None or since >= self.degraded_every_s):
                    return self._urgent(why)
                if every is not None:
                    return Decision(
                        next_step=max(anchor(job) + every, job.step + 1),
                        every_steps=every,
                        reason=f"{why}: saving every {self.degraded_every_s:g}s",
                        policy="risk",
                        interval_s=self.degraded_every_s,
                    )
        return Decision(next_step=None, reason="no risk event", policy="risk")

    @staticmethod
    def _urgent(reason: str) -> Decision:
        return Decision(next_step=None, urgent=True, reason=reason, policy="risk", tags=("risk",))


def degraded_reason(gpu: GpuSample) -> str | None:
    """Why NVML says this GPU is degraded, or ``None``."""
    if gpu.ecc_uncorrected:
        return f"{gpu.ecc_uncorrected} uncorrected ECC error(s)"
    if gpu.retired_pages_pending:
        return "retired pages pending"
    if gpu.remapped_rows_pending:
        return "remapped rows pending"
    return None
