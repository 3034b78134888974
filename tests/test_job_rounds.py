"""The daemon's agreement rounds for ranks without a runtime (adaptd.core.rounds)."""

from __future__ import annotations

import pytest

from adaptd.core import agreement as rules
from adaptd.core.rounds import JobRounds
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as p


def acks(rounds: JobRounds, prop: p.Propose, steps: dict[int, int], now: float = 1.0):
    decision = None
    for rank, step in steps.items():
        decision = rounds.on_ack(rules.acknowledge(prop, rank, step), steps.keys(), now)
    return decision


def test_a_plan_is_proposed_ahead_of_the_furthest_rank_and_committed_by_all() -> None:
    rounds = JobRounds("j", 3, lead_time_s=1.0)
    rounds.want_plan(Decision(100, 50, policy="fixed"))
    prop = rounds.next(0.0, {0: 40, 1: 55, 2: 47}, step_time_s=0.1)
    assert prop is not None and prop.action == "plan" and prop.proposer == 3
    assert prop.at_step == 55 + 10  # 1 s of 0.1 s steps past the furthest rank
    assert rounds.next(0.0, {0: 40}, 0.1) is None  # one round at a time
    assert rounds.on_ack(rules.acknowledge(prop, 0, 41), [0, 1, 2], 0.1) is None
    decision = acks(rounds, prop, {1: 56, 2: 50})
    assert decision is not None and decision.commit
    assert rounds.agreed == Decision(100, 50, policy="fixed")
    assert rounds.next(2.0, {0: 60, 1: 60, 2: 60}, 0.1) is None  # nothing more wanted


def test_a_rank_past_the_step_aborts_the_round_and_the_retry_goes_further() -> None:
    rounds = JobRounds("j", 2, lead_time_s=0.0)
    rounds.want_plan(Decision(10, 10))
    prop = rounds.next(0.0, {0: 5, 1: 6}, None)
    assert prop is not None and prop.at_step == 6 + rules.MIN_LEAD_STEPS
    decision = rounds.on_ack(rules.acknowledge(prop, 1, 30), [0, 1], 0.1)  # rank 1 raced on
    assert decision is not None and not decision.commit and decision.retry_from == 30
    retry = rounds.next(0.2, {0: 8, 1: 31}, None)
    assert retry is not None and retry.round == prop.round + 1
    assert retry.at_step == 31 + 2 * rules.MIN_LEAD_STEPS
    assert acks(rounds, retry, {0: 9, 1: 32}).commit


def test_a_rank_that_leaves_is_no_longer_waited_for() -> None:
    rounds = JobRounds("j", 3)
    rounds.want_save("operator")
    prop = rounds.next(0.0, {0: 1, 1: 1, 2: 1}, None)
    assert prop is not None and prop.action == "save"
    rounds.on_ack(rules.acknowledge(prop, 0, 1), [0, 1, 2], 0.1)
    rounds.on_ack(rules.acknowledge(prop, 1, 1), [0, 1, 2], 0.1)
    decision = rounds.check(0.2, [0, 1])  # rank 2 said goodbye
    assert decision is not None and decision.commit
    assert rounds.next(0.3, {0: 2, 1: 2}, None) is None  # the save wish was fulfilled


def test_a_silent_rank_aborts_the_round_at_the_timeout() -> None:
    rounds = JobRounds("j", 2, timeout_s=5.0)
    rounds.want_save("drain")
    prop = rounds.next(0.0, {0: 1, 1: 1}, None)
    assert prop is not None
    rounds.on_ack(rules.acknowledge(prop, 0, 1), [0, 1], 1.0)
    assert rounds.check(4.9, [0, 1]) is None
    decision = rounds.check(5.0, [0, 1])
    assert decision is not None and not decision.commit and "rank(s) 1" in decision.reason
    again = rounds.next(5.1, {0: 3, 1: 3}, None)
    assert again is not None and again.action == "save"  # still wanted


def test_a_save_goes_before_a_plan_and_a_plan_the_ranks_follow_is_not_proposed() -> None:
    rounds = JobRounds("j", 2)
    rounds.want_plan(Decision(20, 10))
    rounds.want_save("xid 79")
    first = rounds.next(0.0, {0: 1, 1: 1}, None)
    assert first is not None and first.action == "save"
    acks(rounds, first, {0: 1, 1: 1})
    second = rounds.next(0.1, {0: 2, 1: 2}, None)
    assert second is not None and second.action == "plan"
    acks(rounds, second, {0: 2, 1: 2})
    rounds.want_plan(Decision(30, 10))  # the same grid from here on: nothing to agree
    assert rounds.next(0.2, {0: 21, 1: 21}, None) is None
    assert [h[3] for h in rounds.history] == [True, True]


def test_answers_to_other_rounds_are_ignored() -> None:
    rounds = JobRounds("j", 2)
    rounds.want_save("x")
    prop = rounds.next(0.0, {0: 1, 1: 1}, None)
    stale = p.Ack(v=p.VERSION, job="j", rank=1, round=prop.round + 5, step=1, ok=True)
    assert rounds.on_ack(stale, [0, 1], 0.1) is None
    other_job = p.Ack(v=p.VERSION, job="k", rank=1, round=prop.round, step=1, ok=True)
    assert rounds.on_ack(other_job, [0, 1], 0.1) is None
    assert rounds.open is not None and not rounds.open.acks


def test_one_rank_needs_no_rounds() -> None:
    with pytest.raises(ValueError, match="needs no agreement"):
        JobRounds("j", 1)


def test_a_new_plan_never_takes_effect_before_a_committed_one_still_waiting() -> None:
    rounds = JobRounds("j", 2, lead_time_s=1.0)
    rounds.want_plan(Decision(100, 50))
    first = rounds.next(0.0, {0: 10, 1: 10}, step_time_s=0.01)  # 100 steps of lead
    assert first is not None and first.at_step == 110 and acks(rounds, first, {0: 11, 1: 11}).commit
    rounds.want_plan(Decision(100, 20))
    # the step time grew tenfold: the lead is 10 steps now, which would land before 110
    second = rounds.next(0.1, {0: 20, 1: 20}, step_time_s=0.1)
    assert second is not None and second.at_step == 110  # not 30: the newer plan wins


def test_a_rank_that_rejoins_gets_the_plan_proposed_again() -> None:
    rounds = JobRounds("j", 2)
    rounds.want_plan(Decision(100, 50))
    prop = rounds.next(0.0, {0: 1, 1: 1}, None)
    assert prop is not None and acks(rounds, prop, {0: 1, 1: 1}).commit
    assert rounds.next(0.1, {0: 2, 1: 2}, None) is None  # the same saves: nothing to do
    rounds.rejoin(Decision(100, 50))  # rank 1 came back, it does not know the plan
    again = rounds.next(0.2, {0: 3, 1: 0}, None)
    assert again is not None and again.action == "plan" and again.every_steps == 50
    assert acks(rounds, again, {0: 3, 1: 0}).commit
    assert rounds.next(0.3, {0: 4, 1: 4}, None) is None
