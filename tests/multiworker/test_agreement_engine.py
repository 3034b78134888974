"""One rank's agreement in deterministic scenarios on a real coordination service
(tests/multiworker/engine_worker.py plays the job's other rank by writing its keys)."""

from __future__ import annotations

from typing import Any

import pytest

from multiworker.cluster import HERE, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.tf]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("engine")
    with Cluster(workdir, 1, HERE / "engine_worker.py") as cluster:
        (result,) = cluster.wait_ok(timeout=180)
    return result


def test_a_newer_plan_never_takes_effect_before_an_older_committed_one(scenarios) -> None:
    s = scenarios["plan_order"]
    assert s["first_at"] == 60  # 50 ms of 1 ms steps ahead of step 10
    assert s["second_at"] == 60  # a 2-step lead would say 13, before the first plan
    assert s["applied"] == [[0, "plan", 60, 60], [1, "plan", 60, 60]]
    assert s["in_force"] == "B"


def test_a_rank_past_the_step_gets_the_proposal_retried_ahead_of_it(scenarios) -> None:
    s = scenarios["refused"]
    assert s["first_at"] == 7
    commit, reason, retry_from = s["decision"]
    assert not commit and reason == "rank 1 at step 40: past step 7" and retry_from == 40
    assert s["second_at"] == 40 + 2 * 2  # past rank 1, the 2-step lead doubled
    assert s["saves"] == [44]


def test_a_rank_at_an_undecided_step_waits_for_the_decision(scenarios) -> None:
    s = scenarios["waits"]
    assert s["ack"] == [True, 3]
    assert 0.4 <= s["took"] < 5.0 and s["stalls"] == 1
    assert s["saves"] == [15]  # the committed save, at its step


def test_a_round_nobody_decides_is_aborted_within_twice_the_timeout(scenarios) -> None:
    s = scenarios["undecided"]
    assert 1.5 <= s["took"] < 5.0  # round timeout 1 s: the decision waited 2 s
    commit, reason = s["decision"]
    assert not commit and "rank 0: no decision within 2s" in reason
    assert s["saves"] == [] and not s["broken"]


def test_an_unreadable_proposal_is_skipped(scenarios) -> None:
    s = scenarios["unreadable"]
    assert s["ack_of_bad"] is None
    round_, action, at_step = s["second"]
    assert (round_, action) == (1, "save") and s["saves"] == [at_step]
