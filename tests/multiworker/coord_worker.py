"""One worker of tests/multiworker/test_coordination.py: a real
``MultiWorkerMirroredStrategy`` member (TF_CONFIG from the test) that runs the
scenarios named on the command line against TensorFlow's coordination service and
writes what it saw to ``$RESULT`` as JSON.

Scenarios:
  facade     the key-value and barrier calls of adaptd.client.agreement.coordination
  lockstep   the agreement, ranks in lock step (a real all-reduce every step)
  free       the agreement, ranks running free at different speeds
  restore    the restore agreement (tests/multiworker/restore_scenarios.py)
  dead       as free, and the last rank's process ends half-way (must be last)
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import tensorflow as tf

from adaptd.client.agreement import ranks
from adaptd.client.agreement.coordination import BarrierTimeout, Coordination
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.rounds import Agreement, AgreementOptions
from adaptd.client.save.schedule import NEVER, SaveSchedule
from adaptd.core.snapshot import Decision

STEPS = int(os.environ.get("STEPS", "400"))
SEED = int(os.environ.get("SEED", "12"))


def timed(fn: Any, *args: Any) -> tuple[Any, str, float]:
    t0 = time.perf_counter()
    try:
        value, error = fn(*args), ""
    except Exception as exc:
        value, error = None, f"{type(exc).__name__}: {exc}"
    return value, error, time.perf_counter() - t0


def facade(store: Coordination, rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if rank == 0:
        out["first_put"] = store.put("t/k", "1")
        out["second_put"] = store.put("t/k", "2")
    store.barrier("t/written", 30)
    out["get"] = store.get("t/k", 5)
    value, _, took = timed(store.get, "t/missing", 0.2)
    out["get_missing"] = [value, took]
    value, _, took = timed(store.try_get, "t/missing")
    out["try_get_missing"] = [value, took]
    out["zero_timeout"] = timed(store.get, "t/k", 0)[1]
    if rank == world - 1:
        _, err, took = timed(store.barrier, "t/alone", 0.5)
        out["lonely_barrier"] = [err, took]
    store.barrier("t/read", 30)
    if rank == 0:
        store.put("t/dir/a", "1")
        store.put("t/dir/b", "1")
        store.delete("t/k")
        store.delete("t/never-written")
        out["put_after_delete"] = store.put("t/k", "3")
        store.delete("t/dir")
    store.barrier("t/deleted", 30)
    out["after_delete"] = store.get("t/k", 5)
    out["dir_after_delete"] = [store.try_get("t/dir/a"), store.try_get("t/dir/b")]
    # a blocked get in one thread does not hold the other threads up
    import threading

    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(store.get("t/late", 20)))
    thread.start()
    spins = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        spins += 1
    store.barrier("t/spun", 30)
    if rank == 0:
        store.put("t/late", "x")
    thread.join(30)
    out["late"] = got
    out["spins_while_blocked"] = spins
    t0 = time.perf_counter()
    for i in range(50):
        store.put(f"t/speed/{rank}/{i}", "v")
    out["put_ms"] = (time.perf_counter() - t0) / 50 * 1e3
    t0 = time.perf_counter()
    for i in range(50):
        store.get(f"t/speed/{rank}/{i}", 5)
    out["get_ms"] = (time.perf_counter() - t0) / 50 * 1e3
    store.barrier("t/end", 30)
    return out


class MiniHook:
    """The hook's step path reduced to what agreement needs: one integer compare per
    step, the slow path at ``due``, saves where the agreed schedule says."""

    def __init__(self) -> None:
        self.n = 0
        self.due = 0
        self.schedule = SaveSchedule()
        self.saves: list[int] = []
        self.agreement: Agreement | None = None
        self.stopped_at: int | None = None

    def wake(self) -> None:
        self.due = 0

    def step(self, step_time_s: float) -> None:
        n = self.n + 1
        self.n = n
        if n >= self.due:
            self.boundary(n, step_time_s)

    def boundary(self, n: int, step_time_s: float) -> None:
        agreement = self.agreement
        assert agreement is not None
        if agreement.boundary(n, self.schedule, step_time_s) and self.stopped_at is None:
            self.stopped_at = n
        if n >= self.schedule.due:
            self.saves.append(n)
            self.schedule.saved(n)
        with agreement.lock:
            self.due = agreement.bound(self.schedule.due)


def agree(
    store: Coordination,
    rank: int,
    world: int,
    name: str,
    collective: Any | None,
    lead: float,
    timeout: float = 20.0,
    die_at: int | None = None,
) -> dict[str, Any]:
    """Random plan changes (rank 0) and urgent saves (every rank) for STEPS steps.
    With ``die_at``, the last rank ends its process at that step (its results so far
    written): the others must still finish, every wait bounded by ``timeout``."""
    rng = random.Random(f"{SEED}-{name}-{rank}")
    hook = MiniHook()
    agreement = Agreement(
        store,
        Identity(name, rank, world),
        position=lambda: hook.n,
        wake=hook.wake,
        options=AgreementOptions(timeout_s=timeout, slice_s=0.2, lead_time_s=lead),
    )
    hook.agreement = agreement
    agreement.start()
    store.barrier(f"{name}/start", 60)
    wishes = {"plan": 0, "save": 0}
    t_start = time.perf_counter()
    pace = 0.0002 * (1 + 2 * rank) if collective is None else 0.0
    for i in range(STEPS):
        if die_at is not None and i == die_at:
            if rank == world - 1:
                RESULTS[name] = {"died_at": hook.n}
                write(RESULTS)
                store.put(f"{name}/died", "1")  # synchronous: on the service before it goes
                os._exit(0)
            # The survivors run the rest of their steps after the death, not before it:
            # the last rank is the slowest, and on a loaded box the others had once
            # finished every step before it reached its step 300, leaving no round to
            # miss its acknowledgement (seen in a -n 2 run beside a CPU hog).
            store.get(f"{name}/died", 120)
        if collective is not None:
            collective()
        elif pace:
            time.sleep(pace * rng.random() * 2)
        if rank == 0 and rng.random() < 0.06:
            every = rng.choice([3, 5, 7, 10, 20, None])
            first = hook.n + rng.randint(1, 30)
            agreement.want_plan(Decision(first, every, policy="test"), source="test")
            wishes["plan"] += 1
        if rng.random() < 0.015:
            agreement.want_save(f"urgent from rank {rank}", hook.n)
            wishes["save"] += 1
        now = time.perf_counter()
        hook.step((now - t_start) / (i + 1))
    took = time.perf_counter() - t_start
    # every rank still there ends its rounds before any closes: a rank that closed
    # early would miss the rounds the slower ones propose meanwhile (and abort)
    if die_at is None:
        store.barrier(f"{name}/end", 120)
    else:  # a barrier of the survivors (the service's own wants every task)
        store.put(f"{name}/end/{rank}", "1")
        for r in range(world - 1):
            store.get(f"{name}/end/{r}", 120)
    agreement.close()
    return {
        "steps": hook.n,
        "seconds": took,
        "saves": hook.saves,
        "wishes": wishes,
        "rounds": [
            [r.round, r.action, r.at_step, r.proposer, r.commit, r.reason] for r in agreement.rounds
        ],
        "applied": [[a.round, a.action, a.at_step, a.step] for a in agreement.applied],
        "stalls": agreement.stalls,
        "stall_s": agreement.stall_s,
        "broken": agreement.broken,
        "gate_after": agreement.gate == NEVER,
        "in_force": _plan(hook.schedule.decision),
        "agreed": _plan(agreement.agreed_plan),
    }


def _plan(d: Decision | None) -> list[Any] | None:
    return None if d is None else [d.next_step, d.every_steps]


#: What this worker saw, by scenario (written to $RESULT).
RESULTS: dict[str, Any] = {}


def write(results: dict[str, Any]) -> None:
    with open(os.environ["RESULT"], "w") as f:
        json.dump(results, f)


def main() -> int:
    scenarios = sys.argv[1:]
    if os.environ.get("ADAPTD_TEST_LOG"):
        import logging

        fmt = "%(relativeCreated)d %(threadName)s %(message)s"
        logging.basicConfig(level=os.environ["ADAPTD_TEST_LOG"], format=fmt)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank, world = ranks.resolve()
    store = Coordination(rank, world)
    results = RESULTS
    results.update(rank=rank, world=world)

    @tf.function
    def all_reduce() -> Any:
        ctx = tf.distribute.get_replica_context
        return strategy.run(lambda: ctx().all_reduce("sum", tf.constant(1.0)))

    for name in scenarios:
        if name == "facade":
            results[name] = facade(store, rank, world)
        elif name == "lockstep":
            results[name] = agree(store, rank, world, name, all_reduce, 0.01)
        elif name == "free":  # proposals 2 steps ahead: ranks pass them, or wait at them
            results[name] = agree(store, rank, world, name, None, 0.0)
        elif name == "dead":  # the last rank's process ends at step 300; always last
            results[name] = agree(store, rank, world, name, None, 0.0, timeout=1.0, die_at=300)
            # the chief hosts the service: it leaves only once the other survivors are
            # done with it. Seeing their "done" is not enough: a survivor's own last get
            # could then reach a chief that had left (connection reset, once in a
            # fresh-clone run); each says "left" after its last use, and the chief waits.
            survivors = range(world - 1)
            store.put(f"dead/done/{rank}", "1")
            for r in survivors:
                store.get(f"dead/done/{r}", 60)
            if rank == 0:
                for r in survivors[1:]:
                    store.get(f"dead/left/{r}", 60)
            else:
                store.put(f"dead/left/{rank}", "1")  # the store's last use on this rank
            write(results)
            return 0
        elif name == "restore":
            import restore_scenarios  # beside this script

            results[name] = restore_scenarios.run(store, rank, world)
        else:
            raise SystemExit(f"unknown scenario {name!r}")
    write(results)
    store.barrier("exit", 60)
    return 0


if __name__ == "__main__":
    assert BarrierTimeout  # imported for the scenario's error text
    sys.exit(main())
