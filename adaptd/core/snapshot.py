"""The facts a policy decides on, and the decision it returns.

Samplers and reports fill a frozen, timestamped :class:`Snapshot`; the job's own
figures live in a frozen :class:`JobState`. A policy is a pure function of the two
(see :mod:`adaptd.core.policy`), so the daemon, the client's embedded fallback and the
simulator can all run the same policy objects unchanged.

Every figure that may be unknown is typed ``X | None``: ``None`` means "not
measured (yet)", never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = [
    "REPLAN_TOLERANCE",
    "Decision",
    "Figure",
    "GpuSample",
    "HostSample",
    "JobState",
    "Reading",
    "Snapshot",
    "StorageSample",
    "same_saves",
]


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU as NVML saw it at the snapshot's time."""

    index: int
    uuid: str
    name: str = ""
    util_sm: float | None = None  # fraction 0..1
    util_mem: float | None = None  # fraction 0..1
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    throttle_reasons: int | None = None  # NVML clocksThrottleReasons bit mask
    ecc_corrected: int | None = None  # volatile counts
    ecc_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    xid_events: tuple[int, ...] = ()  # XID codes seen since the previous sample
    pids: tuple[int, ...] = ()  # compute processes on this GPU
    jobs: tuple[str, ...] = ()  # jobs owning those processes (a pid or a parent of it)


@dataclass(frozen=True, slots=True)
class StorageSample:
    """One storage target (a mount) over the last sampling interval."""

    target: str  # stable id, e.g. the mount point
    mountpoint: str
    fstype: str = ""
    device: str | None = None  # block device for local disks, None for NFS/tmpfs
    write_bytes_per_s: float | None = None
    write_iops: float | None = None
    busy_fraction: float | None = None  # 0..1
    write_latency_s: float | None = None  # mean per write op
    jobs: tuple[str, ...] = ()  # jobs whose checkpoint directory lives here
    writing_jobs: tuple[str, ...] = ()  # jobs with a save in flight on this target
    # the operator's limit of jobs saving here at once ([storage."NAME"]
    # max_concurrent_saves); None: the policy's own setting
    max_writers: int | None = None
    # The fleet's write slots on this target (adaptd.fleet), set only while the daemon
    # coordinates the target with other hosts and etcd answers: the fleet-wide cap, and
    # this host's jobs holding a slot now. None: decide locally (a local disk, no
    # [fleet], or etcd out of reach).
    fleet_slots: int | None = None
    fleet_holding: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HostSample:
    """Host-wide figures."""

    mem_available_bytes: int | None = None
    mem_total_bytes: int | None = None
    cpu_load: float | None = None  # 1-minute load average / cores
    draining: bool = False  # the host is being drained (operator or shutdown)


@dataclass(frozen=True, slots=True)
class FleetSample:
    """What the fleet (daemons sharing etcd, :mod:`adaptd.fleet`) knows, when it answers.

    ``failure_shape`` is the Weibull shape fitted to the fleet's failure times
    (posterior median) and ``failure_shape_high`` the upper end of its 90% credible
    interval; ``None`` until the fleet has seen enough failures.
    """

    hosts: int = 0
    failure_shape: float | None = None
    failure_shape_high: float | None = None

    @property
    def bursty(self) -> bool:
        """Failures are credibly Weibull with shape < 1 (the hazard falls with age)."""
        return self.failure_shape_high is not None and self.failure_shape_high < 1.0


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure of a :class:`Reading`. ``name`` is snake_case and ends in its base unit
    (``some_avg10_ratio``, ``stall_seconds``: it names the figure in the metrics too);
    ``value`` is ``None`` when it was not measured this time."""

    name: str
    value: float | None
    help: str = ""


@dataclass(frozen=True, slots=True)
class Reading:
    """What a telemetry source without a field of its own in the snapshot saw: its
    figures, under the name it is registered by (``adaptd.telemetry.source``)."""

    source: str
    figures: tuple[Figure, ...] = ()

    def get(self, name: str) -> float | None:
        """The value of the figure ``name`` (``None``: unknown or not measured)."""
        return next((f.value for f in self.figures if f.name == name), None)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything observed about the host at one moment.

    ``time`` is a monotonic clock reading in seconds; policies compare times only
    with other fields of the same snapshot/job state, never with a clock.

    ``gpus``, ``storage`` and ``host`` are the built-in sources' figures; every other
    telemetry source's are a :class:`Reading` in ``readings`` (:meth:`reading`,
    :meth:`figure`), so a new source needs no field here.
    """

    time: float
    gpus: tuple[GpuSample, ...] = ()
    storage: tuple[StorageSample, ...] = ()
    host: HostSample | None = None
    fleet: FleetSample | None = None  # None: no fleet, or etcd out of reach
    readings: tuple[Reading, ...] = ()

    def reading(self, source: str) -> Reading | None:
        """What the telemetry source ``source`` saw, or ``None`` (no such source, or it
        failed this time)."""
        return next((r for r in self.readings if r.source == source), None)

    def figure(self, source: str, name: str) -> float | None:
        """One figure of a source's reading (``None``: not known)."""
        found = self.reading(source)
        return found.get(name) if found is not None else None

    def with_reading(self, reading: Reading) -> Snapshot:
        """This snapshot with ``reading`` (replacing an earlier one of its source)."""
        others = tuple(r for r in self.readings if r.source != reading.source)
        return replace(self, readings=(*others, reading))

    def storage_for(self, target: str | None) -> StorageSample | None:
        """The sample for ``target``, or ``None`` when it is unknown."""
        if target is None:
            return None
        for s in self.storage:
            if s.target == target:
                return s
        return None

    def gpus_of(self, pids: tuple[int, ...]) -> tuple[GpuSample, ...]:
        """The GPUs that any of ``pids`` runs on."""
        wanted = set(pids)
        return tuple(g for g in self.gpus if wanted.intersection(g.pids))


@dataclass(frozen=True, slots=True)
class JobState:
    """What is known about one job (all its ranks) when a policy decides.

    Steps count *completed* training steps: ``step == 100`` means 100 steps are
    done, and a save "at step 100" captures the state after them.
    """

    job: str
    step: int = 0  # newest completed step reported by any rank
    time: float = 0.0  # monotonic time of that report (same clock as Snapshot.time)
    world_size: int = 1
    gpus: int = 1  # GPUs the job uses (for its failure rate)
    start_step: int = 0  # the step this incarnation resumed from
    step_time_s: float | None = None  # recent mean step time
    last_save_step: int | None = None  # newest save that was requested
    last_save_time: float | None = None
    last_durable_step: int | None = None  # newest save known durable
    save_in_flight: bool = False
    saves: int = 0
    save_cost_s: float | None = None  # δ: blocking + extra step time per save
    save_latency_s: float | None = None  # L: until durable
    restore_s: float | None = None  # R: restart-and-restore time
    mtbf_s: float | None = None  # M for the whole job
    time_since_failure_s: float | None = None  # age since the last failure/restart
    state_bytes: int | None = None
    storage_target: str | None = None
    pids: tuple[int, ...] = ()
    urgent: str | None = None  # reason for an urgent save requested from outside
    paused: bool = False  # an operator holds the job's non-urgent saves (adaptd pause)
    # Two tiers (issue 24; docs/model.md, "Two tiers"). local_tier False: every save goes
    # to durable storage, and save_cost_s, save_latency_s and restore_s are its figures.
    # True: saves go to a local tier (host memory, local disk) and some are made durable;
    # the save_* and restore_s figures stay those of the durable tier, local_* the local's.
    local_tier: bool = False
    local_save_cost_s: float | None = None  # δ₁: blocking + extra step time, local save
    local_latency_s: float | None = None  # L₁: until complete in the local tier
    local_restore_s: float | None = None  # R₁: restart in place from the local tier
    last_durable_save_step: int | None = None  # newest save made (or being made) durable
    # Failure classes (issue 24) and just-in-time saves (issue 23). None: not learned;
    # every failure is then taken for a lost host (mtbf_s), as with one tier.
    process_mtbf_s: float | None = None  # the job's MTBF of failures the host survives
    host_mtbf_s: float | None = None  # the job's MTBF of failures that lose the host
    jit_coverage: float = 0.0  # share of failures a just-in-time save covers
    jit_save_s: float | None = None  # what a just-in-time save takes (None: not measured)

    @property
    def durable_anchor(self) -> int:
        """The newest save made durable in this incarnation, else the step it resumed
        from: what :meth:`Decision.durable_at` counts a two-tier cadence from."""
        d = self.last_durable_save_step
        return d if d is not None else self.start_step


@dataclass(frozen=True, slots=True)
class Decision:
    """A step-addressed save plan.

    ``next_step``: save once ``next_step`` steps are complete (``None``: no save
    planned). ``every_steps``: after that, save every K steps (``None``: no
    repetition until a new decision). ``urgent``: save at the next step boundary,
    whatever the plan says. ``interval_s`` and ``waste`` are the policy's view of
    the interval in seconds and the expected waste fraction, for reporting.

    Two tiers (issue 24): ``durable_every`` = k, every save goes to the local tier and
    every k-th is also made durable (:meth:`durable_at` says which); ``None``: one
    tier, every save durable (as before).
    """

    next_step: int | None
    every_steps: int | None = None
    urgent: bool = False
    reason: str = ""
    policy: str = ""
    interval_s: float | None = None
    waste: float | None = None
    tags: tuple[str, ...] = field(default=())
    durable_every: int | None = None

    def due_after(self, step: int) -> int | None:
        """The first planned save step strictly after ``step``.

        Ranks that receive a plan late still agree on the grid
        ``next_step + i * every_steps``.
        """
        if self.next_step is None:
            return None
        if self.next_step > step:
            return self.next_step
        if not self.every_steps:
            return None
        k = (step - self.next_step) // self.every_steps + 1
        return self.next_step + k * self.every_steps

    def durable_at(self, step: int, last_durable: int) -> bool:
        """Whether the save at ``step`` is to be made durable, the newest save made
        durable (or the step resumed from, when none was since) being ``last_durable``.

        Every save is with one tier (``durable_every`` None), when urgent (a save forced
        by a risk or an operator must survive the host) and without a grid. With two
        tiers, a save is when at least k intervals of ``every_steps`` lie since
        ``last_durable``: on the grid that is every k-th save, and a save deferred off
        the grid (``io_aware``) still counts. Every rank, the hook and the daemon that
        makes the copies agree on the saves and so on this answer, whatever plan
        restated the grid in between.
        """
        if self.durable_every is None or self.urgent or not self.every_steps:
            return True
        return step - last_durable >= self.durable_every * self.every_steps

    def same_plan(self, other: Decision | None) -> bool:
        """True when ``other`` states the same plan: the same first save, grid and
        urgency (whatever its reason or figures). :func:`same_saves` also counts a plan
        restated from a later step as the same."""
        return (
            other is not None
            and self.next_step == other.next_step
            and self.every_steps == other.every_steps
            and self.urgent == other.urgent
            and self.durable_every == other.durable_every
        )


#: A new decision of the same policy whose interval and next save moved by at most this
#: fraction of the current interval keeps the current plan (:func:`same_saves`): the
#: daemon's planner (its ``replan_tolerance`` default) and the chief's embedded policy in
#: a multi-worker job (:meth:`adaptd.client.agreement.agreed.Coordinated.embedded_plan`).
REPLAN_TOLERANCE = 0.05


def same_saves(
    old: Decision | None, new: Decision | None, step: int, tolerance: float = 0.0
) -> bool:
    """True when a job following ``old`` saves at (nearly) the same steps after ``step``
    as under ``new``; ``None`` is "no plan". The one test of "did the plan change",
    for the daemon (whether to push a plan) and the hook (whether to log one).

    A grid policy re-deciding "next at 200, every 100" once step 100 is passed has
    the plan it already has; pushing it again would only be noise. Same grid and the
    same next save after ``step`` means the same saves from now on. With
    ``tolerance`` > 0, an interval and next save that both moved by at most that
    fraction of the old interval also count as the same: an optimal-interval policy
    re-fits its interval to every step-time report, and the waste curve is flat
    near its optimum (10 % off the interval costs well under 1 % more waste), so
    re-planning for it would churn plans once a second for nothing. The durable
    cadence of two tiers (``durable_every``) must match too, within the same fraction.
    """
    old = old if old is not None else Decision(next_step=None)
    new = new if new is not None else Decision(next_step=None)
    if old.same_plan(new):
        return True
    if old.urgent != new.urgent or not _same_cadence(old, new, tolerance):
        return False
    old_next, new_next = old.due_after(step), new.due_after(step)
    if old.every_steps == new.every_steps and old_next == new_next:
        return True
    if tolerance <= 0 or not old.every_steps or not new.every_steps:
        return False
    if old_next is None or new_next is None:
        return False
    slack = tolerance * old.every_steps
    return abs(new.every_steps - old.every_steps) <= slack and abs(new_next - old_next) <= slack


def _same_cadence(old: Decision, new: Decision, tolerance: float) -> bool:
    """Both plans make the same saves durable: one tier each, or k within ``tolerance``·k."""
    a, b = old.durable_every, new.durable_every
    if a is None or b is None:
        return a is b
    return abs(a - b) <= tolerance * a
