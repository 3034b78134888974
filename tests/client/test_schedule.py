"""SaveSchedule: which step the next save falls on (pure, no TensorFlow)."""

from __future__ import annotations

import pytest

from adaptd.client.agreement.agreed import job_plan
from adaptd.client.save.schedule import NEVER, Due, SaveSchedule, decision_of
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as protocol
from adaptd.protocol.job import VERSION, JobPlan, Plan, Propose


def plan(
    seq: int, next_step: int | None, every: int | None = None, reason: str = "r"
) -> protocol.Plan:
    return protocol.Plan(
        v=protocol.VERSION, job="j", seq=seq, next_step=next_step, every_steps=every,
        policy="fixed", reason=reason,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("next_step", "every", "step", "due"),
    [
        (100, 50, 0, 100),  # ahead: the plan's first step
        (100, 50, 100, 100),  # the current step is on the plan: save at this boundary
        (100, 50, 101, 150),  # late: the next grid step, same grid on every rank
        (100, 50, 349, 350),
        (100, None, 101, NEVER),  # a one-off plan that has passed plans nothing
        (None, None, 5, NEVER),
    ],
)
def test_daemon_plan_grid(next_step, every, step, due):
    s = SaveSchedule()
    s.apply_plan(plan(1, next_step, every), step)
    assert s.due == due
    assert s.source == "daemon"


def test_grid_after_a_save_moves_on_and_matches_decision_due_after():
    s = SaveSchedule()
    s.apply_plan(plan(1, 10, 10), 0)
    d = Decision(next_step=10, every_steps=10)
    for step in (10, 20, 30):
        assert s.due == step
        s.saved(step)
        assert s.due == d.due_after(step)


def test_lower_seq_is_ignored_equal_seq_restates():
    s = SaveSchedule()
    assert s.apply_plan(plan(5, 100, 100), 0)
    assert not s.apply_plan(plan(4, 10, 10), 0)  # stale
    assert s.due == 100
    assert not s.apply_plan(plan(5, 100, 100), 0)  # the daemon repeating itself
    assert s.apply_plan(plan(6, 30, 30), 0)
    assert s.due == 30


def test_embedded_plan_does_not_override_the_daemon_until_lost():
    s = SaveSchedule()
    s.apply_plan(plan(1, 100, 100), 0)
    assert not s.set_embedded(Decision(next_step=5, every_steps=5, policy="phased"), 0)
    assert s.due == 100
    s.daemon_lost()
    assert s.plan_seq is None  # a restarted daemon numbers afresh
    assert s.set_embedded(Decision(next_step=5, every_steps=5, policy="phased"), 0)
    assert (s.due, s.source) == (5, "embedded")
    # the daemon's next plan wins again, whatever its seq
    s.apply_plan(plan(1, 40, 40), 3)
    assert (s.due, s.source) == (40, "daemon")


def test_save_now_at_boundary_or_at_step():
    s = SaveSchedule()
    s.apply_plan(plan(1, 100, 100), 0)
    s.save_now(protocol.SaveNow(v=protocol.VERSION, job="j", reason="drain"), 17)
    assert s.next_due() == Due(17, "drain", "urgent", "daemon")
    s.saved(17)
    assert s.due == 100
    s.save_now(protocol.SaveNow(v=protocol.VERSION, job="j", reason="op", at_step=60), 20)
    assert s.next_due() == Due(60, "op", "urgent", "daemon")
    # an at_step already behind means: at this boundary
    s.save_now(protocol.SaveNow(v=protocol.VERSION, job="j", reason="late", at_step=3), 21)
    assert s.due == 21


def test_urgent_does_not_resave_a_saved_step():
    s = SaveSchedule()
    s.set_embedded(Decision(next_step=10, every_steps=10), 0)
    s.saved(10)
    s.request(10, "again", 10)
    assert s.due == 11  # step 10 is saved already: the next boundary


def test_urgent_decision_from_policy():
    s = SaveSchedule()
    s.set_embedded(Decision(next_step=None, urgent=True, reason="gpu xid"), 7)
    assert s.next_due() == Due(7, "gpu xid", "urgent", "embedded")


def test_next_due_names_policy_and_source():
    s = SaveSchedule()
    assert s.next_due() is None
    s.set_embedded(Decision(next_step=50, every_steps=50, policy="phased", reason="warm-up"), 0)
    assert s.next_due() == Due(50, "warm-up", "phased", "embedded")


def test_resume_floor_skips_the_restored_step():
    s = SaveSchedule()
    s.last_saved_step = 100  # resumed from ckpt-100
    s.apply_plan(plan(1, 100, 50), 100)
    assert s.due == 150


def test_a_plan_keeps_every_field_from_one_record_to_the_next() -> None:
    """The daemon's Plan as a decision, a committed round as the JobPlan a daemon shows:
    every field both records have is carried, the rest is the new record's."""
    plan = Plan(v=2, job="j", seq=3, next_step=10, every_steps=5, policy="daly",
                reason="r", interval_s=1.5, waste=0.1)  # fmt: skip
    assert decision_of(plan) == Decision(next_step=10, every_steps=5, reason="r",
                                         policy="daly", interval_s=1.5, waste=0.1)  # fmt: skip
    committed = Propose(v=1, job="j", round=4, action="plan", at_step=7, proposer=0, reason="r",
                        next_step=10, every_steps=5, policy="daly", interval_s=1.0, waste=0.2,
                        decided_by="host-a", source="daemon")  # fmt: skip
    assert job_plan(committed, 3) == JobPlan(v=VERSION, job="j", rank=3, at_step=7,
                                             next_step=10, every_steps=5, policy="daly",
                                             reason="r", decided_by="host-a",
                                             source="daemon")  # fmt: skip
