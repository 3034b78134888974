"""Deterministic scenarios of one rank's agreement (adaptd.client.agreement.rounds) on a real
coordination service: a one-worker MultiWorkerMirroredStrategy cluster (TF_CONFIG from
the test) whose rank 0 runs the engine while this script plays the job's other ranks
by writing their keys. Writes what happened to ``$RESULT`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import tensorflow as tf

from adaptd.client.agreement.coordination import Coordination
from adaptd.client.agreement.kv import Keys
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import Agreement, AgreementOptions
from adaptd.client.save.schedule import SaveSchedule
from adaptd.core import agreement as rules
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as p

WORLD = 2  # the engine is rank 0; this script plays rank 1


class Rank0:
    """The engine under test with the hook's step path around it."""

    def __init__(self, store: Coordination, job: str, timeout_s: float = 5.0) -> None:
        self.n = 0
        self.due = 0
        self.schedule = SaveSchedule()
        self.saves: list[int] = []
        self.engine = Agreement(
            store,
            Identity(job, 0, WORLD),
            position=lambda: self.n,
            wake=self.wake,
            session=0,
            options=AgreementOptions(timeout_s=timeout_s, slice_s=0.1, lead_time_s=0.05),
        )
        self.keys = Keys.of(job, 0)
        self.engine.start()

    def wake(self) -> None:
        self.due = 0

    def run_to(self, step: int, step_time_s: float = 0.001) -> None:
        while self.n < step:
            self.n += 1
            if self.n >= self.due:
                self.engine.boundary(self.n, self.schedule, step_time_s)
                if self.n >= self.schedule.due:
                    self.saves.append(self.n)
                    self.schedule.saved(self.n)
                with self.engine.lock:
                    self.due = self.engine.bound(self.schedule.due)


def wait_for(store: Coordination, key: str, timeout: float = 10.0) -> Any:
    raw = store.get(key, timeout)
    assert raw is not None, f"{key} not written within {timeout}s"
    return p.decode_rank(raw)


def ack(store: Coordination, keys: Keys, proposal: p.Propose, step: int) -> None:
    store.put(keys.ack(proposal.round, 1), p.encode_json(rules.acknowledge(proposal, 1, step)))


def plan_order(store: Coordination) -> dict[str, Any]:
    """A plan proposed after another committed one names no earlier step: the newer
    plan is the one in force once both apply."""
    r0 = Rank0(store, "order")
    a, b = Decision(100, 100, policy="A"), Decision(100, 7, policy="B")
    r0.run_to(9)
    r0.engine.want_plan(a)
    r0.run_to(10, step_time_s=0.001)  # proposes A 50 steps ahead: at 60
    first = wait_for(store, r0.keys.proposal(0))
    ack(store, r0.keys, first, 10)
    wait_for(store, r0.keys.decision(0))
    while len(r0.engine.rounds) < 1:
        time.sleep(0.01)
    r0.engine.want_plan(b)
    r0.run_to(11, step_time_s=0.1)  # B with a 2-step lead would be at 13, before A
    second = wait_for(store, r0.keys.proposal(1))
    ack(store, r0.keys, second, 11)
    wait_for(store, r0.keys.decision(1))
    r0.run_to(80)
    r0.engine.close()
    d = r0.schedule.decision
    return {
        "first_at": first.at_step,
        "second_at": second.at_step,
        "in_force": d.policy if d else None,
        "applied": [[x.round, x.action, x.at_step, x.step] for x in r0.engine.applied],
    }


def refused(store: Coordination) -> dict[str, Any]:
    """Rank 1 had passed the proposed step: the round is aborted, and the proposal is
    made again ahead of rank 1, with the lead doubled."""
    r0 = Rank0(store, "refused")
    r0.run_to(4)
    r0.engine.want_save("operator", 4)
    r0.run_to(5, step_time_s=1.0)  # slow steps: the 2-step minimum lead, at 7
    first = wait_for(store, r0.keys.proposal(0))
    ack(store, r0.keys, first, 40)  # rank 1 is at step 40
    decision = wait_for(store, r0.keys.decision(0))
    while len(r0.engine.rounds) < 1:
        time.sleep(0.01)
    r0.run_to(6, step_time_s=1.0)
    second = wait_for(store, r0.keys.proposal(1))
    ack(store, r0.keys, second, 41)
    wait_for(store, r0.keys.decision(1))
    r0.run_to(60, step_time_s=1.0)
    r0.engine.close()
    return {
        "first_at": first.at_step,
        "decision": [decision.commit, decision.reason, decision.retry_from],
        "second_at": second.at_step,
        "saves": r0.saves,
    }


def waits_at_the_step(store: Coordination) -> dict[str, Any]:
    """Rank 1 proposes a save at 15; rank 0 reaches 15 before the decision and waits
    there until rank 1 (the proposer) writes it 0.5 s later."""
    r0 = Rank0(store, "waits")
    r0.run_to(3)
    proposal = rules.save_proposal("waits", 0, 15, 1, "from rank 1")
    store.put(r0.keys.proposal(0), p.encode_json(proposal))
    got = wait_for(store, r0.keys.ack(0, 0))
    ack(store, r0.keys, proposal, 3)

    def decide_later() -> None:
        time.sleep(0.5)
        commit = rules.decide(proposal, {0: got, 1: rules.acknowledge(proposal, 1, 3)}, WORLD)
        store.put(r0.keys.decision(0), p.encode_json(commit))

    threading.Thread(target=decide_later).start()
    t0 = time.monotonic()
    r0.run_to(30)
    took = time.monotonic() - t0
    r0.engine.close()
    return {
        "ack": [got.ok, got.step],
        "took": took,
        "stalls": r0.engine.stalls,
        "saves": r0.saves,
    }


def undecided(store: Coordination) -> dict[str, Any]:
    """Rank 1 proposes and vanishes: rank 0 waits at the step at most twice the round
    timeout (1 s here), aborts the round itself, and goes on without the save."""
    r0 = Rank0(store, "undecided", timeout_s=1.0)
    r0.run_to(2)
    proposal = rules.save_proposal("undecided", 0, 6, 1, "from rank 1")
    store.put(r0.keys.proposal(0), p.encode_json(proposal))
    wait_for(store, r0.keys.ack(0, 0))
    t0 = time.monotonic()
    r0.run_to(20)
    took = time.monotonic() - t0
    decision = wait_for(store, r0.keys.decision(0))
    r0.engine.close()
    return {
        "took": took,
        "decision": [decision.commit, decision.reason],
        "saves": r0.saves,
        "broken": r0.engine.broken,
    }


def unreadable(store: Coordination) -> dict[str, Any]:
    """A proposal key that does not decode is skipped: no acknowledgement, the next
    round works."""
    r0 = Rank0(store, "unreadable")
    store.put(r0.keys.proposal(0), '{"kind":"propose","v":2}')
    r0.engine.want_save("operator", 0)
    deadline = time.monotonic() + 10
    while store.try_get(r0.keys.proposal(1)) is None:  # step on until it proposes
        assert time.monotonic() < deadline, "no proposal in round 1"
        r0.run_to(r0.n + 1)
    proposal = wait_for(store, r0.keys.proposal(1))
    ack(store, r0.keys, proposal, r0.n)
    wait_for(store, r0.keys.decision(1))
    r0.run_to(proposal.at_step + 10)
    r0.engine.close()
    return {
        "ack_of_bad": store.try_get(r0.keys.ack(0, 0)),
        "second": [proposal.round, proposal.action, proposal.at_step],
        "saves": r0.saves,
    }


def main() -> int:
    tf.distribute.MultiWorkerMirroredStrategy()
    store = Coordination(0, 1)
    scenarios = {
        "plan_order": plan_order,
        "refused": refused,
        "waits": waits_at_the_step,
        "undecided": undecided,
        "unreadable": unreadable,
    }
    results = {name: fn(store) for name, fn in scenarios.items()}
    with open(os.environ["RESULT"], "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
