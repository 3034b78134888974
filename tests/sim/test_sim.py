"""The simulator: determinism, accounting, common random numbers, the slow first step
and what the tracker hears. Agreement with the closed form: test_theory.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from adaptd import sim
from adaptd.core.estimators import JobTracker
from adaptd.policies import Fixed
from adaptd.sim.engine import FailureClock, _Run

ADAPTD = [sys.executable, "-c", "import sys; from adaptd.cli import main; sys.exit(main())"]

# A short job that fails often, so a few seconds of simulation hold many failures.
FAST = {
    "name": "fast",
    "job": {"steps": 200_000, "step_time_s": 1.0, "gpus": 1},
    "checkpoint": {"blocking_s": 5.0, "latency_s": 20.0, "slowdown": 0.1, "restore_s": 60.0},
    "failures": {"distribution": "exponential", "mtbf_gpu_hours": 5000 / 3600},
}


def scenario(**changes) -> sim.Scenario:
    data = json.loads(json.dumps(FAST))
    for key, value in changes.items():
        section, name = key.split("__")
        data[section][name] = value
    return sim.from_dict(data)


def test_same_seed_same_result_and_seeds_differ() -> None:
    s = scenario()
    a, b = sim.run(s, sim.resolve("default", s), 3), sim.run(s, sim.resolve("default", s), 3)
    assert a == b
    assert sim.run(s, sim.resolve("default", s), 4) != a


def test_every_second_is_accounted_for() -> None:
    for name in ("fast", "nfs-storm", "slow-first-step"):
        s = scenario() if name == "fast" else sim.load(name)
        for spec in ("fixed:steps=50", "default", "phased"):
            r = sim.run(s, sim.resolve(spec, s), 1)
            parts = r.useful_s + r.checkpoint_overhead_s + r.lost_work_s + r.restart_s + r.warmup_s
            assert r.wall_s == pytest.approx(parts, rel=1e-9)
            assert r.useful_s == s.steps * s.step_time_s


def test_common_random_numbers_give_every_policy_the_same_failures() -> None:
    s = scenario()
    c1, c2 = FailureClock(s, 5), FailureClock(s, 5)
    assert [c1.next() for _ in range(600)] == [c2.next() for _ in range(600)]
    r1 = _Run(s, Fixed(steps=50), 5)
    r2 = _Run(s, Fixed(steps=5000), 5)
    assert r1.next_fail == r2.next_fail


def test_storm_phases_slow_saves_and_the_tracker_follows() -> None:
    s = sim.load("nfs-storm")
    assert s.factors(7200.0) == (10.0, 10.0) and s.factors(7199.0) == (1.0, 1.0)
    assert s.factors(7200.0 + 21600.0 * 3 + 100) == (10.0, 10.0)
    assert s.next_boundary(0.0) == 7200.0 and s.next_boundary(8000.0) == 10800.0
    assert s.next_boundary(10800.0) == 28800.0


def test_online_learning_matches_the_truth() -> None:
    s = sim.load("llama3-16k")
    r = _Run(s, sim.resolve("daly", s), 0)
    r.run()
    assert r.tracker.save_cost_s == pytest.approx(s.save_cost_s)
    # as the daemon does, a restart ends with the first step report: it includes the step
    assert r.tracker.restore_s == pytest.approx(s.restore_s + s.step_time_s)
    # failures during a restart are invisible to a daemon, so M is a little high
    assert r.tracker.mtbf_s == pytest.approx(s.job_mtbf_s, rel=0.1)


def test_trace_replays_given_failure_times() -> None:
    s = scenario(failures__trace=[1000.0])
    r = sim.run(s, Fixed(steps=500), 0)
    assert r.failures == 1
    # save at step 500 (t=500), blocked 5 s, written until t=520 at 90% speed, then full
    # speed: at t=1000 the job is at step 500 + 13.5 + 480; all past 500 is lost
    assert r.lost_work_s == pytest.approx(493.5)
    assert r.restart_s == 60.0


class Heard(JobTracker):
    """The real tracker, keeping a log of the step reports and restarts it was given."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []

    def on_steps(self, time, step, count, mean_s, save_in_flight=False, **signals) -> None:
        self.log.append(("steps", time, step, count, mean_s))
        if signals.get("warmup"):
            self.log.append(("warmup", time, signals.get("max_s")))
        super().on_steps(time, step, count, mean_s, save_in_flight, **signals)

    def on_restart(self, restore_s: float) -> None:
        self.log.append(("restart", restore_s))
        super().on_restart(restore_s)


def test_the_first_step_of_every_incarnation_is_slow_and_reported_alone() -> None:
    """A 31 s first step (30 s of warm-up), a failure at t=200: the start and the
    restart each spend the warm-up, and each first step reaches the tracker as a
    report of one step with its real duration, as the hook would send it."""
    s = scenario(job__steps=1000, job__first_step_s=31.0, failures__trace=[200.0])
    r = _Run(s, Fixed(steps=100), 0)
    r.tracker = heard = Heard("sim", gpus=s.gpus)
    out = r.run()
    # warm-up to t=30; save at step 100 (t=130), blocked 5 s, written until t=150 at 90%
    # speed: step 113.5; at t=200 step 163.5, 63.5 s lost; restart 60 s, warm-up 30 s
    assert out.warmup_s == 60.0 and out.lost_work_s == pytest.approx(63.5)
    assert out.restart_s == 60.0 and out.failures == 1
    # then 900 steps with saves at 200, ..., 900 (6.5 s each): t = 290 + 900 + 8 x 6.5
    assert out.wall_s == pytest.approx(1242.0)
    assert out.saves == 9
    firsts = [e for e in heard.log if e[0] == "steps" and e[3] == 1 and e[4] > 1.5]
    assert firsts == [("steps", 31.0, 1, 1, 31.0), ("steps", 291.0, 101, 1, 31.0)]
    # each says it is the warm-up, with that step as its slowest, as the hook's does;
    # the estimator leaves it out, and the report a second later gives the pace
    assert [e for e in heard.log if e[0] == "warmup"] == [("warmup", 31.0, 31.0),
                                                          ("warmup", 291.0, 31.0)]  # fmt: skip
    assert heard.step_time_s == pytest.approx(1.0, rel=0.02)
    # the daemon ends a restart at the first step report: vanished at 200, heard at 291
    assert ("restart", 91.0) in heard.log
    assert heard.restore_s == 91.0


def test_a_500k_step_run_is_event_driven_and_fast() -> None:
    s = sim.load("llama3-16k")
    start = time.process_time()
    r = sim.run(s, Fixed(steps=500), 0)
    assert time.process_time() - start < 2.0  # a loop per step would take far longer
    assert r.saves > 900


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"checkpoint__latency_s": 1.0}, "latency_s"),
        ({"checkpoint__slowdown": 1.0}, "slowdown"),
        ({"failures__distribution": "gamma"}, "distribution"),
        ({"job__steps": "many"}, "steps must be a int"),
        ({"job__color": 1}, "unknown key"),
        ({"job__first_step_s": 0.5}, "first_step_s"),
        ({"job__first_step_s": math.inf}, "first_step_s must be a finite number"),
        ({"checkpoint__restore_s": math.nan}, "restore_s must be a finite number"),
        ({"failures__trace": [10.0, math.nan]}, "trace times must be finite"),
    ],
)
def test_bad_scenarios_name_the_field(change, message) -> None:
    with pytest.raises(sim.ScenarioError, match=message):
        scenario(**change)


def test_builtin_scenarios_load() -> None:
    assert sim.builtin_names() == [
        "llama3-16k",
        "llama3-jit",
        "llama3-tiers",
        "nfs-storm",
        "seed-article",
        "slow-first-step",
        "weibull-fleet",
    ]
    s = sim.load("llama3-16k")
    assert s.gpus == 16384 and s.blocking_s == 30.0
    assert s.job_mtbf_s == pytest.approx(50000 * 3600 / 16384)
    assert sim.load("weibull-fleet").weibull_shape == 0.7
    with pytest.raises(sim.ScenarioError, match="built-in"):
        sim.load("no-such-scenario")


def test_cli_json_contract(tmp_path) -> None:
    path = tmp_path / "small.toml"
    path.write_text(
        "[job]\nsteps = 20000\nstep_time_s = 1.0\ngpus = 8\n"
        "[checkpoint]\nblocking_s = 2.0\nlatency_s = 10.0\nslowdown = 0.1\nrestore_s = 30\n"
        '[failures]\ndistribution = "weibull"\nmtbf_gpu_hours = 20\nweibull_shape = 0.7\n'
    )
    out = subprocess.run(
        [
            *ADAPTD,
            "simulate",
            "--scenario",
            str(path),
            "--policy",
            "fixed:steps=50",
            "--policy",
            "oracle",
            "--policy",
            "default",
            "--seeds",
            "3",
            "--json",
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["scenario"] == "small"
    assert [r["policy"] for r in doc["results"]] == ["fixed:steps=50", "oracle", "default"]
    keys = {
        "policy",
        "goodput",
        "wall_s",
        "useful_s",
        "checkpoint_overhead_s",
        "lost_work_s",
        "restart_s",
        "warmup_s",
        "saves",
        "failures",
    }
    for r in doc["results"]:
        assert set(r) == keys
        assert r["goodput"] == pytest.approx(r["useful_s"] / r["wall_s"])
        assert r["useful_s"] == 20000.0
    assert out.stderr == ""  # no progress bar when stderr is not a terminal
    # same seeds, same failures: every policy sees the same count before restarts differ
    bad = subprocess.run(
        [
            *ADAPTD,
            "simulate",
            "--scenario",
            str(path),
            "--policy",
            "fixed:steps=0",
            "--seeds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--policy" in bad.stderr and "steps" in bad.stderr


def test_parallel_and_serial_comparisons_agree() -> None:
    s = scenario(job__steps=20_000)
    serial = sim.compare(s, ["daly", "fixed:steps=100"], 3, jobs=1)
    parallel = sim.compare(s, ["daly", "fixed:steps=100"], 3, jobs=2)
    assert [x.runs for x in serial] == [x.runs for x in parallel]


def test_hangs_wait_until_found_and_count_as_waste() -> None:
    """Every failure a hang found after 120 s: each is waited for (``hang_s``), in the
    waste; the daemon's threshold for llama3-16k (6 s steps, 600 s restart) is a minute
    or so, well under the timeout, and wastes less on the same seed."""
    from dataclasses import replace

    from adaptd import sim
    from adaptd.core.policy import parse
    from adaptd.sim.engine import run as run_once

    base = replace(sim.load("llama3-16k"), steps=20_000, hang_share=1.0, hang_detect_s=120.0)
    timeout = run_once(base, parse("fixed:steps=300"), seed=3)
    assert timeout.hangs > 0 and timeout.hang_s == pytest.approx(timeout.hangs * 120.0)
    assert timeout.waste_s >= timeout.hang_s
    model = replace(base, hang_detect_s=None)
    assert 30.0 < model.hang_detection_s < 120.0, model.hang_detection_s
    daemon = run_once(model, parse("fixed:steps=300"), seed=3)
    assert daemon.hang_s == pytest.approx(daemon.hangs * model.hang_detection_s)
    assert daemon.hang_s < timeout.hang_s
