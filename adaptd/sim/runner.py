"""Run several policies over many seeds of one scenario and average the results."""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import IO

from adaptd.core.policy import Policy, PolicyError, parse
from adaptd.fleet.history import FleetHistory
from adaptd.sim.engine import RunResult, run
from adaptd.sim.oracles import ORACLE, Oracle, oracle
from adaptd.sim.scenario import Scenario

__all__ = [
    "FIELDS",
    "ORACLE",
    "Oracle",
    "ProgressBar",
    "Summary",
    "compare",
    "resolve",
    "setup",
]

FIELDS = (
    "wall_s",
    "useful_s",
    "checkpoint_overhead_s",
    "lost_work_s",
    "restart_s",
    "warmup_s",
)


def setup(spec: str, scenario: Scenario) -> tuple[Policy, Scenario]:
    """The policy for ``spec`` and the scenario its runs play: ``oracle[:tiers=1|2,
    jit=on|off]`` is :func:`adaptd.sim.oracles.oracle` for ``scenario`` (``jit=off``
    plays it without just-in-time saves); any other spec is parsed as usual.
    Raises :class:`~adaptd.core.policy.PolicyError` for a bad spec or setting."""
    name, _, rest = spec.strip().partition(":")
    if name.strip() != ORACLE:
        return parse(spec), scenario
    settings: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise PolicyError(f"oracle: setting {item!r} must look like key=value")
        settings[key.strip()] = value.strip().lower()
    return oracle(settings, scenario)


def resolve(spec: str, scenario: Scenario) -> Policy:
    """A policy for ``spec``; ``oracle`` is :class:`Oracle` for ``scenario`` (see
    :func:`setup`, which also says what scenario an oracle's runs play)."""
    return setup(spec, scenario)[0]


@dataclass(frozen=True)
class Summary:
    """Means over seeds for one policy (``policy`` echoes the spec as given)."""

    policy: str
    runs: tuple[RunResult, ...]

    def mean(self, name: str) -> float:
        return statistics.fmean(getattr(r, name) for r in self.runs)

    @property
    def goodput(self) -> float:
        return self.mean("useful_s") / self.mean("wall_s")

    @property
    def waste_s(self) -> float:
        return self.mean("wall_s") - self.mean("useful_s")

    def goodput_stderr(self) -> float:
        if len(self.runs) < 2:
            return 0.0
        return statistics.stdev(r.goodput for r in self.runs) / len(self.runs) ** 0.5

    def as_json(self) -> dict[str, float | str]:
        out: dict[str, float | str] = {"policy": self.policy, "goodput": self.goodput}
        for name in FIELDS:
            out[name] = self.mean(name)
        out["saves"] = self.mean("saves")
        out["failures"] = self.mean("failures")
        return out


def _run_one(
    scenario: Scenario, spec: str, seed: int, fleet: FleetHistory | None = None
) -> RunResult:
    policy, world = setup(spec, scenario)
    return run(world, policy, seed, fleet)


def compare(
    scenario: Scenario,
    specs: Sequence[str],
    seeds: int,
    progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
    fleet: FleetHistory | None = None,
) -> list[Summary]:
    """Every policy on seeds ``0..seeds-1``; the same seed gives every policy the
    same failure times, so differences come from the policies alone.

    ``jobs``: worker processes (default: the CPU count; 1 runs in this process).
    Results do not depend on it. ``progress(done, total)`` is called after each run.
    Raises :class:`~adaptd.core.policy.PolicyError` for a bad spec before anything runs.
    ``fleet``: every run's job starts from a fleet history (:func:`adaptd.sim.engine.run`).
    """
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    for spec in specs:
        resolve(spec, scenario)  # fail fast, in this process, with the spec's error
    tasks = [(i, spec, seed) for i, spec in enumerate(specs) for seed in range(seeds)]
    jobs = min(jobs or os.cpu_count() or 1, len(tasks))
    results: dict[tuple[int, int], RunResult] = {}
    if jobs <= 1:
        setups = [setup(spec, scenario) for spec in specs]
        for n, (i, _spec, seed) in enumerate(tasks, 1):
            policy, world = setups[i]
            results[i, seed] = run(world, policy, seed, fleet)
            if progress is not None:
                progress(n, len(tasks))
    else:
        ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = {
                pool.submit(_run_one, scenario, spec, seed, fleet): (i, seed)
                for i, spec, seed in tasks
            }
            for n, fut in enumerate(as_completed(futures), 1):
                results[futures[fut]] = fut.result()
                if progress is not None:
                    progress(n, len(tasks))
    return [
        Summary(spec, tuple(results[i, seed] for seed in range(seeds)))
        for i, spec in enumerate(specs)
    ]


class ProgressBar:
    """A one-line bar on a terminal; silent when the stream is not a TTY."""

    def __init__(self, stream: IO[str] | None = None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.width = width
        self.start = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        filled = int(self.width * done / total)
        elapsed = time.monotonic() - self.start
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r[{bar}] {done}/{total} runs {elapsed:5.1f}s")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()
