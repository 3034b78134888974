"""Restore agreement (adaptd.client.job_restore) on real MultiWorkerMirroredStrategy
workers: every rank restores the newest step the whole job has, pulls what it lacks,
or every rank stops with the same clear error (tests/multiworker/restore_scenarios.py)."""

from __future__ import annotations

import pytest

from multiworker.conftest import DEST_STEPS, WORKERS

pytestmark = [pytest.mark.slow, pytest.mark.tf]


def _scenario(job, name: str) -> list[dict]:
    return [w["restore"][name] for w in job]


def test_every_rank_restores_the_newest_step_they_all_have(job) -> None:
    results = _scenario(job, "common")
    for r in results:
        assert r["step"] == 20 and r["confirmed"]
        assert r["source"] == {str(k): "local" for k in range(WORKERS)}
        assert r["newer"] == {"0": [30], "1": [], "2": [30]}  # not resumable: other ranks lack it


def test_a_rank_without_the_step_pulls_it_from_the_destination(job) -> None:
    results = _scenario(job, "pull")
    assert max(DEST_STEPS) == 30
    for rank, r in enumerate(results):
        assert r["step"] == 30 and r["confirmed"], r
        assert r["source"] == {"0": "local", "1": "pull", "2": "pull"}
        if rank:
            assert r["pulled_s"] > 0 and r["local_after"] == [30]  # fetched, verified
        else:
            assert r["pulled_s"] == 0 and r["local_after"] == [30, 20]


def test_no_common_step_stops_every_rank_with_the_same_clear_error(job) -> None:
    errors = {r.get("error") for r in _scenario(job, "missing")}
    assert len(errors) == 1
    (error,) = errors
    assert error and "rank(s) 1, 2 cannot get step 30" in error
    assert "rank 0 (host0): steps 30, 20" in error and "restore_from" in error


def test_one_ranks_failed_restore_stops_every_rank(job) -> None:
    for r in _scenario(job, "fails"):
        assert "confirmed" not in r
        assert "rank 1 failed to restore: boom" in r["error"]


def test_nothing_anywhere_is_a_fresh_start_for_every_rank(job) -> None:
    for r in _scenario(job, "fresh"):
        assert r["step"] is None and r["confirmed"]


def test_a_rank_that_never_offers_stops_the_others_within_the_timeout(job) -> None:
    results = _scenario(job, "silent")
    assert results[-1] == {"skipped": True, "local_after": [10]}
    for r in results[:-1]:
        assert "no offer from rank(s) 2 within 2s" in r["error"]
