"""A stand-in training rank that answers SaveNow: a real pid, real steps, real reports.

Usage: saving_job.py ENDPOINT JOB RANK WORLD_SIZE SAVE_S MODE

Says hello with its own pid and reports one step every ~20 ms. On SaveNow it
"writes" for SAVE_S seconds (steps go on, with ``save_in_flight``), then sends a
SaveReport for the step it saved, ``ok`` unless MODE is ``fail``; with MODE
``ignore`` it never answers. Prints one JSON line per daemon message it gets
(``{"got": "plan", ...}``) and ``{"saved": STEP}`` per report, so tests wait on
what the process really received.
"""

from __future__ import annotations

import json
import os
import sys
import time

import zmq

from adaptd.protocol import job as p


def main() -> None:
    endpoint, job, rank, world, save_s, mode = sys.argv[1:7]
    rank_i, save_for = int(rank), float(save_s)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send(
        p.encode(p.Hello(v=p.VERSION, job=job, rank=rank_i, world_size=int(world), pid=os.getpid()))
    )
    step = 0
    saving: tuple[int, float, str] | None = None  # (step, started, reason)
    while True:
        while sock.poll(20):  # ~20 ms per step
            msg = p.decode_daemon(sock.recv())
            info: dict = {"got": type(msg).__struct_config__.tag, "step": step}
            if isinstance(msg, p.Plan):
                info.update(
                    seq=msg.seq, next_step=msg.next_step, every=msg.every_steps,
                    policy=msg.policy, reason=msg.reason,
                )  # fmt: skip
            elif isinstance(msg, p.SaveNow):
                info["reason"] = msg.reason
                if mode != "ignore" and saving is None:
                    saving = (step, time.monotonic(), msg.reason)
            print(json.dumps(info), flush=True)
        step += 1
        sock.send(
            p.encode(
                p.Steps(
                    v=p.VERSION, job=job, rank=rank_i, step=step, count=1, mean_s=0.02,
                    save_in_flight=saving is not None,
                )
            )
        )  # fmt: skip
        if saving is not None and time.monotonic() - saving[1] >= save_for:
            saved, started, reason = saving
            ok = mode != "fail"
            report = p.SaveReport(
                v=p.VERSION, job=job, rank=rank_i, step=saved, blocking_s=0.01,
                durable_s=time.monotonic() - started, bytes=1024, ok=ok,
                error="" if ok else "disk full (test)", reason=reason,
            )  # fmt: skip
            sock.send(p.encode(report))
            print(json.dumps({"saved": saved, "ok": ok}), flush=True)
            saving = None


if __name__ == "__main__":
    main()
