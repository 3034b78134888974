"""A SIGTERM'd rank of a ``tf.distribute`` job whose agreement breaks after the ranks
committed to its stop (client/agreement/agreed.py, Coordinated.preempt): it goes on
to the committed step, where every other rank saves and stops, instead of stopping
alone at once. Seen end to end in tests/multiworker/test_hosts.py (issue 25): the
chief saved and stopped at step 294 and its process, the coordination service's
leader, ended; the slower rank, at 293, found the store gone and saved 293 alone.
The watcher thread is not started here: its part (a round recorded, the store lost)
is played by calling the Agreement's own methods."""

from __future__ import annotations

from adaptd.client.agreement.agreed import Coordinated
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import Agreement
from adaptd.client.save.schedule import SaveSchedule
from adaptd.client.save.sigterm import SIGTERM_REASON
from adaptd.core import agreement as rules
from adaptd.protocol import job as p
from client.kv_store import DictStore

STOP_AT = 294


def rank_one(at: list[int]) -> tuple[Coordinated, Agreement, SaveSchedule]:
    """Rank 1 of 2, its newest completed step ``at[0]``."""
    agreement = Agreement(
        DictStore(), Identity("mw", rank=1, world_size=2),
        position=lambda: at[0], wake=lambda: None, session=0,
    )  # fmt: skip
    schedule = SaveSchedule()
    return Coordinated(schedule, agreement), agreement, schedule


def commit(agreement: Agreement, k: int, proposal: p.Propose) -> None:
    decision = p.Decide(v=p.VERSION, job="mw", round=k, commit=True)
    agreement.record(k, proposal, decision)


def test_a_committed_stop_still_holds_once_the_store_is_gone() -> None:
    at = [290]
    rank, agreement, schedule = rank_one(at)
    assert rank.preempt(290)  # SIGTERM: the stop is proposed, not taken alone
    commit(agreement, 0, rules.save_proposal("mw", 0, STOP_AT, 1, SIGTERM_REASON, stop=True))
    agreement.stop_with("the coordination service is gone")  # the chief stopped at 294
    for step in range(291, STOP_AT):
        at[0] = step
        assert rank.preempt(step), f"stopped alone at {step}, before the committed {STOP_AT}"
        assert not rank.boundary(step, 0.01, 0.0)
        assert rank.bound(10**9) == STOP_AT  # the hot path comes back at the stop's step
    at[0] = STOP_AT
    assert rank.preempt(STOP_AT)
    assert rank.boundary(STOP_AT, 0.01, 0.0)  # save here, then stop: with the others
    assert schedule.urgent_step == STOP_AT and schedule.urgent_reason == SIGTERM_REASON
    assert [(a.action, a.step) for a in agreement.applied] == [("stop", STOP_AT)]


def test_without_a_committed_stop_a_broken_agreement_stops_the_rank_at_once() -> None:
    rank, agreement, _ = rank_one([290])
    commit(agreement, 0, rules.save_proposal("mw", 0, 292, 0, "save-now"))  # a save only
    agreement.stop_with("the coordination service is gone")
    assert not rank.preempt(291)  # nobody else will stop: save alone, now


def test_a_stop_already_applied_does_not_hold_a_later_sigterm() -> None:
    at = [290]
    rank, agreement, _ = rank_one(at)
    commit(agreement, 0, rules.save_proposal("mw", 0, 292, 0, "health", stop=True))
    assert rank.boundary(292, 0.01, 0.0)  # applied: the stop is no longer pending
    agreement.stop_with("the coordination service is gone")
    assert not rank.preempt(293)
