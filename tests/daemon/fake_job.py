"""A stand-in training process for the liveness tests: a real pid that reports steps.

Usage: fake_job.py ENDPOINT JOB RANK WORLD_SIZE RESUMED_FROM

Says hello with its own pid, prints one JSON line ``{"ready": ..., "plan_seq": N}``
once it has its plan and the daemon has handled its first 3 steps, then reports
one step every ~50 ms (paced by polling its socket for daemon messages) until it
is killed.
"""

from __future__ import annotations

import json
import os
import sys

import zmq

from adaptd.protocol import job as p


def steps(job: str, rank: int, step: int) -> p.Steps:
    return p.Steps(v=p.VERSION, job=job, rank=rank, step=step, count=1, mean_s=0.05)


def wait_plan(sock: zmq.Socket) -> int:
    while True:
        if not sock.poll(10_000):
            sys.exit("no plan from the daemon within 10s")
        msg = p.decode_daemon(sock.recv())
        if isinstance(msg, p.Plan):
            return msg.seq


def main() -> None:
    endpoint, job, rank, world, resumed = sys.argv[1:6]
    rank_i, step = int(rank), int(resumed)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    hello = p.Hello(
        v=p.VERSION, job=job, rank=rank_i, world_size=int(world), pid=os.getpid(), resumed_from=step
    )
    sock.send(p.encode(hello))
    seq = wait_plan(sock)
    for _ in range(3):
        step += 1
        sock.send(p.encode(steps(job, rank_i, step)))
    sock.send(p.encode(hello))  # a reconnect: its reply proves the steps were handled
    wait_plan(sock)
    print(json.dumps({"ready": True, "pid": os.getpid(), "plan_seq": seq}), flush=True)
    while True:
        if sock.poll(50):  # the pace of a (fast) training loop; drain what the daemon sent
            sock.recv()
        step += 1
        sock.send(p.encode(steps(job, rank_i, step)))


if __name__ == "__main__":
    main()
