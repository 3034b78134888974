"""Table tests for the policy interface, specs and the two foundation policies."""

from __future__ import annotations

import pytest

from adaptd.core.policy import AnyPolicy, PolicyError, available, earliest, next_multiple, parse
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies import Fixed, Phased

SNAP = Snapshot(time=100.0)


def job(step: int, step_time_s: float | None = 1.0) -> JobState:
    return JobState(job="j", step=step, step_time_s=step_time_s)


@pytest.mark.parametrize(
    ("step", "every", "origin", "expected"),
    [
        (0, 10, 0, 10),
        (9, 10, 0, 10),
        (10, 10, 0, 20),
        (995, 300, 1000, 1000),
        (1000, 300, 1000, 1300),
    ],
)
def test_next_multiple(step: int, every: int, origin: int, expected: int) -> None:
    assert next_multiple(step, every, origin) == expected


@pytest.mark.parametrize(
    ("policy", "step", "next_step", "every"),
    [
        (Fixed(steps=100), 0, 100, 100),
        (Fixed(steps=100), 100, 200, 100),
        (Fixed(steps=100), 250, 300, 100),
        (Fixed(seconds=30.0), 0, 60, 60),  # 0.5 s/step below
        (Phased(), 0, 50, 50),
        (Phased(), 949, 950, 50),
        (Phased(), 950, 1000, 300),  # warm-up grid would reach 1000: the late grid starts there
        (Phased(), 1000, 1300, 300),
        (Phased(warmup_steps=100, early_every=10, late_every=25), 120, 125, 25),
    ],
)
def test_decisions(policy, step: int, next_step: int, every: int) -> None:
    d = policy.decide(SNAP, job(step, 0.5))
    assert (d.next_step, d.every_steps) == (next_step, every)
    assert d.reason


def test_fixed_seconds_waits_for_step_time() -> None:
    d = Fixed(seconds=10).decide(SNAP, job(5, None))
    assert d.next_step is None and "waiting" in d.reason


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fixed", "exactly one"),
        ("fixed:steps=0", ">= 1"),
        ("fixed:steps=abc", "not a valid int"),
        ("fixed:step=5", "no setting 'step'"),
        ("fixed:steps", "key=value"),
        ("nope", "unknown policy 'nope'"),
        ("fixed:steps=5+", "empty policy spec"),
        ("phased:late_every=-1", ">= 1"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse(spec)


def test_parse_composes_and_passes_objects_through() -> None:
    p = parse("fixed:steps=500+phased:early_every=20")
    assert isinstance(p, AnyPolicy)
    assert p.decide(SNAP, job(10)).next_step == 20
    obj = Fixed(steps=7)
    assert parse(obj) is obj


def test_earliest_prefers_urgent_then_lowest_step() -> None:
    a = Decision(next_step=50, reason="a")
    b = Decision(next_step=20, reason="b")
    u = Decision(next_step=None, urgent=True, reason="u")
    none = Decision(next_step=None, reason="none")
    assert earliest([a, b]).reason == "b"
    assert earliest([a, u, b]).reason == "u"
    assert earliest([none, a]).reason == "a"
    assert earliest([]).next_step is None


@pytest.mark.parametrize(
    ("next_step", "every", "step", "due"),
    [
        (100, 50, 0, 100),
        (100, 50, 100, 150),
        (100, 50, 173, 200),
        (100, None, 100, None),
        (None, 5, 3, None),
    ],
)
def test_decision_due_after_keeps_ranks_on_one_grid(next_step, every, step, due) -> None:
    assert Decision(next_step=next_step, every_steps=every).due_after(step) == due


def test_builtins_are_registered_entry_points() -> None:
    found = available()
    assert {"fixed", "phased"} <= set(found)
    assert found["fixed"].startswith("adaptd.policies.fixed:Fixed")
