"""Replay a training job against an in-process daemon on a fake clock; count plans and saves.

Not a test: a measurement behind docs/daemon.md ("A save is known before its
report"). The job follows the daemon's plans with the hook's own
:class:`adaptd.client.save.schedule.SaveSchedule`, reports steps about once a second
(with its ``save_in_flight`` flag) and a save report once the write is durable;
a save that falls due while the previous one is still in flight has to wait for
it, as the hook does. Seeded, deterministic.

Usage: python tests/daemon/plan_replay.py POLICY DURABLE_S STEP_S NOISE STEPS
e.g.   python tests/daemon/plan_replay.py daly:mtbf_s=2000,probe_s=20 3 0.1 0.05 20000
Prints: plans received, saves, saves that had to wait, the smallest gap between saves.
"""

from __future__ import annotations

import itertools
import random
import sys
import tempfile
from pathlib import Path

import zmq

from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.snapshot import Snapshot
from adaptd.daemon.assembly import Seams, build
from adaptd.daemon.options import DaemonOptions
from adaptd.protocol import job as p

BLOCKING_S, EXTRA_S = 0.05, 0.02


def main(spec: str, durable_s: float, step_s: float, noise: float, total: int) -> str:
    clock = [1000.0]
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        daemon = build(
            DaemonOptions(socket=Path(d) / "a.sock", default_policy=spec, tick_interval_s=3600),
            Seams(clock=lambda: clock[0], snapshot_source=lambda: Snapshot(time=clock[0])),
        ).start()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(daemon.endpoint)
        sched, rng = SaveSchedule(), random.Random(7)
        seqs: set[int] = set()
        saves: list[tuple[int, float]] = []
        waits, step, count, spent = 0, 0, 0, 0.0
        in_flight: tuple[int, float] | None = None  # (step, started)

        def barrier() -> None:
            """Hello again (a reconnect): once its Welcome is in, all sent was handled."""
            sock.send(p.encode(p.Hello(v=p.VERSION, job="j", pid=0)))
            welcomed = False
            while not welcomed or sock.poll(0):
                if not sock.poll(10_000):
                    raise TimeoutError("the daemon did not answer within 10 s")
                msg = p.decode_daemon(sock.recv())
                welcomed = welcomed or isinstance(msg, p.Welcome)
                if isinstance(msg, p.Plan):
                    seqs.add(msg.seq)
                    sched.apply_plan(msg, step)

        def report() -> None:
            nonlocal in_flight
            assert in_flight is not None
            sock.send(
                p.encode(
                    p.SaveReport(
                        v=p.VERSION,
                        job="j",
                        rank=0,
                        step=in_flight[0],
                        blocking_s=BLOCKING_S,
                        durable_s=durable_s,
                        bytes=1,
                        extra_step_s=EXTRA_S,
                    )
                )
            )
            in_flight = None

        barrier()
        next_report = clock[0] + 1.0
        while step < total:
            dt = step_s * (1 + rng.gauss(0, noise))
            clock[0] += dt
            step, count, spent = step + 1, count + 1, spent + dt
            if step >= sched.due:
                if in_flight is not None:  # one save at a time: wait for the last
                    waits += 1
                    clock[0] = max(clock[0], in_flight[1] + durable_s)
                    report()
                sched.saved(step)
                in_flight = (step, clock[0])
                saves.append((step, clock[0]))
                clock[0] += BLOCKING_S
            if clock[0] >= next_report:
                next_report = clock[0] + 1.0
                if in_flight is not None and clock[0] >= in_flight[1] + durable_s:
                    report()
                steps = p.Steps(
                    v=p.VERSION,
                    job="j",
                    rank=0,
                    step=step,
                    count=count,
                    mean_s=spent / count,
                    save_in_flight=in_flight is not None,
                )
                sock.send(p.encode(steps))
                count, spent = 0, 0.0
                barrier()
        sock.close(linger=0)
        ctx.term()
        daemon.stop()
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(saves)]
    return (
        f"{spec} durable={durable_s:g}s step={step_s:g}s noise={noise:g} steps={total}: "
        f"plans={len(seqs)} saves={len(saves)} waited={waits} "
        f"min_gap_s={min(gaps) if gaps else float('nan'):.3g} first={[s for s, _ in saves[:6]]}"
    )


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) != 5:
        sys.exit(__doc__)
    print(main(a[0], float(a[1]), float(a[2]), float(a[3]), int(a[4])))
