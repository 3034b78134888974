"""The neutral core's plan following for a framework that asks whether to save
(adaptd.client.follower), with the times passed in: no framework, no daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptd.client.agreement.ranks import Identity
from adaptd.client.daemon.policy import PolicyChoice
from adaptd.client.follower import Follower
from adaptd.client.framework import FrameworkAdapter


class Written:
    """A framework adapter of this test: saves "written" as a dict of step -> bytes."""

    framework = "test"

    def __init__(self) -> None:
        self.written: dict[int, int] = {}

    def accelerators(self) -> int:
        return 0

    def finalized(self, step: int) -> int | None:
        return self.written.get(step)

    def newest_durable(self) -> int | None:
        return max(self.written, default=None)

    def peer_failure(self, exc: BaseException) -> str | None:
        return None


@pytest.fixture
def follower(short_dir: Path):
    adapter = Written()
    assert isinstance(adapter, FrameworkAdapter)
    f = Follower("fj", adapter, PolicyChoice.of("fixed:steps=10"), Identity("fj"),
                 directory=short_dir, socket=short_dir / "none.sock")  # fmt: skip
    yield f
    f.close(0, "closed", 0.0)


def test_the_plan_and_each_saves_report_from_the_events_told(follower: Follower) -> None:
    f = follower
    f.start(0, 100.0)
    assert f.boundary(1, 100.1, tick=False) == 10
    for n in range(2, 10):  # 0.1 s per step
        f.boundary(n, 100.0 + n * 0.1, tick=False)
    f.save_started(10, "every 10 steps", 101.0)
    assert f.boundary(11, 101.4, tick=False) == 20  # the plan counts from the save
    f.save_returned(0.3, 11, 101.4)  # blocked 0.3 s of the 0.4 s
    report = f.save_finished(13, 101.9, nbytes=4096, path="/ckpt/10")
    assert report is not None and report.ok
    assert (report.step, report.bytes, report.reason) == (10, 4096, "every 10 steps")
    assert report.blocking_s == pytest.approx(0.3)
    assert report.durable_s == pytest.approx(0.9)
    # 2 steps in 0.5 s after the return, against a 0.1 s baseline: 0.3 s extra
    assert report.extra_step_s == pytest.approx(0.3)
    assert f.history == [report] and f.pending is None
    assert f.tracker is not None and f.tracker.saves == 1


def test_saves_in_flight_end_oldest_first_and_a_failure_is_reported(follower: Follower) -> None:
    f = follower
    f.start(0, 0.0)
    f.save_started(10, "a", 1.0)
    f.save_started(20, "b", 2.0)  # the framework waits for 10 inside this save
    assert [p.step for p in f.in_flight] == [10, 20] and f.pending.step == 20
    first = f.save_finished(21, 3.0, nbytes=1)
    second = f.save_finished(22, 4.0, nbytes=0, error="disk full")
    assert (first.step, first.ok, second.step, second.ok) == (10, True, 20, False)
    assert second.error == "disk full" and f.save_finished(23, 5.0, nbytes=0) is None
    assert f.tracker.failed_saves == 1


def test_a_save_the_framework_made_on_its_own_moves_the_plan(follower: Follower) -> None:
    f = follower
    f.start(0, 0.0)
    f.saved_elsewhere(10)
    assert f.schedule.last_saved_step == 10 and f.boundary(11, 1.0, tick=False) == 20
    f.saved_elsewhere(5)  # older: no change
    assert f.schedule.last_saved_step == 10
