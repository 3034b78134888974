"""A discrete-event simulation of one training run with failures.

It drives a real policy object and a real :class:`~adaptd.core.estimators.JobTracker`
with synthetic snapshots, step reports and save reports, jumping from event to
event (save due, write durable, failure, restart done, storage phase boundary,
end of training) instead of looping over steps.

The model, the same as :func:`adaptd.core.model.waste_fraction`'s: the loop computes
at one step per ``step_time_s``; a save blocks it for ``blocking_s``, then the
write runs asynchronously until ``latency_s`` after the call, during which a
fraction ``slowdown`` of compute is lost; at most one save is in flight (a save
that comes due meanwhile waits for the write to finish and a new decision).
Failures follow a renewal process in wall-clock time and strike anywhere, during
compute, saves and restarts: the job loses the work since its last *durable*
checkpoint (and any write in flight), restarts for ``restore_s`` (again, if a
failure strikes the restart), and resumes from that checkpoint. The first step of
every incarnation (the start and each restart) takes ``first_step_s`` (tracing, an
XLA compile): a warm-up of ``first_step_s − step_time_s`` without progress, then a
normal step.

The tracker hears what the daemon hears from the hook: batches of steps with a
count and a mean (the first report of an incarnation is that one slow step), save
requests and reports, and the restart ended by the first step report after the
job came back (so the restart it learns includes the first step).

Two tiers and just-in-time saves (issues 23, 24; scenarios with ``[checkpoint.local]``,
``process_share``, ``peer_share``): a policy whose decision has ``durable_every`` saves
every time to the local tier (its blocking, latency and slow-down) and, for the saves
:meth:`~adaptd.core.snapshot.Decision.durable_at` names, also to durable storage: the
durable call follows the local blocking, so such a save blocks b₁ + b₂ and its two
writes run at once (their slow-downs add). A policy without ``durable_every`` saves to
durable storage only, as with one tier. A failure is of the process class (the local
tier survives: the job restarts from its newest surviving save, from the local tier in
``[checkpoint.local] restore_s`` when that is the newest, else from durable storage) or
of the host class (the local tier is lost: from the newest durable save, in
``[checkpoint] restore_s``); a host failure during a restart in place sends it to
durable storage. A covered failure (a survivor holds a replica) loses only the step in
progress: the survivors spend ``jit_save_s`` saving the last completed step (overhead)
to the local tier for a process failure with a local tier, else to durable storage, and
the job restarts from it as above; a failure during that save makes the pair an
uncovered failure (a host one if either was). :mod:`adaptd.sim.classes` draws the
classes, :mod:`adaptd.sim.inflight` keeps the writes.

Every second of wall time is accounted to exactly one of useful work, checkpoint
overhead (blocking + slow-down, and just-in-time saves), lost work, restart or warm-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from adaptd.core.estimators import FailureRate, JobTracker
from adaptd.core.failure_rates import FailureClasses
from adaptd.core.model import HOUR
from adaptd.core.policy import Policy
from adaptd.core.snapshot import FleetSample, GpuSample, Snapshot, StorageSample
from adaptd.fleet.history import FleetHistory, draw_history, job_inputs
from adaptd.protocol.job import REPORT_INTERVAL_S
from adaptd.sim.classes import FailureKinds
from adaptd.sim.inflight import Write, Writes
from adaptd.sim.scenario import Scenario

#: Fleet histories are drawn from seed FLEET_SEED + the run's seed: apart from the
#: run's own failure times, the same for every policy of a comparison.
FLEET_SEED = 1_000_003

__all__ = [
    "JOB",
    "PID",
    "TARGET",
    "FailureClock",
    "RunResult",
    "run",
]

JOB = "sim"
TARGET = "sim-storage"
PID = 1
#: Seconds between the hook's step reports (its default ``report_interval``).
REPORT_S = REPORT_INTERVAL_S


@dataclass(frozen=True)
class RunResult:
    """What one simulated run spent its wall time on (seconds)."""

    wall_s: float
    useful_s: float
    checkpoint_overhead_s: float
    lost_work_s: float
    restart_s: float
    warmup_s: float  # the first steps' time beyond a normal step, once per incarnation
    saves: int
    failures: int
    local_saves: int = 0  # of ``saves``, those that stayed in the local tier
    jit_saves: int = 0  # just-in-time saves made after covered failures
    hang_s: float = 0.0  # waiting on hung jobs until the hangs were found
    hangs: int = 0  # of ``failures``, those that were hangs

    @property
    def goodput(self) -> float:
        return self.useful_s / self.wall_s

    @property
    def waste_s(self) -> float:
        return self.wall_s - self.useful_s


class FailureClock:
    """Failure times of one seed, the same whichever policy runs (common random numbers)."""

    CHUNK = 256

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self._trace = list(scenario.trace) if scenario.trace is not None else None
        self._rng = np.random.default_rng([seed, 0xADA])
        self._scn = scenario
        self._buf: list[float] = []
        self._i = 0
        self._t = 0.0

    def _refill(self) -> None:
        s = self._scn
        if s.distribution == "weibull":
            gaps = s.weibull_scale_s * self._rng.weibull(s.weibull_shape, self.CHUNK)
        else:
            gaps = self._rng.exponential(s.job_mtbf_s, self.CHUNK)
        times = self._t + np.cumsum(gaps)
        self._t = float(times[-1])
        self._buf = times.tolist()
        self._i = 0

    def next(self) -> float:
        """The next failure time (``inf`` when a trace is exhausted)."""
        if self._trace is not None:
            return self._trace.pop(0) if self._trace else math.inf
        if self._i >= len(self._buf):
            self._refill()
        t = self._buf[self._i]
        self._i += 1
        return t


class _Run:
    def __init__(
        self, scenario: Scenario, policy: Policy, seed: int, fleet: FleetHistory | None = None
    ) -> None:
        self.s = scenario
        self.policy = policy
        self.clock = FailureClock(scenario, seed)
        self.kinds = FailureKinds(scenario, seed)
        self.hang_draws = np.random.default_rng([seed, 0x4A46])  # which failures are hangs
        self.fleet: FleetSample | None = None
        rate = None
        if fleet is not None:  # the job starts from what its fleet learned (docs/simulator.md)
            record = draw_history(
                fleet,
                gpu_mtbf_s=scenario.mtbf_gpu_hours * HOUR,
                shape=scenario.weibull_shape if scenario.distribution == "weibull" else 1.0,
                seed=FLEET_SEED + seed,
            )
            rate, self.fleet = job_inputs(record, FailureRate(), hosts=fleet.gpus // 8)
        self.classed = scenario.classed  # tell the tracker classes, tiers (else as before)
        self.tracker = JobTracker(
            JOB,
            gpus=scenario.gpus,
            failure_rate=rate,
            local_tier=scenario.local is not None,
            failure_classes=FailureClasses() if self.classed else None,
        )
        self.st = scenario.step_time_s
        self.warm = scenario.warmup_s
        self.warm_end = self.warm  # no progress before this: the first step's extra time
        self.warmup = 0.0
        self.t = 0.0
        self.pos = 0.0  # completed work, in steps
        self.durable = 0  # newest durable checkpoint (step)
        self.local: int | None = None  # newest checkpoint in the local tier (None: none)
        self.writes = Writes()
        self.overhead = self.lost = self.restart = 0.0
        self.saves = self.failures = self.local_saves = self.jit_saves = 0
        self.hang_s, self.hangs = 0.0, 0
        self.next_fail = self.clock.next()
        self.reported_step = 0
        self.run_wall = 0.0  # compute wall time since the last step report
        self.due = scenario.steps
        self.due_kind = "single"  # of the save due: "single" (durable), "local", "both"
        self.first_report = True
        self.report_at: int | None = None  # the step of the report after the first one
        self.vanished_at: float | None = None
        self.back_from = "durable"  # the tier the job restarted from
        self.overrides = {"jit_save_s": scenario.jit_save_s} if scenario.peer_share else {}
        self._parts: dict[
            tuple[float, bool, float], tuple[tuple[GpuSample, ...], tuple[StorageSample, ...]]
        ] = {}

    # ---------------------------------------------------------------- progress

    def time_to(self, target: float) -> float:
        need = target - self.pos
        if need <= 0:
            return self.t
        # a warm-up has no write in flight: a failure cancels it and nothing is due in it
        return self.writes.time_to(max(self.t, self.warm_end), need, self.st)

    def advance(self, t_new: float) -> None:
        dt = t_new - self.t
        if dt <= 0:
            return
        self.run_wall += dt  # the hook times the warm-up as part of the first step
        if self.warm_end > self.t:
            warm = min(t_new, self.warm_end) - self.t
            self.warmup += warm
            self.t += warm
            dt -= warm
            if dt <= 0:
                return
        lost = self.writes.lost(self.t, t_new)
        self.overhead += lost
        self.pos += (dt - lost) / self.st
        self.t = t_new

    # ---------------------------------------------------------------- tracker I/O

    def report(self) -> None:
        """A step report as the hook sends it: the steps since the last one, their mean.

        The first report of an incarnation holds exactly its first (slow) step, since
        the engine reports at that step's end (``first_report``); like the hook's, it
        says so (``warmup``) and names that step's time as the batch's slowest
        (``max_s``), so the estimator leaves the compile out of the job's pace. The
        hook reports again about a second later (:data:`REPORT_S`), and so does the
        engine (``report_at``): that batch is the first the step time learns from.
        """
        step = int(self.pos + 1e-9)
        count = step - self.reported_step
        if count > 0:
            first = self.reported_step == self.tracker.start_step
            mean = self.run_wall / count
            self.tracker.on_steps(
                self.t,
                step,
                count,
                mean,
                bool(self.writes),
                max_s=max(mean, self.st + self.warm) if first else 0.0,
                warmup=first,
            )
            self.reported_step = step
            self.run_wall = 0.0
            if self.vanished_at is not None:  # the daemon ends a restart at the first report
                down = self.t - self.vanished_at
                if self.classed:
                    self.tracker.on_restart(down, tier=self.back_from)
                else:
                    self.tracker.on_restart(down)
                self.vanished_at = None

    def decide(self) -> None:
        self.report()
        slow = self.writes.slowdown(self.t)
        writing = self.writes.durable_at(self.t)
        _, lf = self.s.factors(self.t)
        key = (slow, writing, lf)
        parts = self._parts.get(key)
        if parts is None:  # the samples take few distinct values: build each once
            parts = self._parts[key] = (
                (GpuSample(index=0, uuid="sim-gpu-0", util_sm=1.0 - slow, pids=(PID,)),),
                (
                    StorageSample(
                        target=TARGET,
                        mountpoint="/sim",
                        # a target slowed down lf-fold has 1 - 1/lf of its capacity taken
                        busy_fraction=1.0 - 1.0 / lf if lf > 1 else 0.0,
                        jobs=(JOB,),
                        writing_jobs=(JOB,) if writing else (),
                    ),
                ),
            )
        snap = Snapshot(time=self.t, gpus=parts[0], storage=parts[1], fleet=self.fleet)
        job = self.tracker.state(time=self.t, storage_target=TARGET, pids=(PID,), **self.overrides)
        d = self.policy.decide(snap, job)
        cur = int(self.pos + 1e-9)
        due = cur + 1 if d.urgent else d.due_after(cur)
        self.due = self.s.steps if due is None else min(due, self.s.steps)
        if self.s.local is None or d.durable_every is None:
            self.due_kind = "single"
        else:
            self.due_kind = "both" if d.durable_at(self.due, job.durable_anchor) else "local"

    # ---------------------------------------------------------------- events

    def fail(self) -> None:
        """A failure at ``self.t``: lose the work since the newest surviving checkpoint
        (or, covered, the step in progress), restart. The tracker hears the failure as
        the daemon sees it come back: a host failure if it lost its local tier, also to a
        failure during the restart; covered if it resumes from a save just in time."""
        self.report()
        self.failures += 1
        at = self.t
        kind, covered = self.kinds.next()
        if self.s.hang_share and self.hang_draws.random() < self.s.hang_share:
            # a hang: every rank waits, nothing breaks until it is found; then as a
            # failure (the survivors freed, a just-in-time save where it is covered)
            wait = self.s.hang_detection_s
            self.hang_s += wait
            self.hangs += 1
            self.t += wait
        self.writes.clear()
        self.next_fail = self.clock.next()
        if covered and self.t >= self.warm_end:  # in a warm-up there is nothing to save
            kind, covered = self.save_just_in_time(kind)
        if kind == "host":
            self.local = None
        self.vanished_at = at
        while True:  # the restart, again each time a failure strikes it
            step, restore_s, self.back_from = self.restart_point()
            if self.next_fail >= self.t + restore_s:
                break
            self.restart += self.next_fail - self.t
            self.t = self.next_fail
            self.failures += 1
            if self.kinds.next()[0] == "host":  # the job will come back elsewhere
                self.local, kind = None, "host"
            self.next_fail = self.clock.next()
        self.lost += (self.pos - step) * self.st
        if self.classed:
            self.tracker.on_failure(at, kind, covered)
        else:
            self.tracker.on_failure(at)
        self.restart += restore_s
        self.t += restore_s
        self.pos = float(step)
        self.reported_step = step
        self.run_wall = 0.0
        self.warm_end = self.t + self.warm
        if self.classed:  # the hello
            self.tracker.on_resume(self.t, step, tier=self.back_from)
        else:
            self.tracker.on_resume(self.t, step)
        self.first_report = True
        self.report_at = None
        self.decide()

    def restart_point(self) -> tuple[int, float, str]:
        """(step, restart time, tier) of the newest checkpoint that survives."""
        local = self.s.local
        if local is not None and self.local is not None and self.local >= self.durable:
            return self.local, local.restore_s, "local"
        return self.durable, self.s.restore_s, "durable"

    def save_just_in_time(self, kind: str) -> tuple[str, bool]:
        """A survivor saves the last completed step; the step in progress is lost.
        Returns the failure's (class, covered): a failure during the save leaves it
        uncovered, of the host class if either failure was."""
        done = math.floor(self.pos + 1e-9)
        self.lost += (self.pos - done) * self.st
        self.pos = float(done)
        if self.next_fail < self.t + self.s.jit_save_s:
            self.overhead += self.next_fail - self.t
            self.t = self.next_fail
            self.failures += 1
            other, _ = self.kinds.next()
            self.next_fail = self.clock.next()
            return ("host" if "host" in (kind, other) else "process"), False
        self.overhead += self.s.jit_save_s
        self.t += self.s.jit_save_s
        self.jit_saves += 1
        if kind == "process" and self.s.local is not None:
            self.local = done
        else:
            self.durable = done
        return kind, True

    def start_save(self) -> None:
        step, kind = self.due, self.due_kind
        self.pos = float(step)
        self.report()
        bf, lf = self.s.factors(self.t)
        blocking = self.s.blocking_s * bf
        latency = max(self.s.latency_s * lf, blocking)
        local = self.s.local
        if kind == "single":
            self.tracker.on_save_requested(self.t, step)
            total = blocking
        else:
            self.tracker.on_save_requested(self.t, step, durable=kind == "both")
            total = local.blocking_s + (blocking if kind == "both" else 0.0)
        if self.next_fail < self.t + total:
            self.overhead += self.next_fail - self.t
            self.t = self.next_fail
            self.fail()
            return
        self.saves += 1
        call = self.t
        self.overhead += total
        self.t += total
        if kind == "single":
            self.writes.add(Write("durable", step, call + latency, self.s.slowdown, blocking,
                                  latency))  # fmt: skip
        else:  # the local write runs once the loop is free: after both blockings
            lag = blocking if kind == "both" else 0.0
            self.writes.add(Write("local", step, call + lag + local.latency_s, local.slowdown,
                                  local.blocking_s, local.latency_s))  # fmt: skip
            if kind == "both":
                self.writes.add(Write("durable", step, call + local.blocking_s + latency,
                                      self.s.slowdown, blocking, latency))  # fmt: skip
            else:
                self.local_saves += 1
        end = self.writes.next_end()
        if end is not None and end <= self.t:
            self.finish_write()
        else:
            self.decide()

    def finish_write(self) -> None:
        """Every write that has ended by now is complete in its tier; then decide."""
        while (end := self.writes.next_end()) is not None and end <= self.t:
            w = self.writes.pop()
            if w.tier == "local":
                self.local = w.step if self.local is None else max(self.local, w.step)
            else:
                self.durable = w.step
            self.report()
            extra = w.slowdown * (w.latency_s - w.blocking_s)
            figures = {"blocking_s": w.blocking_s, "durable_s": w.latency_s, "extra_step_s": extra}
            if self.s.local is not None:
                self.tracker.on_save_report(self.t, w.step, tier=w.tier, **figures)
            else:
                self.tracker.on_save_report(self.t, w.step, **figures)
        self.decide()

    def run(self) -> RunResult:
        n = self.s.steps
        self.tracker.on_resume(0.0, 0)
        self.decide()
        while True:
            t_end = self.time_to(n)
            events = [(self.next_fail, 0), (t_end, 1)]
            end = self.writes.next_end()
            if end is not None:
                events.append((end, 2))
            t_due = self.time_to(self.due)
            tiers = {"single": ("durable",), "local": ("local",)}.get(
                self.due_kind, ("local", "durable")
            )
            busy = self.writes.busy_until(tiers)
            if self.due < n and (busy is None or t_due >= busy):
                events.append((t_due, 3))
            if self.first_report:
                events.append((self.time_to(math.floor(self.pos + 1e-9) + 1), 4))
            elif self.report_at is not None and self.report_at < n:
                events.append((self.time_to(self.report_at), 6))
            boundary = self.s.next_boundary(self.t)
            if boundary < math.inf:
                events.append((boundary, 5))
            t_next, kind = min(events)
            self.advance(t_next)
            if kind == 0:
                self.fail()
            elif kind == 1:
                self.pos = float(n)
                break
            elif kind == 2:
                self.finish_write()
            elif kind == 3:
                self.start_save()
            elif kind == 4:
                self.first_report = False
                self.decide()
                steps = max(1, math.ceil(REPORT_S / self.st))
                self.report_at = math.floor(self.pos + 1e-9) + steps
            elif kind == 6:
                self.report_at = None
                self.decide()
            else:
                self.decide()
        return RunResult(
            wall_s=self.t,
            useful_s=n * self.st,
            checkpoint_overhead_s=self.overhead,
            lost_work_s=self.lost,
            restart_s=self.restart,
            warmup_s=self.warmup,
            saves=self.saves,
            failures=self.failures,
            local_saves=self.local_saves,
            jit_saves=self.jit_saves,
            hang_s=self.hang_s,
            hangs=self.hangs,
        )


def run(
    scenario: Scenario, policy: Policy, seed: int, fleet: FleetHistory | None = None
) -> RunResult:
    """Simulate one run of ``scenario`` under ``policy`` with failure seed ``seed``;
    with ``fleet``, the job starts from a fleet history drawn from the scenario's own
    failure distribution (seeded by ``seed`` too)."""
    return _Run(scenario, policy, seed, fleet).run()
