"""The simulator with two tiers and just-in-time saves (issues 23, 24): the scenario
fields, runs worked out by hand, the failure classes' stream and the oracles.
The engine against the two-tier closed form: test_theory_tiers.py."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from adaptd import sim
from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.policies import Daly, Fixed
from adaptd.sim import theory_tiers
from adaptd.sim.classes import FailureKinds
from adaptd.sim.engine import RunResult, _Run
from adaptd.sim.oracles import Oracle, TierOracle, best_tiers
from adaptd.sim.runner import _run_one, setup

# Half-second steps; a durable save blocks 2 s and is durable 4 s after its call (a
# quarter of compute lost meanwhile), a local one blocks 0.5 s and is complete 1 s after
# its call (half of compute lost meanwhile): δ₂ = 2.5 s, δ₁ = 0.75 s. Restarts: 8 s from
# durable storage, 2 s in place. All figures are exact binary fractions.
TIERED = {
    "job": {"steps": 40, "step_time_s": 0.5, "gpus": 2},
    "checkpoint": {
        "blocking_s": 2.0,
        "latency_s": 4.0,
        "slowdown": 0.25,
        "restore_s": 8.0,
        "local": {"blocking_s": 0.5, "latency_s": 1.0, "slowdown": 0.5, "restore_s": 2.0},
    },
    "failures": {"trace": [], "process_share": 0.5, "peer_share": 0.5, "jit_save_s": 1.0},
}


def tiered(trace: list[float]) -> sim.Scenario:
    return sim.from_dict({**TIERED, "failures": {**TIERED["failures"], "trace": trace}})


class Scripted:
    """Failure classes in a given order, instead of the seeded stream."""

    def __init__(self, kinds: list[tuple[str, bool]]) -> None:
        self.kinds = list(kinds)

    def next(self) -> tuple[str, bool]:
        return self.kinds.pop(0)


# Every 4 steps to the local tier, every 2nd save durable: saves at 4, 12, 20, 28, 36 stay
# local, those at 8, 16, 24, 32 go to both tiers (b₁ + b₂ = 2.5 s of blocking; the local
# write then runs until 3 s after the call, the durable one until 4.5 s after it).
# Without failures: save 4 at 2.0, 8 at 4.75, 12 at 10.0 (its local copy complete at
# 11.0, when the job is at step 12.5), 16 at 12.75 …, the end at 36.75.
EVERY, K = 4, 2


def worked(trace: list[float], kinds: list[tuple[str, bool]]) -> tuple[RunResult, _Run]:
    r = _Run(tiered(trace), TierOracle(EVERY, K), 0)
    r.kinds = Scripted(kinds)  # type: ignore[assignment]
    return r.run(), r


def test_local_saves_and_every_kth_durable_without_failures() -> None:
    result, run = worked([], [])
    # 5 local saves of 0.75 s, 4 to both tiers of 0.75 + 2.5 s
    assert result == RunResult(36.75, 20.0, 16.75, 0.0, 0.0, 0.0, saves=9, failures=0,
                               local_saves=5, jit_saves=0)  # fmt: skip
    s = run.tracker.state()
    assert (s.local_save_cost_s, s.local_latency_s, s.save_cost_s, s.save_latency_s) == (
        0.75,
        1.0,
        2.5,
        4.0,
    )
    assert (s.last_durable_step, s.last_durable_save_step, run.durable, run.local) == (
        32,
        32,
        32,
        36,
    )


def test_a_process_failure_restarts_in_place_from_the_newest_local_save() -> None:
    # at 11.5 the job is at step 13.5: back from local 12 in 2 s, 1.5 steps lost, then as
    # from the call of save 16 (12.75 without the failure) from 15.5
    result, run = worked([11.5], [("process", False)])
    assert result == RunResult(39.5, 20.0, 16.75, 0.75, 2.0, 0.0, saves=9, failures=1,
                               local_saves=5)  # fmt: skip
    classes = run.tracker.failure_classes
    assert (classes.process.failures, classes.host.failures, classes.uncovered) == (1, 0, 1)
    # vanished to the first step heard: the restart and that step (as the daemon hears it)
    assert (run.tracker.state().local_restore_s, run.tracker.state().restore_s) == (2.5, None)


def test_a_host_failure_restarts_from_the_newest_durable_save() -> None:
    # from durable 8 in 8 s (5.5 steps lost); save 12 is made again, 2 s of compute after
    # the restart: then as from 10.0 without the failure
    result, run = worked([11.5], [("host", False)])
    assert result == RunResult(48.25, 20.0, 17.5, 2.75, 8.0, 0.0, saves=10, failures=1,
                               local_saves=6)  # fmt: skip
    assert run.tracker.failure_classes.host.failures == 1
    assert (run.tracker.state().restore_s, run.tracker.state().local_restore_s) == (8.5, None)


def test_a_host_failure_during_a_restart_in_place_sends_it_to_durable_storage() -> None:
    # the restart from local 12 (11.5 to 13.5) fails at 12.5: from durable 8, 8 s more
    result, run = worked([11.5, 12.5], [("process", False), ("host", False)])
    assert result == RunResult(49.25, 20.0, 17.5, 2.75, 9.0, 0.0, saves=10, failures=2,
                               local_saves=6)  # fmt: skip
    # the daemon sees the job come back elsewhere: one host failure (the second, during
    # the restart, it cannot see)
    classes = run.tracker.failure_classes
    assert (classes.host.failures, classes.process.failures) == (1, 0)


def test_a_covered_failure_loses_the_step_in_progress_and_the_save_just_in_time() -> None:
    # at 11.5 (step 13.5) a survivor saves step 13 in 1 s to the local tier (a process
    # failure): half a step lost; back from it in place at 14.5. The saves count from the
    # step resumed from: 17 (both: 9 steps past durable 8), 21, 25 (both), 29, 33 (both),
    # 37; the end at 40.0
    result, run = worked([11.5], [("process", True)])
    assert result == RunResult(40.0, 20.0, 4.75 + 1.0 + 12.0, 0.25, 2.0, 0.0, saves=9,
                               failures=1, local_saves=5, jit_saves=1)  # fmt: skip
    classes = run.tracker.failure_classes
    assert (classes.process.failures, classes.covered, classes.coverage) == (1, 1, 0.5)
    assert run.tracker.state(**run.overrides).jit_save_s == 1.0


def test_a_covered_host_failure_saves_to_durable_storage() -> None:
    result, run = worked([11.5], [("host", True)])
    # the save just in time of step 13 is durable; the restart from it takes 8 s. The
    # cadence counts from it: after the resume, 17 stays local, 21 goes to both tiers …
    assert (result.lost_work_s, result.restart_s, result.jit_saves) == (0.25, 8.0, 1)
    assert (result.saves, result.local_saves, run.durable) == (9, 2 + 3, 37)


def test_a_failure_during_the_save_just_in_time_makes_both_an_uncovered_host_failure() -> None:
    # the save begun at 11.5 is cut at 12.0 by a host failure: the pair is a host failure,
    # the job goes back to durable 8 (8 s from 12.0); as the host failure alone, 0.5 s later
    result, run = worked([11.5, 12.0], [("process", True), ("host", False)])
    assert result == RunResult(48.75, 20.0, 18.0, 2.75, 8.0, 0.0, saves=10, failures=2,
                               local_saves=6, jit_saves=0)  # fmt: skip
    classes = run.tracker.failure_classes
    assert (classes.host.failures, classes.process.failures, classes.covered) == (1, 0, 0)


def test_in_a_warm_up_there_is_nothing_to_save_just_in_time() -> None:
    s = tiered([5.0])
    s = replace(s, first_step_s=10.5)  # 10 s of warm-up: the failure strikes it
    r = _Run(s, TierOracle(EVERY, K), 0)
    r.kinds = Scripted([("process", True)])  # type: ignore[assignment]
    result = r.run()
    assert (result.jit_saves, result.lost_work_s, result.failures) == (0, 0.0, 1)


def test_a_policy_without_a_durable_cadence_saves_to_durable_storage_only() -> None:
    # every 4 steps, 2 s blocking: a process failure has no local save to come back from
    r = _Run(tiered([11.5]), Fixed(steps=4), 0)
    r.kinds = Scripted([("process", False)])  # type: ignore[assignment]
    one = r.run()
    assert (one.local_saves, one.restart_s) == (0, 8.0)
    assert r.local is None and r.tracker.state().local_save_cost_s is None


def test_every_second_is_accounted_for_with_tiers_and_saves_just_in_time() -> None:
    s = sim.from_dict(
        {
            **TIERED,
            "job": {"steps": 20000, "step_time_s": 0.5, "gpus": 4, "first_step_s": 3.0},
            "failures": {"mtbf_gpu_hours": 2000 / 3600, "process_share": 0.6,
                         "peer_share": 0.7, "jit_save_s": 3.0},
        }
    )  # fmt: skip
    for spec in ("default", "oracle", "oracle:tiers=1", "fixed:steps=50"):
        policy, world = setup(spec, s)
        r = sim.run(world, policy, 2)
        parts = r.useful_s + r.checkpoint_overhead_s + r.lost_work_s + r.restart_s + r.warmup_s
        assert r.wall_s == pytest.approx(parts, rel=1e-9), spec
        assert r.jit_saves > 0 and r.failures > 0, spec


def test_the_classes_come_from_their_own_seeded_stream() -> None:
    s = tiered([])
    draws = np.random.default_rng([7, 0xC1A55]).random((300, 2))
    kinds = FailureKinds(replace(s, process_share=0.3, peer_share=0.6), 7)
    got = [kinds.next() for _ in range(300)]  # past a chunk of 256
    assert got == [("process" if u < 0.3 else "host", bool(v < 0.6)) for u, v in draws]
    # the same uniforms whatever the shares: every policy of a comparison meets the same
    other = FailureKinds(replace(s, process_share=0.0, peer_share=0.0), 7)
    assert [other.next() for _ in range(300)] == [("host", False)] * 300


# ------------------------------------------------------------------ scenario fields


def bad(section: str, **fields) -> dict:
    data = {
        "job": {"steps": 10, "step_time_s": 1.0, "gpus": 2},
        "checkpoint": {"blocking_s": 1.0, "slowdown": 0.5},
        "failures": {},
    }
    if section == "checkpoint.local":
        data["checkpoint"]["local"] = {"blocking_s": 0.5, **fields}
    else:
        data[section].update(fields)
    return data


LOCAL = "[checkpoint.local] "
NO_GPUS = {
    **bad("failures", peer_share=0.5, jit_save_s=1.0),
    "job": {"steps": 10, "step_time_s": 1},
}
REFUSALS = [
    (bad("checkpoint.local", blocking_s=-1.0), LOCAL + "blocking_s must be >= 0, got -1.0"),
    (
        bad("checkpoint.local", latency_s=0.25),
        LOCAL + "latency_s must be >= blocking_s, got 0.25",
    ),
    (
        bad("checkpoint.local", slowdown=1.0),
        LOCAL + "slowdown must be a fraction in [0, 1), got 1.0",
    ),
    (
        bad("checkpoint.local", slowdown=0.5),
        LOCAL + "slowdown plus [checkpoint] slowdown (both writes may run at once) must be "
        "< 1, got 0.5",
    ),
    (bad("checkpoint.local", restore_s=-3.0), LOCAL + "restore_s must be >= 0, got -3.0"),
    (
        bad("checkpoint.local", speed=2.0),
        LOCAL + "has unknown key(s) speed; known: blocking_s, latency_s, restore_s, slowdown",
    ),
    (
        bad("checkpoint.local", restore_s="fast"),
        LOCAL + "restore_s must be a float, got 'fast' (str)",
    ),
    (
        {**bad("job"), "checkpoint": {"blocking_s": 1.0, "local": 3}},
        LOCAL + "must be a table, got 3",
    ),
    (
        {**bad("job"), "checkpoint": {"blocking_s": 1.0, "local": {}}},
        LOCAL + "blocking_s is required",
    ),
    (
        bad("failures", process_share=1.5),
        "[failures] process_share must be a share in [0, 1], got 1.5",
    ),
    (bad("failures", peer_share=-0.1), "[failures] peer_share must be a share in [0, 1], got -0.1"),
    (NO_GPUS, "[failures] peer_share needs a survivor: [job] gpus must be >= 2, got 1"),
    (
        bad("failures", peer_share=0.5),
        "[failures] jit_save_s (what a just-in-time save takes) is required with peer_share > 0, "
        "got None",
    ),
    (bad("failures", jit_save_s=-1.0), "[failures] jit_save_s must be >= 0, got -1.0"),
    (
        bad("failures", process_share=True),
        "[failures] process_share must be a float, got True (bool)",
    ),
]


@pytest.mark.parametrize(("data", "message"), REFUSALS)
def test_each_new_field_is_refused_with_its_name_and_value(data, message) -> None:
    with pytest.raises(sim.ScenarioError) as err:
        sim.from_dict(data)
    assert str(err.value) == message


def test_the_new_fields_load_with_their_defaults() -> None:
    s = sim.from_dict({"job": {"steps": 10, "step_time_s": 1.0}, "checkpoint": {"blocking_s": 1.0}})
    assert (s.local, s.process_share, s.peer_share, s.jit_save_s, s.classed) == (
        None, 0.0, 0.0, 0.0, False,
    )  # fmt: skip
    t = tiered([])
    assert (t.local.blocking_s, t.local.latency_s, t.local.slowdown, t.local.restore_s) == (
        0.5, 1.0, 0.5, 2.0,
    )  # fmt: skip
    assert (t.local.save_cost_s, t.save_cost_s, t.classed) == (0.75, 2.5, True)
    only = sim.from_dict(bad("checkpoint.local"))
    assert (only.local.latency_s, only.local.slowdown, only.local.restore_s) == (0.5, 0.0, 0.0)
    assert {"llama3-tiers", "llama3-jit"} <= set(sim.builtin_names())
    j = sim.load("llama3-jit")
    assert (j.process_share, j.peer_share, j.jit_save_s, j.local.restore_s) == (
        0.8,
        0.9,
        30.0,
        120.0,
    )


# ------------------------------------------------------------------ the oracles


def test_the_one_tier_oracle_is_dalys_for_the_uncovered_failures() -> None:
    s = sim.load("llama3-jit")
    policy, world = setup("oracle:tiers=1", s)
    assert policy == Oracle(Daly(save_cost_s=34.5, mtbf_s=policy.daly.mtbf_s), 6.0)
    assert policy.daly.mtbf_s == pytest.approx(s.job_mtbf_s / 0.1, rel=1e-12)
    assert world is s
    policy, world = setup("oracle:tiers=1,jit=off", s)
    assert policy == Oracle(Daly(save_cost_s=34.5, mtbf_s=s.job_mtbf_s), 6.0)
    assert world == replace(s, peer_share=0.0)
    # all covered: planned as 95% covered, as the policy caps it
    policy, _ = setup("oracle:tiers=1", replace(s, peer_share=1.0))
    assert policy.daly.mtbf_s == pytest.approx(s.job_mtbf_s / 0.05)
    # a scenario without a local tier or just-in-time saves: the oracle it always had
    plain = sim.load("llama3-16k")
    assert setup("oracle", plain) == (
        Oracle(Daly(save_cost_s=34.5, mtbf_s=plain.job_mtbf_s), 6.0),
        plain,
    )
    assert setup(" oracle : tiers = 1 ", plain)[0] == setup("oracle", plain)[0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "oracle:tiers=2",
            "oracle: tiers=2 needs a local tier, and scenario 'llama3-16k' has no "
            "[checkpoint.local]",
        ),
        ("oracle:tiers=3", "oracle: tiers must be 1 or 2, got '3'"),
        ("oracle:jit=maybe", "oracle: jit must be on or off, got 'maybe'"),
        ("oracle:speed=1", "oracle has no setting speed; settings: tiers, jit"),
        ("oracle:b=1,a=2", "oracle has no setting a, b; settings: tiers, jit"),
        ("oracle:tiers", "oracle: setting 'tiers' must look like key=value"),
    ],
)
def test_bad_oracle_settings_are_named(spec, message) -> None:
    with pytest.raises(PolicyError) as err:
        setup(spec, sim.load("llama3-16k"))
    assert str(err.value) == message


def test_the_two_tier_oracle_is_the_least_of_its_neighbours() -> None:
    best_tiers.cache_clear()  # searched here, not remembered from an earlier test
    s = sim.load("llama3-tiers")
    policy, _ = setup("oracle", s)
    every, k, how = best_tiers(s)
    assert policy == TierOracle(every, k, how) and how == "searched on the exact steady state"
    cost = lambda e, n: 1 / theory_tiers.steady_state(s, e, n).goodput  # noqa: E731
    best = cost(every, k)
    for e, n in [(every - 1, k), (every + 1, k), (every, k - 1), (every, k + 1)]:
        assert cost(e, n) >= best, (e, n)
    # where the closed form does not apply: the first-order optimum with the true figures
    weibull = replace(s, distribution="weibull", weibull_shape=0.7)
    assert best_tiers(weibull)[2] == "first-order optimum with the true figures"
    # no process failures: every save durable (a local tier saves only restarts)
    assert best_tiers(replace(s, process_share=0.0))[1] == 1


def test_a_worker_runs_an_oracle_on_the_scenario_it_plays() -> None:
    s = replace(sim.load("llama3-jit"), steps=20000)  # about 11 failures
    policy, world = setup("oracle:tiers=1,jit=off", s)
    assert _run_one(s, "oracle:tiers=1,jit=off", 1) == sim.run(world, policy, 1)
    assert _run_one(s, "oracle:tiers=1,jit=off", 1) != sim.run(s, policy, 1)
    a, _ = sim.compare(s, ["oracle:tiers=1,jit=off", "oracle"], 2, jobs=1)
    assert a.runs == tuple(sim.run(world, policy, seed) for seed in range(2))


@pytest.mark.parametrize("least", [1, 2, 7, 10, 29, 30, 31, 89, 90])
@pytest.mark.parametrize("guess", [1, 10, 30])
def test_the_integer_search_finds_the_least_between_a_third_and_three_times_the_guess(
    least: int, guess: int
) -> None:
    from adaptd.sim.oracles import _least

    lo, hi = max(1, guess // 3), max(3, 3 * guess)
    calls: list[int] = []

    def f(x: int) -> float:
        calls.append(x)
        return (x - least) ** 2 + 0.5 * x  # unimodal, least at `least` (ties: the smaller)

    x, fx = _least(f, guess)
    want = min(range(lo, hi + 1), key=lambda v: (f(v), v))
    assert (x, fx) == (want, f(want))
    assert lo <= min(calls) and max(calls) <= hi
    # a plateau: the smallest of the equal values
    assert _least(lambda v: 0.0 if 5 <= v <= 8 else 1.0 + abs(v - 6), 6)[0] == 5


def test_the_oracles_decisions_say_what_they_are() -> None:
    job = JobState(job="j", step=100, start_step=100, step_time_s=3.0, save_cost_s=1.0, mtbf_s=10.0)
    d = TierOracle(20, 4, "searched").decide(Snapshot(time=0.0), job)
    assert d == Decision(next_step=120, every_steps=20, durable_every=4, reason="searched",
                         policy="oracle")  # fmt: skip
    # the one-tier oracle counts its interval in steps of the true step time, not the job's
    one = Oracle(Daly(save_cost_s=8.0, mtbf_s=1e6), step_time_s=1.0)
    tau = one.daly.decide(Snapshot(time=0.0), replace(job, step_time_s=1.0)).interval_s
    assert one.decide(Snapshot(time=0.0), job).every_steps == math.ceil(tau)


def test_two_writes_at_once_slow_compute_by_their_sum_until_each_ends() -> None:
    """(Found by make mutants: in the engine a write's end is always an event, so only the
    closed form's last segment asks for a time past one write's end with another running.)"""
    from adaptd.sim.inflight import Write, Writes

    w = Writes()
    w.add(Write("durable", 8, 4.0, 0.25, 2.0, 4.0))
    w.add(Write("local", 8, 2.0, 0.5, 0.5, 1.0))
    assert [x.tier for x in w.items] == ["local", "durable"]  # soonest end first
    # half-second steps: 1 step by 2 s (a quarter of the pace), 3 more by 4 s, then 2/s
    assert w.time_to(0.0, 5.0, 0.5) == 4.5
    assert w.time_to(0.0, 1.0, 0.5) == 2.0 and w.time_to(2.0, 3.0, 0.5) == 4.0
    assert w.lost(0.0, 5.0) == 0.5 * 2.0 + 0.25 * 4.0
    assert w.lost(2.0, 3.0) == 0.25  # the local write has ended
    assert [w.slowdown(t) for t in (1.0, 2.0, 4.0)] == [0.75, 0.25, 0.0]
    assert [w.durable_at(t) for t in (3.0, 4.0)] == [True, False]
    assert (w.busy_until(("local",)), w.busy_until(("durable",)), w.busy_until(())) == (
        2.0, 4.0, None,
    )  # fmt: skip
    assert bool(w) and w.next_end() == 2.0
    assert w.pop().tier == "local" and w.busy_until(("local",)) is None
    w.clear()
    assert not w and w.next_end() is None and w.slowdown(0.0) == 0.0
