"""The daemon's job table: what it knows about each job, indexed, and a read-only view.

**The records.** :class:`Job` and :class:`Rank` are what the daemon knows about one job:
its ranks, who is behind each connection, its plan. A record changes only through its
own methods, each named for the fact that changes it (a rank joined, a save was
counted, a plan was pushed, the job was lost); every other module only reads the
fields. The methods keep the record consistent with itself; which part calls which is
in the module that calls it (the registry: hello, reports, liveness; the planner:
policy and plan; the rounds: the job's agreement rounds).

**The table.** :class:`JobTable` holds the records by id (in order of activity: the
most recently started run last), maps each ZeroMQ peer identity that said hello to its
(job, rank), and keeps the counts that status lines and metrics read without walking
every job: jobs per state, and the active jobs with a save in flight. It decides
nothing: the :class:`~adaptd.daemon.jobs.registry.Registry` changes it, and the parts
that only look read it (through a :class:`RegistryView`, or directly in the daemon's
loop). A table is made before the registry that fills it, so that what reads it (the
service's snapshot, its tick hooks and sinks) can be built first and handed to the
daemon when it is assembled (:mod:`adaptd.daemon.assembly`).

**The view.** The telemetry sampler (which directories and processes belong to which
job), the service's snapshot (which jobs are writing a save), its status line and the
learned parameters it persists all read the table through a :class:`RegistryView`
instead of rebuilding a copy of it from events. Nothing in the view changes the table,
and nothing does I/O. The table is changed only in the daemon's loop, so the view must
be read there too: the sinks, tick hooks and the snapshot source all run in that loop.

**The costs of a save.** δ of a job with several ranks is its slowest rank's cost of
each save. Every rank of a data-parallel job saves at the same step, and the job goes on only
when the slowest of them does, so the cost that sets the job's interval is the
largest of the ranks' costs of one save (blocking time plus extra step time while
the write ran). The registry counts a save once, from the first report of its step;
the other ranks' costs of it then raise that observation
(:meth:`JobTracker.on_slower_rank`):

- the reports of the job's ranks on this daemon (:meth:`SaveCosts.on_report`);
- the job's cost as the chief measured it over every rank (``SaveReport.job_cost_s``,
  ranks that agree on TensorFlow's coordination service);
- another rank's cost forwarded by the chief (:class:`~adaptd.protocol.job.SaveCost`,
  :meth:`SaveCosts.on_save_cost`), kept until its save is counted if it comes first.

:class:`SaveCosts` is one job's part of that (held by its :class:`Job`): which saved
steps were counted, and the forwarded costs of saves not counted yet.

The registry (which reads each hello and report into the table) and liveness (which
finds ranks gone) are the table's writers, one module each above this one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from adaptd import events as ev
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import Policy
from adaptd.core.rounds import JobRounds
from adaptd.core.snapshot import Decision, same_saves
from adaptd.protocol.job import (
    JIT_REASON,
    AgreementKind,
    Hello,
    JobPlan,
    SaveCost,
    SaveReport,
    Steps,
)

__all__ = [
    "COUNTED_STEPS",
    "KEPT_STEPS",
    "HelloKind",
    "Job",
    "JobStateName",
    "JobTable",
    "PeerCred",
    "PendingResume",
    "Rank",
    "RegistryView",
    "SaveCosts",
    "failure_kind",
]


def failure_kind(msg: Hello) -> str | None:
    """The class of the failure a job's new run (its ``msg``) returns from: "process"
    when it found its local tier's copies on this host (the host survived), "host"
    when the tier was gone (a reboot); None for a job without a local tier, whose
    failures are not told apart. A run that returns on another host says hello to
    that host's daemon, where it is a new job: the fleet counts that host failure
    (:mod:`adaptd.fleet.classes`), not this function."""
    if not msg.local_tier:
        return None
    return "process" if msg.local_intact else "host"


JobStateName = Literal["active", "lost", "finished"]
#: How a hello was understood.
HelloKind = Literal["new", "join", "reconnect", "resume", "restart"]


@dataclass(frozen=True)
class PeerCred:
    """Who is really at the other end of a connection, as the kernel or CURVE says.

    For ``ipc://`` ZeroMQ reads ``SO_PEERCRED`` (uid, gid and pid of the process that
    connected); for CURVE over TCP the authenticator's user id is the client's public
    key. A hello's own ``pid`` field is only what the sender claims; these are not.
    """

    uid: int | None = None
    gid: int | None = None
    pid: int | None = None
    key: str | None = None  # a CURVE client's public key (z85)

    @property
    def owner(self) -> str | None:
        """The principal that owns what this peer starts: ``uid:N`` or ``key:Z85``."""
        if self.key:
            return f"key:{self.key}"
        return None if self.uid is None else f"uid:{self.uid}"

    @property
    def root(self) -> bool:
        return self.uid == 0 and not self.key


@dataclass
class Rank:
    """One process of a job, as its hello described it."""

    rank: int
    identity: bytes
    pid: int
    hostname: str
    registered: float
    last_seen: float
    start_time: float | None = None  # from the probe; None: pid not checkable
    step: int = 0
    alive: bool = True
    lost_reason: str = ""
    last_sent: float = float("-inf")  # when the daemon last sent this rank anything
    peer: PeerCred | None = None  # the connection's real credentials, where known
    peer_start: float | None = None  # start time of ``peer.pid`` (tells a reused pid)

    @property
    def checkable(self) -> bool:
        return self.pid > 0 and self.start_time is not None

    def reached(self, step: int) -> None:
        """The rank reported ``step`` (steps only move forward)."""
        self.step = max(self.step, step)

    def sent(self, now: float) -> None:
        """The daemon sent the rank a message (its liveness signal counts from here)."""
        self.last_sent = now

    def heard(self, now: float) -> None:
        """The rank spoke: it is alive, whatever liveness concluded before."""
        self.last_seen = now
        self.alive = True
        self.lost_reason = ""

    def lose(self, reason: str) -> None:
        self.alive = False
        self.lost_reason = reason


@dataclass
class PendingResume:
    """A lost job's new run, until its first step report ends the restart."""

    lost_at: float  # when the loss was detected
    last_seen: float  # the old run's last message: the best bound on when it died
    last_step: int
    resumed_from: int


#: Forwarded costs kept for saves not counted yet (only the next few can still be).
KEPT_STEPS = 16
#: Saved steps remembered as counted (only recent steps can be reported again).
COUNTED_STEPS = 64


@dataclass
class SaveCosts:
    """One job's counted saves and the slower ranks' costs of them."""

    #: Saved steps whose first report taught the tracker (a later report of one does not).
    counted: set[int] = field(default_factory=set)
    #: Costs other ranks reported (SaveCost) for saves not counted yet: step -> slowest.
    slower: dict[int, float] = field(default_factory=dict)

    def on_report(self, tracker: JobTracker, msg: SaveReport, now: float) -> bool:
        """A rank's save report: the tracker learns it if it is the first report of its
        step (or a failure, which always counts); then the rank's cost raises the save's.
        Returns whether it was counted."""
        counted = not msg.ok or msg.step not in self.counted
        if counted:
            tracker.on_save_report(
                now,
                msg.step,
                blocking_s=msg.blocking_s,
                durable_s=msg.durable_s,
                extra_step_s=msg.extra_step_s,
                ok=msg.ok,
                tier="local" if msg.tier == "local" else "durable",
            )
            if msg.ok:
                self.counted.add(msg.step)
                if len(self.counted) > COUNTED_STEPS:
                    self.counted.discard(min(self.counted))
        if msg.ok:
            if counted and (slower := self.slower.pop(msg.step, None)) is not None:
                tracker.on_slower_rank(msg.step, slower)
            cost = msg.blocking_s + msg.extra_step_s
            if msg.job_cost_s is not None:
                cost = max(cost, msg.job_cost_s)
            tracker.on_slower_rank(msg.step, cost, max(msg.durable_s, msg.blocking_s))
        return counted

    def on_save_cost(self, tracker: JobTracker, msg: SaveCost) -> None:
        """Another rank's cost of the save at ``msg.step``, forwarded by the job's chief."""
        if not msg.ok:
            return
        cost = msg.blocking_s + msg.extra_step_s
        if msg.step in self.counted:
            tracker.on_slower_rank(msg.step, cost)
            return
        self.slower[msg.step] = max(cost, self.slower.get(msg.step, 0.0))
        while len(self.slower) > KEPT_STEPS:
            del self.slower[min(self.slower)]

    def clear(self) -> None:
        """A new run of the job: its steps start again."""
        self.counted.clear()
        self.slower.clear()


@dataclass
class Job:
    """One training job: its ranks, tracker, policy and current plan."""

    id: str
    tracker: JobTracker
    world_size: int
    created: float
    checkpoint_dir: str = ""
    state: JobStateName = "active"
    ranks: dict[int, Rank] = field(default_factory=dict)
    incarnation: int = 1
    policy_spec: str = ""
    policy: Policy | None = None
    asked_spec: str = ""  # the spec a rank's hello asked for ("": the daemon's choice)
    plan: Decision | None = None  # the plan the ranks were last sent
    plan_seq: int = 0
    latest: Decision | None = None  # the newest decision (may equal the plan's grid)
    urgent: str | None = None  # an operator's save request not yet answered by a save
    urgent_sent: bool = False  # a policy's urgent decision was already sent
    last_seen: float = 0.0
    lost_at: float | None = None
    lost_last_seen: float | None = None  # the lost run's last message
    lost_reason: str = ""
    failures: int = 0
    #: Of them, those a just-in-time save covered (the job came back resuming from one).
    failures_covered: int = 0
    #: The steps the job saved just in time (reports with reason ``JIT_REASON``).
    jit_steps: set[int] = field(default_factory=set)
    pending_resume: PendingResume | None = None
    #: The tier this run restored from ("local": a restart in place; "" durable).
    resumed_tier: str = ""
    #: The run's local tier as its hello said ("memory", "disk"; "" none).
    local_tier: str = ""
    #: The bytes its memory tier may hold, given by the daemon
    #: (:mod:`adaptd.daemon.jobs.memory_tier`; None: not budgeted yet).
    memory_budget: int | None = None
    last_save: SaveReport | None = None
    last_save_time: float | None = None
    #: The saves counted, and the other ranks' costs of them (δ of the job).
    costs: SaveCosts = field(default_factory=SaveCosts)
    finished_reason: str = ""
    owner: str | None = None  # the principal (PeerCred.owner) that started this run
    restore_fallback: str = ""  # this run resumed past a damaged checkpoint: which, why
    #: How the job's ranks agree on save steps (their hello's ``agreement``).
    agreement: AgreementKind = "none"
    #: Ranks that said hello in this run (a rank that said goodbye stays in it): the
    #: daemon's rounds start only once every rank of the job is known.
    joined: set[int] = field(default_factory=set)
    #: The daemon's agreement rounds (``agreement == "daemon"``, several ranks).
    rounds: JobRounds | None = None
    #: The plan the job's ranks agreed on, as a rank reported it (``JobPlan``).
    agreed: JobPlan | None = None
    #: Whether this daemon runs the job's agreement rounds: ranks without a runtime of
    #: their own (``agreement == "daemon"``), more than one of them. Kept by
    #: :meth:`join` and :meth:`new_run`, which change what it depends on.
    runs_rounds: bool = False
    #: Whether this daemon decides the job's plan: always, except for a job whose ranks
    #: agree on TensorFlow's coordination service (``agreement == "coordination"``),
    #: whose chief (rank 0) proposes its own daemon's plan: then only the daemon that
    #: rank 0 said hello to decides; the others show the plan the ranks report
    #: (:class:`~adaptd.protocol.job.JobPlan`) and relay requests. Kept like
    #: :attr:`runs_rounds`.
    decides: bool = True

    @classmethod
    def first(cls, msg: Hello, tracker: JobTracker, now: float) -> Job:
        """A job new to the daemon, from its first hello; its failures are what the
        tracker restored (a restarted daemon's), else 0."""
        return cls(
            id=msg.job,
            tracker=tracker,
            world_size=msg.world_size,
            created=now,
            failures=tracker.failures,
            last_seen=now,
            local_tier=msg.local_tier,
        )

    # ------------------------------------------------------------------ reading

    def live_ranks(self) -> list[Rank]:
        return [r for r in self.ranks.values() if r.alive]

    def lead_rank(self) -> int | None:
        live = [r.rank for r in self.ranks.values() if r.alive]
        return min(live) if live else None

    @property
    def step(self) -> int:
        return self.tracker.step

    def in_flight_step(self, step: int) -> int | None:
        """The step of a save a rank reports in flight at ``step``, which the tracker
        does not know of yet (``None``: none to tell it).

        Ranks save where the plan says, so the save is at the newest step of the plan's
        grid after the last known save, at or before ``step``; with no such grid step it
        is an urgent save (placed at ``step``) when one was asked for, else the known
        save still being written by a slower rank. Telling the tracker of it at once
        moves the policy's anchor to this save: otherwise an interval that drifts by a
        step would plan a second save right behind the one in flight, which the hook
        would have to wait for.
        """
        t = self.tracker
        floor = t.last_save_step if t.last_save_step is not None else t.start_step
        saved: int | None = None
        plan = self.plan
        if plan is not None:
            due = plan.due_after(floor)
            if due is not None and due <= step:
                if plan.every_steps:
                    due += (step - due) // plan.every_steps * plan.every_steps
                saved = due
        if saved is None and (plan is None or self.urgent is not None or self.urgent_sent):
            saved = step
        if saved is None or saved <= floor:
            return None
        return saved

    # ------------------------------------------------------------------ runs and ranks

    def move(self, state: JobStateName) -> JobStateName:
        """Enter ``state``; returns the state left (the job table counts jobs by state:
        only :meth:`JobTable.set_state` calls this)."""
        before, self.state = self.state, state
        return before

    def new_run(self, msg: Hello, now: float, *, failed_at: float | None = None) -> list[Rank]:
        """A new run of this job (a resume or a restart): its ranks, plan, rounds and
        per-run facts are forgotten, what was learned is kept. ``failed_at``: the
        previous run died then, which the tracker counts as one failure of the job
        before the new run starts. Returns the previous run's ranks (their connections
        no longer speak for the job)."""
        old = list(self.ranks.values())
        self.ranks.clear()
        self.incarnation += 1
        self.world_size = msg.world_size
        self.urgent = None
        self.urgent_sent = False
        self.restore_fallback = ""  # set again by this run's hello if it fell back
        self.policy = None  # chosen again from this run's hello
        self.plan = None  # a new run: its ranks need a plan for their own steps
        t = self.tracker
        t.local_tier = bool(msg.local_tier)
        self.local_tier = msg.local_tier
        self.memory_budget = None  # budgeted again at the next tick
        self.resumed_tier = msg.resumed_tier
        if failed_at is not None:  # covered: it comes back from a just-in-time save
            covered = msg.resumed_from in self.jit_steps
            self.failures_covered += covered
            t.on_failure(failed_at, failure_kind(msg), covered=covered)
        t.on_resume(now, msg.resumed_from, "local" if msg.resumed_tier == "local" else None)
        t.world_size = msg.world_size
        t.gpus = max(1, msg.gpus * msg.world_size)
        if msg.state_bytes:
            t.state_bytes = msg.state_bytes
        self.costs.clear()
        self.joined.clear()
        self.rounds = None  # a new run's ranks start new rounds
        self.agreed = None
        self._agreement_changed()
        return old

    def resuming(self, pending: PendingResume) -> None:
        """The new run resumes a lost one; its first step report ends the restart."""
        self.pending_resume = pending

    def join(self, rank: Rank, msg: Hello, kind: HelloKind, now: float) -> Rank | None:
        """``rank`` said hello (understood as ``kind``); returns the rank it replaces.

        A reconnect keeps the step the old connection reached; the principal behind
        the hello that starts a run owns the run (a later rank's only if none did)."""
        old = self.ranks.get(msg.rank)
        if old is not None and kind == "reconnect":
            rank.reached(old.step)
        owner = rank.peer.owner if rank.peer is not None else None
        if kind in ("new", "resume", "restart") or (self.owner is None and rank.peer is not None):
            self.owner = owner
        self.ranks[msg.rank] = rank
        self.last_seen = now
        self.agreement = msg.agreement
        self.joined.add(msg.rank)
        self._agreement_changed()
        # one failure per job failure: only the daemon deciding the job's plan counts it
        self.tracker.counts_failures = self.decides
        if msg.checkpoint_dir:
            self.checkpoint_dir = msg.checkpoint_dir
        if msg.restore_fallback:
            self.restore_fallback = msg.restore_fallback
        return old

    def _agreement_changed(self) -> None:
        self.runs_rounds = self.agreement == "daemon" and self.world_size > 1
        self.decides = self.agreement != "coordination" or 0 in self.joined

    def on_steps(self, rank: Rank, msg: Steps, now: float) -> PendingResume | None:
        """A batch of step timings from ``rank`` (it is alive). The step is the newest of
        any rank; timings count from the lead rank only (the others would count the job
        N times); a save in flight that the tracker does not know of yet is placed on
        the plan (:meth:`in_flight_step`). Returns the restart this report ends (the
        first step report of a resumed run), whose time the tracker learns."""
        self.heard(rank, now)
        rank.reached(msg.step)
        t = self.tracker
        if msg.save_in_flight and not t.save_in_flight:
            self._save_started(msg.step, now)
        if rank.rank == self.lead_rank():
            t.on_steps(now, msg.step, msg.count, msg.mean_s, msg.save_in_flight,
                       max_s=msg.max_s, max_steps=msg.max_steps, warmup=msg.warmup)  # fmt: skip
        else:  # other ranks move the step only; their timings would count the job twice
            t.on_steps(now, msg.step, 0, 0.0, t.save_in_flight)
        pending, self.pending_resume = self.pending_resume, None
        if pending is not None:
            tier = "local" if self.resumed_tier == "local" else "durable"
            t.on_restart(max(0.0, now - pending.last_seen), tier)
        return pending

    def _save_started(self, step: int, now: float) -> None:
        """A rank reports a save in flight that the tracker does not know of yet: tell the
        tracker now (:meth:`in_flight_step` says at which step), not when the save report
        arrives after the write is durable."""
        saved = self.in_flight_step(step)
        if saved is None:
            return
        t = self.tracker
        # when the save began: that many steps before this report (never before the last)
        when = now - (step - saved) * (t.step_time_s or 0.0)
        # two tiers: whether it goes to durable storage, by the rule the hook applies
        anchor = t.last_durable_save_step
        plan = self.plan
        durable = (
            not t.local_tier
            or plan is None
            or plan.durable_at(saved, anchor if anchor is not None else t.start_step)
        )
        t.on_save_requested(max(when, min(t.time, now)), saved, durable=durable)

    def leave(self, rank: Rank, step: int, now: float) -> None:
        """``rank`` said goodbye at ``step``: it is no longer one of the job's ranks."""
        rank.reached(step)
        self.tracker.on_steps(now, step, 0, 0.0, False)
        del self.ranks[rank.rank]

    def heard(self, rank: Rank, now: float) -> None:
        """Any message from ``rank``: it is alive, and so is its job."""
        rank.heard(now)
        self.last_seen = now

    def lose(self, now: float, reason: str, last_seen: float) -> None:
        """Every rank is gone without a goodbye (the job table sets the state): a
        failure candidate, from ``last_seen``."""
        self.lost_at = now
        self.lost_last_seen = last_seen
        self.lost_reason = reason
        self.failures += 1

    def revive(self, now: float) -> float:
        """The lost job spoke again from the same processes: the loss was a false
        alarm. Returns when it had been found lost."""
        lost_at = self.lost_at if self.lost_at is not None else now
        self.failures = max(0, self.failures - 1)
        self.lost_at = None
        return lost_at

    def finish(self, reason: str) -> None:
        """The last rank said goodbye (the job table sets the state)."""
        self.finished_reason = reason

    # ------------------------------------------------------------------ saves

    def count_save(self, rank: Rank, msg: SaveReport, now: float) -> bool:
        """``rank``'s save report: what the job learns from it (see
        :class:`SaveCosts`); the saved step moves the job's
        step, as a step report does. A durable save answers an operator's request.
        Returns whether the tracker counted it."""
        self.heard(rank, now)
        rank.reached(msg.step)
        if msg.reason == JIT_REASON:  # not a sample of the periodic saves' cost
            counted = False
            if msg.ok:
                self.jit_steps.add(msg.step)
                self.tracker.jit.saved(msg.durable_s)
        else:
            counted = self.costs.on_report(self.tracker, msg, now)
        self.tracker.on_steps(now, msg.step, 0, 0.0, self.tracker.save_in_flight)
        if msg.ok:
            self.urgent = None
        self.last_save = msg
        self.last_save_time = now
        return counted

    def save_cost(self, msg: SaveCost) -> None:
        """Another rank's cost of a save, forwarded by the job's chief."""
        self.costs.on_save_cost(self.tracker, msg)

    def ask_save(self, reason: str) -> None:
        """An operator (or a drain) asked the job to save now; a durable save answers it."""
        self.urgent = reason

    # ------------------------------------------------------------------ policy and plan

    def asks_for(self, spec: str) -> None:
        """A rank's hello asked for policy ``spec`` (kept to fall back on)."""
        if spec:
            self.asked_spec = spec

    def use_policy(self, policy: Policy, spec: str) -> str:
        """Run ``policy`` (written ``spec``) from now on; returns the spec it replaces."""
        previous, self.policy, self.policy_spec = self.policy_spec, policy, spec
        return previous

    def decided(
        self, decision: Decision, step: int, tolerance: float
    ) -> Literal["urgent", "plan"] | None:
        """The policy's newest decision (shown as the job's predicted waste), made at
        ``step``: ``"urgent"`` when it is an urgent save to send now (once per episode:
        :meth:`urgent_once`), ``"plan"`` when it is the job's new plan (its saves moved by
        more than ``tolerance`` of the interval: :func:`~adaptd.core.snapshot.same_saves`;
        its sequence number is the next), ``None`` when nothing is to be told."""
        self.latest = decision
        if self.urgent_once(decision.urgent):
            return "urgent"
        if decision.urgent:
            return None
        if self.plan is not None and same_saves(self.plan, decision, step, tolerance):
            return None
        self.plan = decision
        self.plan_seq += 1
        return "plan"

    def budget_memory(self, nbytes: int, change: float) -> bool:
        """The daemon gives the job's memory tier ``nbytes``; True when that is news to
        its ranks (the first budget, or one that moved by more than ``change`` of the
        last told), which is then the budget the plan carries."""
        old = self.memory_budget
        if old is not None and abs(nbytes - old) <= change * old:
            return False
        self.memory_budget = nbytes
        return True

    def forget_plan(self) -> None:
        """Decide afresh: the next decision is pushed even if its saves are the same."""
        self.plan = None
        self.urgent_sent = False

    def urgent_once(self, urgent: bool) -> bool:
        """Whether an urgent decision is to be sent now: once per episode (until a
        decision that is not urgent ends it)."""
        if not urgent:
            self.urgent_sent = False
            return False
        first, self.urgent_sent = not self.urgent_sent, True
        return first

    # ------------------------------------------------------------------ agreement

    def agree(self, msg: JobPlan) -> bool:
        """A rank reported the plan the job's ranks agreed on; returns whether it is a
        new one (another step, another plan)."""
        new = self.agreed is None or (self.agreed.at_step, self.agreed.next_step) != (
            msg.at_step,
            msg.next_step,
        )
        self.agreed = msg
        return new

    def rounds_made(self, make: Callable[[], JobRounds]) -> JobRounds:
        """This run's agreement rounds (made by ``make`` at first use)."""
        if self.rounds is None:
            self.rounds = make()
        return self.rounds


class JobTable:
    """Jobs by id, peers by identity, counts by state; changed only by the registry."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        #: jobs per state, kept as states change (status lines and metrics read it)
        self.by_state: Counter[JobStateName] = Counter()
        #: active jobs with a save in flight (each flip is a SaveInFlight event)
        self.writing: set[str] = set()
        #: each connection that said hello: peer identity -> (job id, rank)
        self.peers_map: dict[bytes, tuple[str, int]] = {}

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs.values())

    def __len__(self) -> int:
        return len(self.jobs)

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    # ------------------------------------------------------------------ peers

    @property
    def peers(self) -> int:
        return len(self.peers_map)

    def bind(self, job: Job, rank: Rank) -> None:
        """``rank``'s connection speaks for it from now on."""
        self.peers_map[rank.identity] = (job.id, rank.rank)

    def unbind(self, ranks: list[Rank] | tuple[Rank, ...]) -> None:
        """These ranks' connections no longer speak for anyone."""
        for r in ranks:
            self.peers_map.pop(r.identity, None)

    # ------------------------------------------------------------------ jobs

    def add(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.by_state[job.state] += 1

    def touch(self, job: Job) -> None:
        """``job`` started a new run: it is the most recently active."""
        self.jobs[job.id] = self.jobs.pop(job.id)

    def set_state(self, job: Job, state: JobStateName) -> None:
        self.by_state[job.move(state)] -= 1
        self.by_state[state] += 1

    def note_writing(self, job: Job, now: float, emit: Callable[[ev.Event], None]) -> None:
        """Keep :attr:`writing` (active jobs whose tracker has a save in flight); each flip
        is a :class:`~adaptd.events.SaveInFlight` given to ``emit``."""
        writing = job.state == "active" and job.tracker.save_in_flight
        if writing != (job.id in self.writing):
            (self.writing.add if writing else self.writing.discard)(job.id)
            emit(ev.SaveInFlight(now, job.id, writing))

    def evict(self, keep_inactive: int) -> list[Job]:
        """Forget the oldest inactive jobs beyond ``keep_inactive`` (dict order is activity
        order); returns them, oldest first."""
        inactive = [j for j in self.jobs.values() if j.state != "active"]
        gone = inactive[: max(0, len(inactive) - keep_inactive)]
        for job in gone:
            self.unbind(list(job.ranks.values()))
            del self.jobs[job.id]
            self.by_state[job.state] -= 1
        return gone


class RegistryView:
    """What the registry knows, read-only."""

    def __init__(self, table: JobTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, job: object) -> bool:
        return job in self._table.jobs

    @property
    def active(self) -> int:
        """Jobs whose ranks are serving."""
        return self._table.by_state["active"]

    @property
    def lost(self) -> int:
        """Jobs whose ranks all vanished without a goodbye (they may resume)."""
        return self._table.by_state["lost"]

    def writing(self) -> frozenset[str]:
        """Active jobs with a save in flight."""
        return frozenset(self._table.writing)

    def step_time_s(self, job: str) -> float | None:
        """The job's recent mean step time (``None``: unknown job, or not measured)."""
        j = self._table.jobs.get(job)
        return j.tracker.step_time_s if j is not None else None

    def processes(self) -> Mapping[str, tuple[str, tuple[int, ...]]]:
        """Each active job's checkpoint directory and its ranks' pids (those known),
        for the telemetry: whose GPUs and whose disks are whose."""
        return {
            job.id: (job.checkpoint_dir, tuple(r.pid for r in job.ranks.values() if r.pid > 0))
            for job in self._table
            if job.state == "active"
        }

    def learned(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(job, what its tracker learned)`` for every known job: what a restart of
        the daemon must not lose."""
        for j in self._table:
            yield j.id, j.tracker.learned()

    def learned_of(self, job: str) -> dict[str, Any] | None:
        """What one job's tracker learned (``None``: unknown job)."""
        j = self._table.jobs.get(job)
        return j.tracker.learned() if j is not None else None
