"""The planner on its own: the job state a policy sees, and what a pause does to its decision."""

from __future__ import annotations

from dataclasses import dataclass, field

from adaptd import events as ev
from adaptd.core.policy import PolicyCache
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.daemon.jobs.delivery import Delivery
from adaptd.daemon.jobs.planner import Planner
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.rounds import Agreements
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.stats import DaemonStats
from adaptd.protocol import job as p
from adaptd.protocol.admin import JobSettings


@dataclass
class Recorder:
    """A policy that saves every 10 steps and keeps the job states it was shown."""

    seen: list[JobState] = field(default_factory=list)

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        self.seen.append(job)
        return Decision(next_step=10, every_steps=10, reason="every 10", policy="recorder")


def planner_for(settings: dict[str, JobSettings]) -> tuple[Planner, list, list]:
    sent: list[tuple[int, p.Message]] = []
    events: list[ev.Event] = []
    policies = PolicyCache()
    stats = DaemonStats()

    def send(rank, msg, now) -> None:
        sent.append((rank.rank, msg))

    planner = Planner(
        settings=OperatorSettings(policies=policies, emit=events.append, initial=settings),
        snapshot_source=lambda: Snapshot(time=0.0),
        delivery=Delivery(send=send, rounds=Agreements(send=send, stats=stats), stats=stats),
        emit=events.append,
        stats=stats,
    )
    return planner, sent, events


def test_a_paused_job_is_paused_in_the_state_its_policy_sees_and_its_saves_are_held() -> None:
    reg = Registry()
    job, _, _ = reg.hello(b"a", p.Hello(v=p.VERSION, job="held", world_size=1), 0.0)
    other, _, _ = reg.hello(b"b", p.Hello(v=p.VERSION, job="free", world_size=1), 0.0)
    planner, sent, events = planner_for({"held": JobSettings(paused=True)})
    job.policy, other.policy = Recorder(), Recorder()
    assert planner.decide(job, 1.0) and planner.decide(other, 1.0)
    assert job.policy.seen[-1].paused is True and other.policy.seen[-1].paused is False
    plans = {e.job: e for e in events if isinstance(e, ev.PlanChanged)}
    assert plans["held"].decision.next_step is None  # held by the daemon, whatever the policy
    assert plans["held"].decision.reason.startswith("paused by operator")
    assert plans["free"].decision.next_step == 10
    assert [type(m).__name__ for _, m in sent] == ["Plan", "Plan"]


def test_plan_changed_carries_the_step_time_its_sinks_record() -> None:
    reg = Registry()
    job, rank, _ = reg.hello(b"a", p.Hello(v=p.VERSION, job="j", world_size=1), 0.0)
    reg.steps(job, rank, p.Steps(v=p.VERSION, job="j", rank=0, step=5, count=5, mean_s=0.25), 1.0)
    planner, _, events = planner_for({})
    job.policy = Recorder()
    planner.decide(job, 1.0)
    (plan,) = [e for e in events if isinstance(e, ev.PlanChanged)]
    assert plan.step_time_s == job.tracker.step_time_s and plan.step_time_s is not None
