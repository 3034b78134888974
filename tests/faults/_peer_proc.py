"""A separate process that talks to the daemon as one rank (or one operator), for the
isolation tests: its own pid, and optionally its own uid and groups.

    python _peer_proc.py SPEC_JSON

SPEC: ``endpoint``, ``job``, ``rank``, ``pid`` (claimed in the hello; default its
own), ``retry`` (say hello again every 0.3 s until welcomed), ``uid``/``gid``/
``groups`` (drop to them first; needs root), ``admin`` (a job socket path: send one
StatusRequest to the admin socket beside it instead, print the reply's op or error
code, and exit). Prints one JSON line per message received (``{"kind": ...,
"code": ...}``), starting with ``{"ready": PID}``; runs until killed.
"""

from __future__ import annotations

import json
import os
import sys

import zmq

from adaptd.protocol import admin
from adaptd.protocol import job as p


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if "uid" in spec:
        os.setgroups(spec.get("groups", []))
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
    if "admin" in spec:
        try:
            reply = admin.request(spec["admin"], admin.StatusRequest(), timeout_s=10)
            say(op=type(reply).__name__)
        except admin.AdminError as exc:
            say(error=exc.code, message=str(exc))
        return
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(spec["endpoint"])
    hello = p.Hello(
        v=p.VERSION,
        job=spec["job"],
        rank=spec.get("rank", 0),
        world_size=spec.get("world_size", 1),
        pid=spec.get("pid", os.getpid()),
        policy=spec.get("policy", ""),
    )
    sock.send(p.encode(hello))
    say(ready=os.getpid())
    welcomed = False
    while True:
        if not sock.poll(300):
            if spec.get("retry") and not welcomed:
                sock.send(p.encode(hello))
            continue
        msg = p.decode_daemon(sock.recv())
        welcomed = welcomed or isinstance(msg, p.Welcome)
        say(kind=str(type(msg).__struct_config__.tag), code=getattr(msg, "code", None))


if __name__ == "__main__":
    main()
