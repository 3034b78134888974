"""Failures learned by the fleet: the shape posterior, the pooled rate, and a new member
that reads what the others published."""

from __future__ import annotations

import numpy as np
import pytest
from fleet_helpers import Etcd, settings

from adaptd.core.estimators import PRIOR_GPU_MTBF_S, FailureRate
from adaptd.core.model import weibull_scale
from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.failures import FailureRecord, fit_shape, fleet_rate, pooled

GPU_MTBF_S = 12_500 * 3600.0  # 4x worse than the prior


def weibull_lifetimes(shape: float, n: int, seed: int, gpus: int = 1024):
    """``n`` failed lifetimes (GPU-seconds) of jobs of ``gpus`` GPUs whose per-GPU MTBF is
    GPU_MTBF_S: the job's age at failure is Weibull with the job's MTBF."""
    rng = np.random.default_rng(seed)
    ages = weibull_scale(GPU_MTBF_S / gpus, shape) * rng.weibull(shape, n)
    return list(ages * gpus)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_bursty_fleet_is_credibly_below_one(seed):
    fit = fit_shape(weibull_lifetimes(0.7, 150, seed))
    assert fit is not None
    assert fit.low <= 0.7 <= fit.high
    assert fit.credibly_below(1.0)
    assert fit.failures == 150


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_exponential_fleet_is_not(seed):
    fit = fit_shape(weibull_lifetimes(1.0, 150, seed))
    assert fit is not None and fit.low <= 1.0 <= fit.high
    assert not fit.credibly_below(1.0)


def test_few_failures_give_a_wide_interval_or_none():
    assert fit_shape([1e6]) is None  # one failure: no fit
    few = fit_shape(weibull_lifetimes(0.7, 4, seed=7))
    assert few is not None and not few.credibly_below(1.0)  # 4 failures prove nothing


def test_jobs_of_every_size_pool_into_one_shape():
    mixed = weibull_lifetimes(0.7, 60, 1, gpus=64) + weibull_lifetimes(0.7, 60, 2, gpus=4096)
    fit = fit_shape(mixed)
    assert fit is not None and fit.low <= 0.7 <= fit.high and fit.credibly_below(1.0)


def test_survivors_count_as_censored_lifetimes():
    """Ignoring the incarnations still running biases the fit (only the short lives are
    seen); with them the estimate comes back to the truth. Exponential lifetimes
    censored at a fixed horizon."""
    rng = np.random.default_rng(11)
    t = rng.exponential(1.0, 400)
    horizon = 0.8
    failed, survived = list(t[t < horizon]), [horizon] * int((t >= horizon).sum())
    with_survivors = fit_shape(failed, survived, level=0.98)
    assert with_survivors is not None and with_survivors.low <= 1.0 <= with_survivors.high
    failures_only = fit_shape(failed, level=0.98)
    assert failures_only is not None and failures_only.low > 1.0  # the bias, for contrast


def test_the_fleet_rate_adds_every_host_to_the_prior():
    prior = FailureRate()
    records = [
        FailureRecord("a", "H100", gpu_seconds=1e9, failures=20),
        FailureRecord("b", "H100", gpu_seconds=2e9, failures=40),
        FailureRecord("c", "A100", gpu_seconds=5e9, failures=1),
    ]
    h100 = fleet_rate(records, prior, gpu_model="H100")
    assert (h100.others_failures, h100.others_gpu_seconds) == (60, 3e9)
    assert h100.gpu_mtbf_s == pytest.approx((PRIOR_GPU_MTBF_S + 3e9) / 61)
    # this host's fresh figures replace what it published
    local = FailureRate(failures=25, gpu_seconds=1.2e9)
    mine = fleet_rate(records, local, gpu_model="H100", host="a")
    assert (mine.alpha - mine.prior_failures, mine.failures) == (65, 25)
    assert mine.local() == local  # what it persists and publishes stays its own
    assert fleet_rate(records, prior).others_failures == 61


def test_records_round_trip_and_refuse_nonsense():
    r = FailureRecord("a", "H100", 1e9, 3, lifetimes=(1e6, 2e6), survivals=(5e5,), updated=1.0)
    assert FailureRecord.from_json("a", "H100", r.to_json()) == r
    with pytest.raises(ValueError, match="unreadable"):
        FailureRecord.from_json("a", "H100", b'{"version": 99}')
    with pytest.raises(ValueError, match="lifetimes"):
        FailureRecord("a", "H100", lifetimes=(-1.0,))
    long = FailureRecord("a", "H100", lifetimes=tuple(range(1, 2000)))
    assert len(long.lifetimes) == 500 and long.lifetimes[-1] == 1999  # the newest kept


def test_a_new_member_starts_from_what_the_fleet_knows(etcd: Etcd, fleet_prefix):
    """Two members publish what they saw; a third, new one reads the totals and the
    pooled lifetimes, and its estimate of M moves from the prior to the fleet's."""
    lifetimes = weibull_lifetimes(0.7, 120, seed=5)
    published = []
    for i, host in enumerate(("host-a", "host-b")):
        a = FleetAgent(settings(etcd.url, host, fleet_prefix), poll_s=0.2)
        record = FailureRecord(
            host,
            "NVIDIA H100 80GB HBM3",
            gpu_seconds=sum(lifetimes[i::2]),
            failures=len(lifetimes[i::2]),
            lifetimes=tuple(lifetimes[i::2]),
        )
        a.publish(record)
        assert a.poll_once().up
        published.append(record)
        a.stop()  # the knowledge stays after its daemon leaves (not leased)
    new = FleetAgent(settings(etcd.url, "host-new", fleet_prefix), poll_s=0.2)
    view = new.poll_once()
    new.stop()
    assert sorted(r.host for r in view.records) == ["host-a", "host-b"]
    prior = FailureRate()
    fleet = fleet_rate(view.records, prior, gpu_model="NVIDIA H100 80GB HBM3")
    assert fleet.others_failures == 120
    assert fleet.gpu_mtbf_s == pytest.approx((PRIOR_GPU_MTBF_S + sum(lifetimes)) / 121)
    assert fleet.gpu_mtbf_s < prior.gpu_mtbf_s / 2  # 4x worse than the prior, and it shows
    fit = fit_shape(*pooled(view.records))
    assert fit is not None and fit.credibly_below(1.0)


@pytest.mark.parametrize(("shape", "bursty"), [(0.7, True), (1.0, False)])
def test_a_drawn_fleet_history_carries_its_distribution(shape, bursty):
    """The simulator's fleet input: the record a host would publish after watching a
    4,096-GPU fleet for 30 days of the given distribution."""
    from adaptd.fleet.history import FleetHistory, draw_history

    h = FleetHistory(gpus=4096, days=30, job_gpus=512)
    rec = draw_history(h, gpu_mtbf_s=GPU_MTBF_S, shape=shape, seed=3)
    assert rec.gpu_seconds == h.exposure_gpu_s
    expected = h.exposure_gpu_s / GPU_MTBF_S  # about 236 failures
    assert abs(rec.failures - expected) < 0.2 * expected
    rate = fleet_rate([rec], FailureRate())
    assert abs(rate.gpu_mtbf_s - GPU_MTBF_S) < 0.25 * GPU_MTBF_S  # the prior is 4x off
    fit = fit_shape(rec.lifetimes, rec.survivals)
    assert fit is not None and fit.credibly_below(1.0) is bursty
    assert rec == draw_history(h, gpu_mtbf_s=GPU_MTBF_S, shape=shape, seed=3)  # seeded


def test_a_simulated_job_starts_from_the_fleets_history():
    from adaptd.fleet.history import FleetHistory, draw_history, job_inputs

    rec = draw_history(FleetHistory(), gpu_mtbf_s=GPU_MTBF_S, shape=0.7, seed=1)
    rate, fleet = job_inputs(rec, FailureRate(), hosts=512)
    assert rate.failures == 0 and rate.others_failures == rec.failures  # nothing its own yet
    assert abs(rate.gpu_mtbf_s - GPU_MTBF_S) < 0.25 * GPU_MTBF_S
    assert fleet.bursty and fleet.hosts == 512 and 0.5 < fleet.failure_shape < 0.9
