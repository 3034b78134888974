"""What the daemon knows about one job: its ranks, who is behind each connection, its plan.

These are the :class:`~adaptd.daemon.jobs.registry.Registry`'s records. The registry changes
them (hello, reports, liveness); the daemon's planner sets a job's policy and plan;
everything else (status views, the sinks' read-only :class:`~adaptd.daemon.jobs.view.RegistryView`)
only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from adaptd.core.estimators import JobTracker
from adaptd.core.policy import Policy
from adaptd.core.rounds import JobRounds
from adaptd.core.snapshot import Decision
from adaptd.protocol.job import AgreementKind, JobPlan, SaveReport

__all__ = ["HelloKind", "Job", "JobStateName", "PeerCred", "PendingResume", "Rank"]

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


@dataclass
class PendingResume:
    """A lost job's new run, until its first step report ends the restart."""

    lost_at: float  # when the loss was detected
    last_seen: float  # the old run's last message: the best bound on when it died
    last_step: int
    resumed_from: int


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
    pending_resume: PendingResume | None = None
    last_save: SaveReport | None = None
    last_save_time: float | None = None
    counted_save_steps: set[int] = field(default_factory=set)
    #: Costs other ranks reported (SaveCost) for saves not counted yet: step -> slowest.
    slower_costs: dict[int, float] = field(default_factory=dict)
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

    @property
    def runs_rounds(self) -> bool:
        """Whether this daemon runs the job's agreement rounds: ranks without a runtime
        of their own (``agreement == "daemon"``), more than one of them."""
        return self.agreement == "daemon" and self.world_size > 1

    @property
    def decides(self) -> bool:
        """Whether this daemon decides the job's plan: always, except for a job whose
        ranks agree on TensorFlow's coordination service (``agreement ==
        "coordination"``), whose chief (rank 0) proposes its own daemon's plan: then
        only the daemon that rank 0 said hello to decides; the others show the plan
        the ranks report (:class:`~adaptd.protocol.job.JobPlan`) and relay requests."""
        return self.agreement != "coordination" or 0 in self.joined

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
