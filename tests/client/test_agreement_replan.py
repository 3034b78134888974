"""The chief's embedded policy re-fits its interval to every step report: each small
change was a plan round every second or two, every rank held at its step for it (81 rounds
in 120 s of tests/multiworker/test_hosts.py's two-host job). The agreement takes the
daemon planner's re-plan tolerance for it (adaptd.core.snapshot.REPLAN_TOLERANCE), and
the plan of a policy that just took over goes out exactly.

The ranks are real :class:`~adaptd.client.agreement.rounds.Agreement` objects, with
their watcher threads, on a store with the coordination service's semantics."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from adaptd.client.agreement.agreed import Coordinated
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import Agreement, AgreementOptions
from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.snapshot import REPLAN_TOLERANCE, Decision
from client.kv_store import WaitingDictStore

DEADLINE_S = 20.0


class Job:
    """Two ranks agreeing in this process; :meth:`boundary` runs the chief's."""

    def __init__(self) -> None:
        self.store = WaitingDictStore()
        self.recorded = threading.Condition()
        self.ranks = [
            Agreement(
                self.store,
                Identity("replan", r, 2),
                position=lambda: 0,
                wake=self._wake,
                session=0,
                options=AgreementOptions(timeout_s=DEADLINE_S, slice_s=0.25, lead_time_s=0.0),
            )
            for r in (0, 1)
        ]
        for r in self.ranks:
            r.start()

    def _wake(self) -> None:
        with self.recorded:
            self.recorded.notify_all()

    def rounds(self) -> int:
        return len(self.ranks[0].rounds)

    def boundary(self, step: int) -> None:
        """The chief's boundary at ``step``, then (when it proposed) the round settled
        on both ranks."""
        chief = self.ranks[0]
        before = self.rounds()
        chief.boundary(step, SaveSchedule(), None)
        if chief._mine is None:  # nothing proposed
            return
        with self.recorded:
            ok = self.recorded.wait_for(
                lambda: all(len(r.rounds) > before for r in self.ranks), DEADLINE_S
            )
        assert ok, f"round {before} was not settled within {DEADLINE_S:g}s"

    def close(self) -> None:
        for r in self.ranks:
            r._watcher.stop()
        self.store.close()
        for r in self.ranks:
            r.close()


def test_a_refit_within_the_tolerance_is_no_round_and_a_larger_one_is() -> None:
    job = Job()
    chief = job.ranks[0]

    def wish(every: int, tolerance: float, step: int) -> int:
        """The chief wants a plan of ``every`` steps at ``step``: the rounds run so far."""
        plan = Decision(every, every, policy="young_daly")
        chief.want_plan(plan, source="embedded", tolerance=tolerance)
        job.boundary(step)
        assert not chief.plan_wanted  # settled: committed, or the same saves
        return job.rounds()

    try:
        assert wish(100, 0.0, 10) == 1 and chief.rounds[0].commit
        assert wish(103, REPLAN_TOLERANCE, 20) == 1  # re-fitted by 3 %: no round
        # the same change with no tolerance (a daemon's plan, a new policy's): a round
        assert wish(103, 0.0, 30) == 2 and chief.rounds[1].commit
        assert wish(113, REPLAN_TOLERANCE, 40) == 3  # re-fitted by 10 %: a round
        assert chief.rounds[2].commit
        assert chief.ledger.agreed_plan is not None and chief.ledger.agreed_plan.every_steps == 113
    finally:
        job.close()


class Wishes:
    """The agreement as :class:`Coordinated` sees it: the tolerance of each plan wish,
    and whether the last one is still unsettled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.who = SimpleNamespace(host="a", chief=True)
        self.tolerances: list[float] = []
        self.plan_wanted = False

    def want_plan(self, decision: Decision, **how: Any) -> None:
        self.tolerances.append(how["tolerance"])
        self.plan_wanted = True


def test_a_new_policys_plans_go_out_exactly_until_one_is_settled() -> None:
    wishes = Wishes()
    chief = Coordinated(SaveSchedule(), wishes)  # type: ignore[arg-type]
    plan = Decision(70, 7, policy="fixed")
    chief.embedded_plan(plan, 1, new_policy=True)  # the embedded policy took over
    chief.embedded_plan(plan, 2)  # its plan not agreed yet: still exact
    wishes.plan_wanted = False  # agreed
    chief.embedded_plan(plan, 3)  # from here on re-fits
    chief.embedded_plan(plan, 4)
    chief.embedded_plan(plan, 5, new_policy=True)  # an operator's set-policy
    assert wishes.tolerances == [0.0, 0.0, REPLAN_TOLERANCE, REPLAN_TOLERANCE, 0.0]
