"""A fleet member in a process of its own (a host's daemon, as far as etcd can tell).

Runs a :class:`~adaptd.fleet.agent.FleetAgent` and takes commands on stdin, one per
line::

    want JOB TARGET CAP AT_RISK_GPU_S GPUS
    release JOB
    quit

and prints a JSON line on stdout each time what it holds or waits for changes:
``{"t": <monotonic>, "up": bool, "granted": [...], "waiting": [...]}`` (the
monotonic clock is the machine's, so the test compares it with its own).

    python member_proc.py URL PREFIX HOST [TTL]
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time

from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.session import FleetSettings


def main() -> int:
    url, prefix, host = sys.argv[1:4]
    ttl = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    agent = FleetAgent(
        FleetSettings(
            endpoints=(url,),
            host=host,
            prefix=prefix,
            lease_ttl_s=ttl,
            call_timeout_s=0.5,
            call_deadline_s=1.0,
        ),
        poll_s=0.2,
    ).start()
    done = threading.Event()

    def report() -> None:
        last = None
        while not done.is_set():
            v = agent.view()
            now = (v.up, sorted(v.granted), sorted(v.waiting))
            if now != last:
                last = now
                line = {"t": time.monotonic(), "up": v.up, "granted": now[1], "waiting": now[2]}
                print(json.dumps(line), flush=True)
            with contextlib.suppress(TimeoutError):
                agent.wait_for(lambda x, seen=v: x is not seen, 1.0)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "want":
            job, target, cap, risk, gpus = words[1:6]
            agent.want(job, target, cap=int(cap), at_risk_gpu_s=float(risk), gpus=int(gpus))
        elif words[0] == "release":
            agent.release(words[1])
        elif words[0] == "quit":
            break
    done.set()
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
