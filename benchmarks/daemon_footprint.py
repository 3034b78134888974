"""The daemon's CPU and memory at 1 Hz with a fake 8-GPU NVML and 16 busy jobs.

Three processes, so that what is measured is the daemon alone:

- the **daemon**: the same :class:`adaptd.daemon.service.Service` that ``adaptd serve``
  runs (SQLite store, Prometheus endpoint on a loopback port, learned-parameter
  persistence, the telemetry sampler at 1 Hz), its sampler reading a fake 8-GPU
  NVML replayed from ``tests/fixtures/nvml/h100_8gpu.json`` (its process lists
  point at the jobs' process, so the pid -> GPU mapping runs) and the real
  ``/proc`` and ``/sys`` for storage and host;
- the **jobs**: 16 raw ZeroMQ DEALER peers in one process, each a job that says
  hello and then reports 100 steps/s as the training hook does (one
  ``protocol.Steps`` per second carrying 100 steps);
- this process, which samples the daemon's CPU time and RSS with psutil after a
  warm-up, and reads back from the daemon which modules it imported.

Targets (issue 3): CPU <= 1 % of one core, RSS <= 100 MB, tensorflow never
imported by the daemon. Exit status 1 when one is missed.

Usage::

    python benchmarks/daemon_footprint.py                  # 60 s measured
    python benchmarks/daemon_footprint.py --duration 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the fake NVML (tests/nvml_fixture.py)

CPU_TARGET = 0.01  # of one core
RSS_TARGET = 100 * 1024 * 1024
HEAVY = ("tensorflow", "keras", "numpy", "scipy", "psutil", "pynvml", "prometheus_client")


# ------------------------------------------------------------------ the daemon process


def daemon_main(args: argparse.Namespace) -> int:
    import logging
    import socket as so

    from nvml_fixture import CALLS_KEPT, FixtureNvml

    from adaptd.config import loader as config
    from adaptd.daemon.service import Service
    from adaptd.telemetry import nvml
    from adaptd.telemetry.host import Host
    from adaptd.telemetry.report import to_dict
    from adaptd.telemetry.sampler import Sampler
    from adaptd.telemetry.storage import Storage

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fake = FixtureNvml(args.fixture)
    for i in range(8):  # the jobs' process runs on every GPU
        fake.override(
            i,
            "nvmlDeviceGetComputeRunningProcesses",
            [{"pid": args.gpu_pid, "usedGpuMemory": 70 << 30}],
        )
    sampler = Sampler(nvml=nvml.open(fake), storage=Storage(), host=Host(), interval=1.0)
    with so.socket() as s:  # a free loopback port for the metrics endpoint
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = Path(args.socket).parent / "state"
    cfg = config.loads(
        f"[daemon]\nsocket = {json.dumps(args.socket)}\nstate_dir = {json.dumps(str(state))}\n"
        f'drain_grace_s = 0\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
    )
    service = Service(cfg, sampler=sampler)
    if args.profile:  # where the daemon's CPU goes (benchmarks/scale_host.py --profile)
        import cProfile

        with cProfile.Profile() as prof:
            service.run()  # SIGTERM stops it (no drain: drain_grace_s = 0)
        prof.dump_stats(args.profile)
    else:
        service.run()
    import resource

    snap = sampler.latest()
    report = {
        "modules": {m: m in sys.modules for m in HEAVY},
        "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "samples": sampler.samples,
        "sampler_failures": dict(sampler.failures),
        "gpus": len(snap.gpus),
        "gpus_with_jobs": sum(bool(g.jobs) for g in snap.gpus),
        "storage_targets": len(snap.storage),
        "jobs_on_targets": sum(len(s.jobs) for s in snap.storage),
        # the fake keeps its newest CALLS_KEPT calls: past that the count is unknown
        "nvml_calls_per_sample": (
            len(fake.calls) / max(1, sampler.samples) if len(fake.calls) < CALLS_KEPT else None
        ),
        "daemon_counters": dict(service.daemon.counters) if service.daemon else {},
        "db_bytes": cfg.db_path.stat().st_size if cfg.db_path.exists() else 0,
        "snapshot": to_dict(snap),
    }
    Path(args.report).write_text(json.dumps(report))
    return 0


# ------------------------------------------------------------------ the jobs process


def jobs_main(args: argparse.Namespace) -> int:
    import zmq

    from adaptd.protocol import job as p

    ctx = zmq.Context()
    socks = []
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    root = Path(args.ckpt_root)
    for j in range(args.jobs):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"ipc://{args.socket}")
        # four jobs per checkpoint directory tree, all on this machine's disk
        ckpt = root / f"tree{j % 4}" / f"job{j:02d}"
        hello = p.Hello(
            v=p.VERSION, job=f"job{j:02d}", pid=os.getpid(), checkpoint_dir=str(ckpt), gpus=1
        )
        s.send(p.encode(hello))
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    step = [0] * args.jobs
    sent = received = 0
    per_batch = max(1, round(args.rate * args.batch_s))
    next_send = time.monotonic() + args.batch_s
    while not stop:
        timeout = max(0.0, next_send - time.monotonic())
        for s, _ in poller.poll(timeout * 1000):
            while s.poll(0):
                p.decode_daemon(s.recv())
                received += 1
        if time.monotonic() >= next_send:
            next_send += args.batch_s
            for j, s in enumerate(socks):
                step[j] += per_batch
                msg = p.Steps(
                    v=p.VERSION,
                    job=f"job{j:02d}",
                    rank=0,
                    step=step[j],
                    count=per_batch,
                    mean_s=1.0 / args.rate,
                    max_s=1.3 / args.rate,
                )
                s.send(p.encode(msg))
                sent += 1
    for j, s in enumerate(socks):
        s.send(p.encode(p.Goodbye(v=p.VERSION, job=f"job{j:02d}", rank=0, step=step[j])))
        s.close()
    ctx.term()
    print(json.dumps({"sent": sent, "received": received, "steps": sum(step)}))
    return 0


# ------------------------------------------------------------------ the measuring process


def measure(args: argparse.Namespace) -> dict:
    import psutil

    from adaptd.commands._spawn import stop_daemon, wait_for_path

    me = [sys.executable, str(Path(__file__).resolve())]
    with tempfile.TemporaryDirectory(prefix="adaptd-fp-") as d:
        sock = Path(d) / "adaptd.sock"
        report = Path(d) / "report.json"
        jobs = subprocess.Popen(
            [*me, "_jobs", "--socket", str(sock), "--jobs", str(args.jobs), "--rate",
             str(args.rate), "--ckpt-root", d],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        daemon = subprocess.Popen(
            [*me, "_daemon", "--socket", str(sock), "--report", str(report), "--fixture",
             args.fixture, "--gpu-pid", str(jobs.pid)],
        )  # fmt: skip
        try:
            wait_for_path(sock, daemon, 30.0)
            proc = psutil.Process(daemon.pid)
            end_warmup = time.monotonic() + args.warmup
            while time.monotonic() < end_warmup and daemon.poll() is None:
                time.sleep(0.2)  # the warm-up is a duration, not a wait for an event
            c0, t0 = proc.cpu_times(), time.monotonic()
            rss = []
            next_at = t0
            while time.monotonic() - t0 < args.duration:
                if daemon.poll() is not None or jobs.poll() is not None:
                    raise RuntimeError("a benchmark process exited early")
                rss.append(proc.memory_info().rss)
                next_at += 1.0
                time.sleep(max(0.0, next_at - time.monotonic()))
            c1, t1 = proc.cpu_times(), time.monotonic()
            threads = proc.num_threads()
        finally:
            jobs.send_signal(signal.SIGTERM)
            jobs_out, _ = jobs.communicate(timeout=30)
            stop_daemon(daemon)
        inside = json.loads(report.read_text())
    cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
    return {
        "duration_s": t1 - t0,
        "warmup_s": args.warmup,
        "jobs": args.jobs,
        "steps_per_s_per_job": args.rate,
        "cpu_fraction_of_one_core": cpu_s / (t1 - t0),
        "rss_peak_bytes": max(rss),
        "rss_last_bytes": rss[-1],
        "daemon_threads": threads,
        "jobs_process": json.loads(jobs_out),
        "daemon": inside,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    d = sub.add_parser("_daemon")
    d.add_argument("--socket", required=True)
    d.add_argument("--report", required=True)
    d.add_argument("--fixture", default="h100_8gpu")
    d.add_argument("--gpu-pid", type=int, required=True)
    d.add_argument("--profile", default="", help="write the daemon's cProfile stats here")
    j = sub.add_parser("_jobs")
    j.add_argument("--socket", required=True)
    j.add_argument("--jobs", type=int, default=16)
    j.add_argument("--rate", type=float, default=100.0)
    j.add_argument("--batch-s", type=float, default=1.0)
    j.add_argument("--ckpt-root", required=True)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--rate", type=float, default=100.0, help="steps/s per job")
    parser.add_argument("--fixture", default="h100_8gpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "_daemon":
        return daemon_main(args)
    if args.role == "_jobs":
        return jobs_main(args)

    r = measure(args)
    inside = r["daemon"]
    checks = {
        "cpu <= 1% of a core": r["cpu_fraction_of_one_core"] <= CPU_TARGET,
        "rss <= 100 MB": r["rss_peak_bytes"] <= RSS_TARGET,
        "tensorflow never imported": not inside["modules"]["tensorflow"],
        "every sample succeeded": not inside["sampler_failures"],
    }
    r["checks"] = checks
    if args.json:
        r["daemon"].pop("snapshot")
        print(json.dumps(r, indent=1))
    else:
        print(
            f"adaptd serve (Service), {r['jobs']} jobs x {r['steps_per_s_per_job']:.0f} steps/s,"
            " fake 8-GPU NVML,"
            f" {r['duration_s']:.0f} s measured after {r['warmup_s']:.0f} s warm-up"
        )
        print(f"  CPU      {r['cpu_fraction_of_one_core'] * 100:.2f} % of one core")
        print(
            f"  RSS      peak {r['rss_peak_bytes'] / 2**20:.1f} MiB, last"
            f" {r['rss_last_bytes'] / 2**20:.1f} MiB"
        )
        print(
            f"  sampled  {inside['samples']} snapshots, {inside['gpus']} GPUs"
            f" ({inside['gpus_with_jobs']} mapped to jobs), {inside['storage_targets']} storage"
            f" target(s) holding {inside['jobs_on_targets']} jobs,"
            f" {inside['nvml_calls_per_sample'] or 0:.0f} NVML calls per sample"
        )
        print(
            f"  traffic  {r['jobs_process']['sent']} step reports sent,"
            f" {r['jobs_process']['received']} replies; daemon counters"
            f" {inside['daemon_counters']}"
        )
        loaded = [m for m, v in inside["modules"].items() if v]
        print(f"  modules  loaded in the daemon: {', '.join(loaded) or 'none of ' + str(HEAVY)}")
        for name, ok in checks.items():
            print(f"  {'PASS' if ok else 'FAIL'}     {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
