"""Restore agreement (adaptd.client.restore.job_restore) on real MultiWorkerMirroredStrategy
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


def test_a_step_missing_one_ranks_part_is_skipped_for_the_one_before(job) -> None:
    for r in _scenario(job, "partless"):
        assert r["step"] == 20 and r["confirmed"], r
        ((name, why),) = r["not_usable"]
        assert name == "ckpt-30"
        assert "rank(s) 2 of 3 have no complete part (e.g. ckpt-30.rank-00002-of-00003)" in why


def test_a_first_save_cut_short_is_a_fresh_start_not_a_half_restore(job) -> None:
    # the replicated part and rank 0's part of step 10 landed; the others' markers say
    # that step 10 is one of 3 ranks, so it is no one-rank checkpoint of another job size
    for r in _scenario(job, "first"):
        assert r["step"] is None and r["confirmed"], r
        assert [n for n, _ in r["not_usable"]] == ["ckpt-10"]


def test_a_newer_step_of_another_world_size_stops_every_rank_naming_both(job) -> None:
    errors = {r.get("error") for r in _scenario(job, "world")}
    assert len(errors) == 1
    (error,) = errors
    assert error and "ckpt-20 in " in error
    assert "was written by 2 worker(s); this job has 3 worker(s)" in error
    assert "Restart it with 2 worker(s), or move those checkpoints aside" in error


def test_a_step_spread_over_hosts_without_shared_storage_is_refused_not_lost(job) -> None:
    errors = {r.get("error") for r in _scenario(job, "spread")}
    assert len(errors) == 1
    (error,) = errors
    assert error and "step 10 is whole across the job's ranks" in error
    assert "rank(s) 0" in error and "shared storage" in error
