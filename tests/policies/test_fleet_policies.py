"""Policies on fleet facts: write slots in io_aware, the fleet's Weibull shape in default."""

from __future__ import annotations

import pytest

from adaptd.core.snapshot import FleetSample, JobState, Snapshot, StorageSample
from adaptd.policies import Daly, Default, Guards, IoAware, Weibull

T = "nfs://10.0.4.20/export/ckpt"


def job(**kw) -> JobState:
    base = dict(
        job="a",
        step=1000,
        time=5000.0,
        step_time_s=1.0,
        last_save_step=900,
        last_save_time=4900.0,
        save_cost_s=8.0,
        save_latency_s=60.0,
        mtbf_s=175_000.0,
        storage_target=T,
    )
    base.update(kw)
    return JobState(**base)


def snap(*, slots=None, holding=(), busy=0.1, writing=(), fleet=None) -> Snapshot:
    return Snapshot(
        time=5000.0,
        storage=(
            StorageSample(
                target=T,
                mountpoint="/mnt/nfs",
                busy_fraction=busy,
                writing_jobs=writing,
                fleet_slots=slots,
                fleet_holding=holding,
            ),
        ),
        fleet=fleet,
    )


EVERY = Daly().decide(snap(), job()).every_steps  # the inner interval, in steps
DUE = 900 + EVERY


@pytest.mark.parametrize(
    ("storage", "step", "next_step", "tags"),
    [
        # not due yet, no slot: the plan is pushed to the deadline, nothing asked yet
        (snap(slots=2), 1000, DUE + EVERY, {"deferred"}),
        # due, no slot: deferred, and the daemon is told to ask for one
        (snap(slots=2), DUE, DUE + EVERY, {"deferred", "fleet-wait"}),
        # due within slot_lead_s (3 s = 3 steps here): asked ahead, so a free slot is
        # there when the save is due
        (snap(slots=2), DUE - 3, DUE + EVERY, {"deferred", "fleet-wait"}),
        (snap(slots=2), DUE - 4, DUE + EVERY, {"deferred"}),
        # holding a slot before the save is due: the plan stays the inner one
        (snap(slots=2, holding=("a",)), DUE - 2, DUE, set()),
        # due and holding a slot: save now, though the mount looks busy and others write
        (snap(slots=2, holding=("a",), busy=0.99, writing=("b", "c")), DUE + 5, DUE + 6, set()),
        # past the deferral bound: saves without a slot (never held longer for want of one)
        (snap(slots=2), DUE + EVERY, DUE + EVERY + 1, set()),
        # fleet away (no slots): the local figures decide as before
        (snap(busy=0.1), DUE + 5, DUE + 6, set()),
        (snap(busy=0.95), DUE + 5, DUE + EVERY, {"deferred"}),
    ],
)
def test_io_aware_waits_for_a_fleet_slot_within_its_bound(storage, step, next_step, tags):
    d = IoAware().decide(storage, job(step=step, time=5000.0 + step - 1000))
    assert d.next_step == next_step
    assert {"deferred", "fleet-wait"} & set(d.tags) == tags
    if "fleet-wait" in tags:
        assert "fleet write slot" in d.reason


def test_guards_max_lost_caps_the_wait_for_a_slot():
    cap = EVERY + 300.0  # seconds of work at risk: inside io_aware's own bound
    d = Guards(inner=IoAware(), max_lost_s=cap).decide(snap(slots=1), job(step=DUE))
    assert d.next_step == 900 + int(cap) < DUE + EVERY
    assert "capped" in d.reason and "fleet-wait" in d.tags


@pytest.mark.parametrize(
    ("fleet", "policy"),
    [
        (None, "daly"),  # no fleet
        (FleetSample(hosts=16), "daly"),  # a fleet without a fitted shape yet
        (FleetSample(hosts=16, failure_shape=0.95, failure_shape_high=1.2), "daly"),
        (FleetSample(hosts=16, failure_shape=0.7, failure_shape_high=0.82), "weibull"),
    ],
)
def test_default_uses_weibull_only_when_the_fleet_is_credibly_bursty(fleet, policy):
    state = job(time_since_failure_s=3600.0)
    d = Default().decide(snap(fleet=fleet), state)
    assert d.policy == policy
    if policy == "weibull":
        expected = Weibull(shape=0.7).decide(snap(), state)
        assert (d.next_step, d.every_steps) == (expected.next_step, expected.every_steps)
        assert "k=0.7" in d.reason
