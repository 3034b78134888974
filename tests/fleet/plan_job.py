"""A stand-in training rank that follows the daemon's plans (no TensorFlow).

Usage: plan_job.py ENDPOINT JOB CKPT_DIR SAVE_S

Says hello (with CKPT_DIR, so the daemon maps it to its storage target) and takes one
step every ~20 ms, reporting steps about every 100 ms as the hook batches them. It
saves when a step reaches the plan's next save (or the grid after it) or on SaveNow:
the "write" lasts SAVE_S seconds while steps go on with ``save_in_flight``, then a
SaveReport goes out. Prints ``{"save": STEP, "start": t, "end": t}`` (monotonic
seconds, the machine's clock) per save, so a test compares saves across processes,
and ``{"plan": NEXT_STEP, "every": N, "t": t}`` per plan received.
"""

from __future__ import annotations

import json
import os
import sys
import time

import zmq

from adaptd.protocol import job as p


def main() -> None:
    endpoint, job, ckpt_dir, save_s = sys.argv[1:5]
    save_for = float(save_s)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send(
        p.encode(p.Hello(v=p.VERSION, job=job, pid=os.getpid(), checkpoint_dir=ckpt_dir, gpus=8))
    )
    plan: p.Plan | None = None
    step = reported = 0
    last_report = time.monotonic()
    saving: tuple[int, float] | None = None
    urgent = False
    while True:
        while sock.poll(20):  # ~20 ms per step
            msg = p.decode_daemon(sock.recv())
            if isinstance(msg, p.Plan):
                plan = msg
                print(json.dumps({"plan": msg.next_step, "every": msg.every_steps,
                                  "t": time.monotonic()}), flush=True)  # fmt: skip
            elif isinstance(msg, p.SaveNow):
                urgent = True
        step += 1
        due = False
        if plan is not None and plan.next_step is not None:
            nxt = plan.next_step
            every = plan.every_steps
            due = step == nxt or (every and step > nxt and (step - nxt) % every == 0)
        if (due or urgent) and saving is None:
            saving = (step, time.monotonic())
            urgent = False
        now = time.monotonic()
        if now - last_report >= 0.1:
            sock.send(
                p.encode(
                    p.Steps(
                        v=p.VERSION, job=job, rank=0, step=step, count=step - reported,
                        mean_s=0.02, save_in_flight=saving is not None,
                    )
                )
            )  # fmt: skip
            reported, last_report = step, now
        if saving is not None and now - saving[1] >= save_for:
            saved, started = saving
            sock.send(
                p.encode(
                    p.SaveReport(
                        v=p.VERSION, job=job, rank=0, step=saved, blocking_s=0.01,
                        durable_s=now - started, bytes=1024,
                    )
                )
            )  # fmt: skip
            print(json.dumps({"save": saved, "start": started, "end": now}), flush=True)
            saving = None


if __name__ == "__main__":
    main()
