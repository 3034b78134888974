#!/usr/bin/env python3
"""Follow one job frame through the daemon: which files it passes, how often it comes back.

A reader who follows a step report from the socket to the plan it may change walks the
same path as this script: a real daemon (in a thread) gets a Hello, then one ``Steps``
frame from a real DEALER socket, and the handling of that frame is traced with
:func:`sys.settrace`. ``--frame save`` sends a ``SaveReport`` instead, to a daemon built
as ``adaptd serve`` builds it (:func:`adaptd.daemon.service_parts.build_service`, from a
config in a temporary directory), so its sinks (the store, the metrics, the upkeep,
the drains) hear it as they do in service; the replicator and the fleet, which need
a config of their own, are not in it. Printed (``--json`` for scripts):

- ``files``: the project's files the frame's handling runs code in;
- ``stops``: the project functions called while handling it, in order;
- ``returns``: how often the path enters a file it had already left (A -> B -> A
  counts one): the figure a flat, tangled layout drives up.

    python scripts/trace_frame.py [--json] [--path] [--steps N] [--frame steps|save]

Only the project's own code counts (``adaptd/``, ``client/``, ``policies/``), not
the standard library, pyzmq or msgspec.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent


def _imports():  # a daemon's maker and the protocol, wherever the layout keeps them
    try:
        from adaptd.daemon.assembly import build
        from adaptd.daemon.options import DaemonOptions
        from adaptd.protocol import job as protocol

        def daemon(sock: Path, policy: str):  # type: ignore[no-untyped-def]
            return build(DaemonOptions(socket=sock, default_policy=policy))
    except ImportError:  # before one build path (issue 22)
        try:
            from adaptd.daemon.server import Daemon
            from adaptd.protocol import job as protocol
        except ImportError:  # before the move into folders (issue 22)
            from adaptd import protocol  # type: ignore[no-redef]
            from adaptd.server import Daemon  # type: ignore[no-redef]

        def daemon(sock: Path, policy: str):  # type: ignore[no-untyped-def]
            return Daemon(sock, policy=policy)

    return daemon, protocol


def _ours(filename: str) -> str | None:
    path = Path(filename).resolve()
    try:
        rel = path.relative_to(ROOT)
    except ValueError:
        import adaptd

        base = Path(adaptd.__file__).resolve().parent
        try:
            rel = Path("adaptd") / path.relative_to(base)
        except ValueError:
            return None
    return rel.as_posix() if rel.parts[0] in {"adaptd", "client", "policies"} else None


def _service(sock: Path, tmp: str):  # type: ignore[no-untyped-def]
    """A daemon with the sinks ``adaptd serve`` gives it, and how to close them."""
    import threading as th
    import time

    from adaptd.config import loader
    from adaptd.daemon.sdnotify import Notifier
    from adaptd.daemon.service_parts import build_service
    from adaptd.telemetry.sampler import Sampler

    cfg = loader.loads(f'[daemon]\nsocket = "{sock}"\ndb_path = "{Path(tmp) / "state.db"}"\n')
    sampler = Sampler.default(interval=cfg.sample_interval_s)
    parts = build_service(
        cfg, notifier=Notifier({}), stopping=th.Event(), sampler=sampler, clock=time.monotonic
    )

    def close() -> None:
        parts.store.close()
        sampler.close()

    return parts.daemon, close


def trace(steps: int = 50, frame: str = "steps") -> dict[str, object]:
    """Run a daemon, send it a Hello and one Steps (or SaveReport) frame, and trace that
    frame."""
    make_daemon, protocol = _imports()
    calls: list[tuple[str, str]] = []
    done = threading.Event()

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            where = _ours(frame.f_code.co_filename)
            if where is not None:
                calls.append((where, frame.f_code.co_name))
        return None

    with tempfile.TemporaryDirectory(prefix="adaptd-trace-") as tmp:
        sock = Path(tmp) / "adaptd.sock"
        close = None
        if frame == "save":
            daemon, close = _service(sock, tmp)
            daemon.start()
        else:
            daemon = make_daemon(sock, "default").start()
        try:
            jobs = daemon.parts.jobs
            original = jobs.on_frames
            seen = [0]

            def on_frames(parts):  # type: ignore[no-untyped-def]
                seen[0] += 1
                if seen[0] != 2:  # the Hello, then the traced Steps frame
                    return original(parts)
                sys.settrace(tracer)
                try:
                    return original(parts)
                finally:
                    sys.settrace(None)
                    done.set()

            jobs.on_frames = on_frames  # the loop looks it up per message
            ctx = zmq.Context.instance()
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(f"ipc://{sock}")
            hello = protocol.Hello(
                v=protocol.VERSION, job="trace", rank=0, world_size=1, pid=1,
                checkpoint_dir=tmp,
            )  # fmt: skip
            dealer.send(protocol.encode(hello))
            if not dealer.poll(10_000):
                raise SystemExit("trace_frame: the daemon did not answer the Hello")
            dealer.recv()
            if frame == "save":
                report = protocol.SaveReport(
                    v=protocol.VERSION, job="trace", rank=0, step=steps, blocking_s=0.1,
                    durable_s=0.4, bytes=1 << 20, reason="periodic",
                )  # fmt: skip
            else:
                report = protocol.Steps(
                    v=protocol.VERSION, job="trace", rank=0, step=steps, count=steps,
                    mean_s=0.5, max_s=0.6,
                )  # fmt: skip
            dealer.send(protocol.encode(report))
            if not done.wait(10):
                raise SystemExit(f"trace_frame: the {frame} frame was not handled within 10 s")
            dealer.close()
        finally:
            daemon.stop()
            if close is not None:
                close()

    files = [f for f, _ in calls]
    order: list[str] = []
    returns = 0
    for i, f in enumerate(files):
        if i and f == files[i - 1]:
            continue
        if f in order:
            returns += 1
        order.append(f)
    return {
        "files": len(set(files)),
        "stops": len(calls),
        "returns": returns,
        "path": [f"{f}:{fn}" for f, fn in calls],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--path", action="store_true", help="also print every stop")
    parser.add_argument("--steps", type=int, default=50, help="the report's step (default 50)")
    parser.add_argument("--frame", choices=("steps", "save"), default="steps",
                        help="the frame traced: a Steps report (default) or a SaveReport, "
                        "to a daemon with the service's sinks")  # fmt: skip
    args = parser.parse_args(argv)
    out = trace(args.steps, args.frame)
    if args.json:
        print(json.dumps(out if args.path else {k: v for k, v in out.items() if k != "path"}))
        return 0
    print(f"files {out['files']}, stops {out['stops']}, returns {out['returns']}")
    if args.path:
        for stop in out["path"]:  # type: ignore[union-attr]
            print(f"  {stop}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
