"""The simulator's fleet input: a job that starts from a fleet's history drawn from the
scenario's own distribution (docs/simulator.md, "A fleet's history")."""

from __future__ import annotations

import dataclasses

import pytest

from adaptd import sim
from adaptd.core.estimators import PRIOR_GPU_MTBF_S
from adaptd.fleet.history import FleetHistory
from adaptd.policies import Default
from adaptd.sim.engine import _Run


def test_the_job_starts_from_the_fleets_rate_and_shape():
    s = sim.load("weibull-fleet")
    alone = _Run(s, Default(), seed=3)
    fleet = _Run(s, Default(), seed=3, fleet=FleetHistory())
    assert alone.tracker.mtbf_s == pytest.approx(PRIOR_GPU_MTBF_S / s.gpus)  # the prior
    assert abs(fleet.tracker.mtbf_s - s.job_mtbf_s) < 0.25 * s.job_mtbf_s
    assert alone.fleet is None
    assert fleet.fleet is not None and fleet.fleet.bursty  # shape 0.7, credibly below 1


def test_a_4x_worse_fleet_moves_m_from_the_prior_and_a_seed_gives_one_run():
    s = dataclasses.replace(sim.load("llama3-16k"), mtbf_gpu_hours=PRIOR_GPU_MTBF_S / 4 / 3600)
    run = _Run(s, Default(), seed=1, fleet=FleetHistory())
    assert run.tracker.mtbf_s < 0.4 * PRIOR_GPU_MTBF_S / s.gpus
    assert run.fleet is not None and not run.fleet.bursty  # exponential: Daly stays
    a = sim.run(s, Default(), 1, FleetHistory())
    assert a == sim.run(s, Default(), 1, FleetHistory())
    assert a != sim.run(s, Default(), 1)
