"""Scenario files: every field read as written, every default, every refusal with the
field and the value, and the storage phases' clock. (The engine: test_sim.py; found
missing by ``make mutants``, docs/testing.md.)"""

from __future__ import annotations

import math
import re

import pytest

from adaptd import sim
from adaptd.sim.scenario import Phase, Scenario

FULL = {
    "name": "full",
    "description": "every key",
    "job": {"steps": 1000, "step_time_s": 0.5, "first_step_s": 3.0, "gpus": 8},
    "checkpoint": {"blocking_s": 2.0, "latency_s": 10.0, "slowdown": 0.25, "restore_s": 30.0},
    "failures": {
        "distribution": "weibull",
        "mtbf_gpu_hours": 2000.0,
        "weibull_shape": 0.7,
        "trace": [300, 100.5, 200],
    },
    "phases": [
        {"start_s": 10.0, "end_s": 20.0, "blocking_factor": 3.0, "latency_factor": 5.0},
        {"start_s": 0.0, "end_s": 5.0, "every_s": 50.0},
    ],
}


def test_every_field_is_read_as_written() -> None:
    assert sim.from_dict(FULL) == Scenario(
        name="full",
        description="every key",
        steps=1000,
        step_time_s=0.5,
        first_step_s=3.0,
        gpus=8,
        blocking_s=2.0,
        latency_s=10.0,
        slowdown=0.25,
        restore_s=30.0,
        distribution="weibull",
        mtbf_gpu_hours=2000.0,
        weibull_shape=0.7,
        trace=(100.5, 200.0, 300.0),
        phases=(
            Phase(10.0, 20.0, blocking_factor=3.0, latency_factor=5.0),
            Phase(0.0, 5.0, every_s=50.0),
        ),
    )


def test_every_default() -> None:
    s = sim.from_dict({"job": {"steps": 10, "step_time_s": 1}, "checkpoint": {"blocking_s": 4}})
    assert s == Scenario(
        name="scenario",
        description="",
        steps=10,
        step_time_s=1.0,
        first_step_s=None,
        gpus=1,
        blocking_s=4.0,
        latency_s=4.0,  # a synchronous save unless told
        slowdown=0.0,
        restore_s=0.0,
        distribution="exponential",
        mtbf_gpu_hours=50_000.0,
        weibull_shape=1.0,
        trace=None,
        phases=(),
    )
    assert isinstance(s.step_time_s, float) and isinstance(s.blocking_s, float)
    assert sim.from_dict({**FULL, "name": ""}, default_name="file").name == "file"


def changed(path: str, value) -> dict:
    section, key = path.split(".")
    return {**FULL, section: {**FULL[section], key: value}}


def without(path: str) -> dict:
    section, key = path.split(".")
    return {**FULL, section: {k: v for k, v in FULL[section].items() if k != key}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (without("job.steps"), "[job] steps is required"),
        (without("checkpoint.blocking_s"), "[checkpoint] blocking_s is required"),
        (changed("job.steps", "5"), "[job] steps must be a int, got '5' (str)"),
        (changed("job.steps", True), "[job] steps must be a int, got True (bool)"),
        (changed("job.step_time_s", "1"), "[job] step_time_s must be a float, got '1' (str)"),
        (changed("job.step_time_s", True), "[job] step_time_s must be a float, got True (bool)"),
        (
            changed("checkpoint.blocking_s", math.inf),
            "[checkpoint] blocking_s must be a finite number, got inf",
        ),
        (changed("job.steps", 0), "[job] steps must be >= 1, got 0"),
        (changed("job.step_time_s", 0), "[job] step_time_s must be > 0, got 0.0"),
        (
            changed("job.first_step_s", 0.4),
            "[job] first_step_s (the first step of each incarnation) must be >= step_time_s, "
            "got 0.4",
        ),
        (changed("job.gpus", 0), "[job] gpus must be >= 1, got 0"),
        (
            changed("checkpoint.blocking_s", -1),
            "[checkpoint] blocking_s must be >= 0, got -1.0",
        ),
        (
            changed("checkpoint.latency_s", 1.9),
            "[checkpoint] latency_s (save call to durable) must be >= blocking_s, got 1.9",
        ),
        (
            changed("checkpoint.slowdown", 1),
            "[checkpoint] slowdown must be a fraction in [0, 1), got 1.0",
        ),
        (
            changed("checkpoint.slowdown", -0.1),
            "[checkpoint] slowdown must be a fraction in [0, 1), got -0.1",
        ),
        (changed("checkpoint.restore_s", -1), "[checkpoint] restore_s must be >= 0, got -1.0"),
        (
            changed("failures.distribution", "gamma"),
            '[failures] distribution must be "exponential" or "weibull", got \'gamma\'',
        ),
        (changed("failures.mtbf_gpu_hours", 0), "[failures] mtbf_gpu_hours must be > 0, got 0.0"),
        (
            changed("failures.hang_share", 1.5),
            "[failures] hang_share must be a share in [0, 1], got 1.5",
        ),
        (changed("failures.hang_detect_s", 0), "[failures] hang_detect_s must be > 0, got 0.0"),
        (
            {**changed("failures.hang_share", 0.5), "job": {**FULL["job"], "gpus": 1}},
            "[failures] hang_share needs ranks that wait on the hung one: [job] gpus must be >= 2, "
            "got 1",
        ),
        (
            changed("failures.weibull_shape", 0.049),
            "[failures] weibull_shape must be in [0.05, 20], got 0.049",
        ),
        (
            changed("failures.weibull_shape", 20.5),
            "[failures] weibull_shape must be in [0.05, 20], got 20.5",
        ),
        (
            changed("failures.trace", [1, "x"]),
            "[failures] trace must be a list of seconds, got [1, 'x']",
        ),
        (
            changed("failures.trace", [1, None]),
            "[failures] trace must be a list of seconds, got [1, None]",
        ),
        (
            changed("failures.trace", [1, -2]),
            "[failures] trace times must be finite and >= 0 seconds, got [1, -2]",
        ),
        (
            changed("job.color", 1),
            "[job] has unknown key(s) color; known: first_step_s, gpus, step_time_s, steps",
        ),
        (
            {**FULL, "extra": 1, "more": 2},
            "[top level] has unknown key(s) extra, more; known: checkpoint, description, "
            "failures, job, name, phases",
        ),
        (
            changed("checkpoint.speed", 1),
            "[checkpoint] has unknown key(s) speed; "
            "known: blocking_s, latency_s, restore_s, slowdown",
        ),
        (
            changed("failures.rate", 1),
            "[failures] has unknown key(s) rate; "
            "known: distribution, hang_detect_s, hang_share, jit_save_s, mtbf_gpu_hours, "
            "peer_share, process_share, trace, weibull_shape",
        ),
        (
            {**FULL, "phases": [{"start_s": 5.0, "end_s": 5.0}]},
            "[phases.0] needs 0 <= start_s < end_s, got 5.0, 5.0",
        ),
        (
            {**FULL, "phases": [{"start_s": 0.0, "end_s": 1.0}, {"start_s": -1.0, "end_s": 1.0}]},
            "[phases.1] needs 0 <= start_s < end_s, got -1.0, 1.0",
        ),
        (
            {**FULL, "phases": [{"start_s": 0.0, "end_s": 1.0, "blocking_factor": 0.0}]},
            "[phases.0] factors must be > 0",
        ),
        (
            {**FULL, "phases": [{"start_s": 0.0, "end_s": 1.0, "latency_factor": -1.0}]},
            "[phases.0] factors must be > 0",
        ),
        (
            {**FULL, "phases": [{"start_s": 0.0, "end_s": 10.0, "every_s": 9.0}]},
            "[phases.0] every_s must be >= end_s - start_s, got 9.0",
        ),
        (
            {**FULL, "phases": [{"start_s": 0.0, "end_s": 10.0, "period": 9.0}]},
            "[phases.0] has unknown key(s) period; "
            "known: blocking_factor, end_s, every_s, latency_factor, start_s",
        ),
        ({**FULL, "phases": [{"end_s": 10.0}]}, "[phases.0] start_s is required"),
    ],
)
def test_each_refusal_names_the_field_and_the_value(data, message) -> None:
    with pytest.raises(sim.ScenarioError, match=f"^{re.escape(message)}$"):
        sim.from_dict(data)
    with pytest.raises(sim.ScenarioError, match=f"^{re.escape('f.toml: ' + message)}$"):
        sim.from_dict(data, where="f.toml")


def test_values_at_the_bounds_are_accepted() -> None:
    for path, value in [
        ("job.steps", 1),
        ("job.gpus", 1),
        ("job.first_step_s", 0.5),  # as long as the other steps
        ("checkpoint.blocking_s", 0.0),
        ("checkpoint.slowdown", 0.0),
        ("checkpoint.restore_s", 0.0),
        ("failures.weibull_shape", 0.05),
        ("failures.weibull_shape", 20),
        ("failures.trace", [0]),
    ]:
        data = changed(path, value)
        if path == "checkpoint.blocking_s":
            data["checkpoint"]["latency_s"] = 0.0
        sim.from_dict(data)
    sim.from_dict(changed("checkpoint.latency_s", 2.0))  # durable when the call returns
    sim.from_dict({**FULL, "phases": [{"start_s": 0.0, "end_s": 10.0, "every_s": 10.0}]})


def test_a_file_is_named_by_its_stem_and_its_errors_by_its_path(tmp_path) -> None:
    path = tmp_path / "my-run.toml"
    path.write_text("[job]\nsteps = 10\nstep_time_s = 1.0\n[checkpoint]\nblocking_s = 2.0\n")
    assert sim.load(path).name == "my-run"
    assert sim.load(str(path)).steps == 10
    path.write_text("[job]\nsteps = 0\nstep_time_s = 1.0\n[checkpoint]\nblocking_s = 2.0\n")
    with pytest.raises(sim.ScenarioError, match=f"^{re.escape(str(path))}: \\[job\\] steps must"):
        sim.load(path)
    path.write_text("[job\n")
    with pytest.raises(sim.ScenarioError, match=f"^{re.escape(str(path))}: not valid TOML: "):
        sim.load(path)


def test_a_builtin_is_named_by_its_name() -> None:
    assert sim.load("nfs-storm").name == "nfs-storm"
    with pytest.raises(
        sim.ScenarioError,
        match=r"^scenario 'nope' is neither a file nor a built-in scenario \(built-in: "
        r"llama3-16k, llama3-jit, llama3-tiers, nfs-storm, seed-article, slow-first-step, "
        r"weibull-fleet\)$",
    ):
        sim.load("nope")


@pytest.mark.parametrize(
    ("t", "active", "boundary"),
    [
        (0.0, False, 10.0),
        (9.99, False, 10.0),
        (10.0, True, 20.0),
        (19.99, True, 20.0),
        (20.0, False, math.inf),
        (500.0, False, math.inf),
    ],
)
def test_a_one_off_phase(t, active, boundary) -> None:
    p = Phase(10.0, 20.0)
    assert (p.active(t), p.next_boundary(t)) == (active, boundary)


@pytest.mark.parametrize(
    ("t", "active", "boundary"),
    [
        (5.0, False, 10.0),
        (10.0, True, 20.0),
        (20.0, False, 60.0),  # the next one starts every_s = 50 after the first
        (59.0, False, 60.0),
        (60.0, True, 70.0),
        (65.0, True, 70.0),
        (70.0, False, 110.0),
    ],
)
def test_a_repeating_phase(t, active, boundary) -> None:
    p = Phase(10.0, 20.0, every_s=50.0)
    assert (p.active(t), p.next_boundary(t)) == (active, boundary)


def test_phase_factors_multiply_where_phases_overlap() -> None:
    s = sim.from_dict(
        {
            **FULL,
            "phases": [
                {"start_s": 0.0, "end_s": 10.0, "blocking_factor": 2.0, "latency_factor": 3.0},
                {"start_s": 5.0, "end_s": 15.0, "blocking_factor": 5.0},
            ],
        }
    )
    assert s.factors(1.0) == (2.0, 3.0)
    assert s.factors(7.0) == (10.0, 3.0)
    assert s.factors(12.0) == (5.0, 1.0)
    assert s.factors(20.0) == (1.0, 1.0)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("job.first_step_s", "float"),
        ("job.gpus", "int"),
        ("checkpoint.latency_s", "float"),
        ("checkpoint.slowdown", "float"),
        ("checkpoint.restore_s", "float"),
        ("failures.distribution", "str"),
        ("failures.mtbf_gpu_hours", "float"),
        ("failures.weibull_shape", "float"),
        ("failures.trace", "list"),
    ],
)
def test_a_wrong_type_is_named_with_its_section(path, kind) -> None:
    section, key = path.split(".")
    value = 7 if kind == "str" else "x"
    message = f"[{section}] {key} must be a {kind}, got {value!r} ({type(value).__name__})"
    with pytest.raises(sim.ScenarioError, match=f"^{re.escape(message)}$"):
        sim.from_dict(changed(path, value))


@pytest.mark.parametrize(
    "key", ["start_s", "end_s", "blocking_factor", "latency_factor", "every_s"]
)
def test_a_wrong_type_in_a_phase_names_the_phase(key) -> None:
    phase = {"start_s": 0.0, "end_s": 10.0, key: "x"}
    with pytest.raises(
        sim.ScenarioError, match=f"^{re.escape(f'[phases.0] {key} must be a float')}"
    ):
        sim.from_dict({**FULL, "phases": [phase]})


def test_phase_bounds() -> None:
    with pytest.raises(sim.ScenarioError, match=r"^\[phases.0\] factors must be > 0$"):
        sim.from_dict({**FULL, "phases": [{"start_s": 0.0, "end_s": 1.0, "latency_factor": 0.0}]})
    # a phase from 10 s to 20 s may repeat every 15 s (longer than the phase itself)
    sim.from_dict({**FULL, "phases": [{"start_s": 10.0, "end_s": 20.0, "every_s": 15.0}]})
