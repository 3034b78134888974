"""How many plan rounds a multi-worker job's chief proposes from its embedded policy.

The chief's embedded policy decides about once a second on the job's step reports; a
decision that does not save at the agreed plan's steps is proposed to every rank, and
each committed round holds every rank at its step. Before 2026-12-08 any change at
all was proposed (a CI log: rounds 24 to 63, 40 plan rounds, in 69 s); now a re-fit within
:data:`~adaptd.core.snapshot.REPLAN_TOLERANCE` of the interval is not, as the daemon's
planner has it. This runs the policy on the real :class:`~adaptd.core.estimators.
JobTracker`, on a simulated job (each step's own log-normal noise; a steady machine, or
a load of 1x-2.5x that changes every 2-8 s; reports once a second, saves at the plan's
steps), and counts the plans each rule would propose, side by side on the same run.

Usage::

    python benchmarks/embedded_replans.py [--policy default] [--seconds 600] [--seeds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import random

from adaptd.core.estimators import JobTracker
from adaptd.core.policy import PolicyError, parse
from adaptd.core.snapshot import REPLAN_TOLERANCE, Decision, Snapshot, same_saves

IDLE_STEP_S = 0.05
REPORT_S = 1.0


#: The machine's load, a multiple of the idle step time, redrawn every 2-8 s.
LOADS = {"steady": (1.0,), "changing": (1.0, 1.5, 2.5)}


def plans(spec: str, seconds: float, seed: int, loads: tuple[float, ...]) -> dict[str, int]:
    """Plans proposed in ``seconds`` of a simulated job under ``loads``, under each rule
    (each rule follows its own plan: the saves of one do not move the other's)."""
    out: dict[str, int] = {}
    for name, tolerance in (("exact", 0.0), ("tolerance", REPLAN_TOLERANCE)):
        rng = random.Random(seed)
        policy = parse(spec)
        tracker = JobTracker("bench")
        plan: Decision | None = None
        t, step, last_saved, proposed = 0.0, 0, 0, 0
        batch_n, batch_s, next_report = 0, 0.0, REPORT_S
        load, load_until = 1.0, 0.0
        in_flight: int | None = None
        while t < seconds:
            if t >= load_until:
                load, load_until = rng.choice(loads), t + rng.uniform(2.0, 8.0)
            dt = IDLE_STEP_S * load * rng.lognormvariate(0.0, 0.3)
            t, step = t + dt, step + 1
            batch_n, batch_s = batch_n + 1, batch_s + dt
            due = plan.due_after(max(step - 1, last_saved)) if plan is not None else None
            if due is not None and step >= due:
                last_saved = in_flight = step
            if t >= next_report:
                tracker.on_steps(t, step, batch_n, batch_s / batch_n, in_flight is not None)
                if in_flight is not None:
                    tracker.on_save_requested(t, in_flight)
                    tracker.on_save_report(t, in_flight, blocking_s=0.2, durable_s=0.5)
                    in_flight = None
                batch_n, batch_s, next_report = 0, 0.0, t + REPORT_S
                decided = policy.decide(Snapshot(time=t), tracker.state())
                if decided.urgent:
                    continue
                if plan is None or not same_saves(plan, decided, step, tolerance):
                    plan, proposed = decided, proposed + 1
        out[name] = proposed
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="default", help="the embedded policy's spec")
    parser.add_argument("--seconds", type=float, default=600.0, help="simulated seconds a run")
    parser.add_argument("--seeds", type=int, default=5, help="runs (seeds 0..N-1)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.seeds < 1:
        parser.error("--seconds must be positive and --seeds at least 1")
    try:
        parse(args.policy)
    except PolicyError as exc:
        parser.error(f"--policy {args.policy!r}: {exc}")
    runs = {
        load: [plans(args.policy, args.seconds, seed, LOADS[load]) for seed in range(args.seeds)]
        for load in LOADS
    }
    if args.json:
        print(json.dumps({"policy": args.policy, "seconds": args.seconds, "runs": runs}))
        return 0
    print(f"policy {args.policy!r}, {args.seconds:g} simulated s a run, "
          f"reports every {REPORT_S:g} s")  # fmt: skip
    print(f"{'load':>8} {'seed':>4} {'plans, any change':>18} {'plans, 5% tolerance':>20} "
          f"{'ratio':>6}")  # fmt: skip
    for load, rs in runs.items():
        for seed, r in enumerate(rs):
            ratio = r["exact"] / max(1, r["tolerance"])
            print(f"{load:>8} {seed:>4} {r['exact']:>18} {r['tolerance']:>20} {ratio:>6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
