"""The runner around the engine: what ``compare`` promises, the summaries the CLI prints,
the oracle, and the progress bar. (The engine and the closed form: test_sim.py and
test_theory.py; found missing by ``make mutants``, docs/testing.md.)"""

from __future__ import annotations

import io
import statistics
import sys
from dataclasses import replace

import pytest

from adaptd import sim
from adaptd.core.policy import PolicyError
from adaptd.core.snapshot import JobState, Snapshot
from adaptd.fleet.history import FleetHistory
from adaptd.policies import Daly
from adaptd.sim.engine import RunResult
from adaptd.sim.runner import FIELDS, Oracle, ProgressBar, Summary, _run_one, resolve
from tests.sim.test_sim import scenario


def result(wall: float, useful: float, saves: int = 3, failures: int = 1) -> RunResult:
    rest = wall - useful
    return RunResult(
        wall_s=wall,
        useful_s=useful,
        checkpoint_overhead_s=rest / 2,
        lost_work_s=rest / 4,
        restart_s=rest / 8,
        warmup_s=rest / 8,
        saves=saves,
        failures=failures,
    )


def test_a_summary_is_the_mean_over_seeds() -> None:
    runs = (result(100.0, 80.0, 2, 0), result(200.0, 120.0, 5, 3))
    s = Summary("daly", runs)
    assert s.mean("wall_s") == 150.0 and s.mean("saves") == 3.5
    assert s.goodput == 100.0 / 150.0  # the ratio of the means, not the mean of ratios
    assert s.waste_s == 50.0
    assert s.goodput_stderr() == pytest.approx(statistics.stdev([0.8, 0.6]) / 2**0.5)
    assert Summary("daly", runs[:1]).goodput_stderr() == 0.0
    assert s.as_json() == {
        "policy": "daly",
        "goodput": 100.0 / 150.0,
        "wall_s": 150.0,
        "useful_s": 100.0,
        "checkpoint_overhead_s": 25.0,
        "lost_work_s": 12.5,
        "restart_s": 6.25,
        "warmup_s": 6.25,
        "saves": 3.5,
        "failures": 1.5,
    }
    assert list(s.as_json()) == ["policy", "goodput", *FIELDS, "saves", "failures"]


def test_the_oracle_is_daly_with_the_true_figures_and_step_time() -> None:
    s = scenario()
    oracle = resolve(" oracle ", s)
    assert oracle == Oracle(Daly(save_cost_s=s.save_cost_s, mtbf_s=s.job_mtbf_s), s.step_time_s)
    job = JobState(job="a", step=10, time=100.0, step_time_s=7.0, save_cost_s=99.0, mtbf_s=1.0)
    truth = Daly(save_cost_s=s.save_cost_s, mtbf_s=s.job_mtbf_s)
    snap = Snapshot(time=100.0)
    assert oracle.decide(snap, job) == truth.decide(snap, replace(job, step_time_s=s.step_time_s))
    assert resolve("fixed:steps=5", s) == sim.resolve("fixed:steps=5", s)


@pytest.mark.parametrize("jobs", [1, 2])
def test_compare_reports_progress_and_keeps_the_order_of_the_specs(jobs) -> None:
    s = scenario(job__steps=5_000)
    calls: list[tuple[int, int]] = []
    out = sim.compare(
        s, ["fixed:steps=300", "oracle"], 2, progress=lambda d, t: calls.append((d, t)), jobs=jobs
    )
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [x.policy for x in out] == ["fixed:steps=300", "oracle"]
    for x, spec in zip(out, ["fixed:steps=300", "oracle"], strict=True):
        assert x.runs == tuple(sim.run(s, sim.resolve(spec, s), seed) for seed in range(2))


def test_compare_refuses_no_seeds_and_bad_specs_before_running() -> None:
    s = scenario()
    with pytest.raises(ValueError, match=r"^--seeds must be >= 1, got 0$"):
        sim.compare(s, ["daly"], 0)
    calls: list[tuple[int, int]] = []
    with pytest.raises(PolicyError):
        sim.compare(s, ["daly", "no-such-policy"], 1, progress=lambda d, t: calls.append((d, t)))
    assert calls == []


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_one_line_on_a_terminal() -> None:
    out = Tty()
    bar = ProgressBar(out, width=10)
    bar(1, 4)
    first = out.getvalue()
    assert first.startswith("\r[##--------] 1/4 runs ") and first.endswith("s")
    assert "\n" not in first
    bar(4, 4)
    assert out.getvalue()[len(first) :].startswith("\r[##########] 4/4 runs ")
    assert out.getvalue().endswith("s\n")
    wide = Tty()
    ProgressBar(wide)(3, 10)
    assert wide.getvalue().startswith("\r[" + "#" * 9 + "-" * 21 + "] 3/10 runs ")


def test_the_progress_bar_is_silent_off_a_terminal() -> None:
    out = io.StringIO()
    bar = ProgressBar(out)
    bar(1, 1)
    assert out.getvalue() == "" and not bar.enabled
    assert ProgressBar().stream is sys.stderr


def test_a_worker_runs_what_this_process_would() -> None:
    """``_run_one`` is what each worker process of ``compare`` runs (in a child, out of
    the test's sight): it must resolve the spec as the parent does, fleet included."""
    s = scenario(job__steps=5_000)
    assert _run_one(s, "oracle", 3) == sim.run(s, resolve("oracle", s), 3)
    assert _run_one(s, "fixed:steps=300", 1) == sim.run(s, resolve("fixed:steps=300", s), 1)


@pytest.mark.parametrize("jobs", [1, 2])
def test_compare_gives_every_run_the_fleet_history(jobs) -> None:
    s = replace(sim.load("weibull-fleet"), steps=20_000)
    fleet = FleetHistory(gpus=2 * s.gpus, days=5.0, job_gpus=s.gpus)
    out = sim.compare(s, ["default"], 2, jobs=jobs, fleet=fleet)
    assert out[0].runs == tuple(sim.run(s, resolve("default", s), seed, fleet) for seed in (0, 1))
    assert out[0].runs != tuple(sim.run(s, resolve("default", s), seed) for seed in (0, 1))
    assert _run_one(s, "default", 1, fleet) == out[0].runs[1]


def test_the_progress_bar_shows_the_time_since_it_started() -> None:
    out = Tty()
    ProgressBar(out, width=4)(1, 2)
    elapsed = float(out.getvalue().rsplit("runs", 1)[1].strip().rstrip("s"))
    assert 0.0 <= elapsed < 60.0
