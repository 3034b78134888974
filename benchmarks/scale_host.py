"""One host at scale: a real daemon with 64 jobs of 8 ranks each (issue 35 item 5).

Three processes, as in benchmarks/daemon_footprint.py (whose daemon this reuses: the
:class:`adaptd.daemon.service.Service` that ``adaptd serve`` runs, with its SQLite
store, Prometheus endpoint and 1 Hz telemetry sampler on a fake 8-GPU NVML):

- the **daemon**;
- the **ranks**: 512 ZeroMQ DEALER peers in one process, each one rank of a job of 8,
  speaking the real protocol as the hook does: hello (``agreement="coordination"``,
  the ranks of a ``tf.distribute`` job on one host), one ``Steps`` report a second
  (``--rate`` steps a second in it), a ``SaveReport`` from every rank at each step the
  job's plan says to save, ``Goodbye`` at the end. Each job follows the plans its
  ranks get. Once a second one job's rank 0 sends its ``Steps`` report and then an
  ``AskConfig``, which the daemon answers after it has handled the report (it
  decides the job's plan on each report): the time to that answer is the **latency
  from a step report to a decision**, queueing behind the other ranks' reports
  included;
- this process, which samples the daemon's CPU time and RSS with psutil after a
  warm-up.

Then **a day of history**: the rows the daemon wrote while measured (saves,
decisions; per table, per second, after the warm-up: the jobs' first plans are
written once, not every second) are written again, as the daemon writes them
(:class:`adaptd.state.store.Store`'s ``record_*`` and one ``flush`` a second, with
the retention the daemon runs with), into a copy of its database for 86,400
simulated seconds, times moved on by the store's clock. The database's size at the
end is the day's.

Targets (issue 35): CPU <= 5 % of one core, RSS <= 200 MB. Exit status 1 when one is
missed.

Usage::

    nice -n 10 python benchmarks/scale_host.py                  # 120 s measured
    python benchmarks/scale_host.py --jobs 8 --duration 10 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CPU_TARGET = 0.05  # of one core
RSS_TARGET = 200 * 1024 * 1024
DAY_S = 86_400


# ------------------------------------------------------------------ the ranks process


class Job:
    """One job's ranks: their sockets, its step, the plan its ranks follow."""

    def __init__(self, ctx, name: str, world: int, socket: str, ckpt: Path, policy: str):  # type: ignore[no-untyped-def]
        import zmq

        from adaptd.protocol import job as p

        self.name = name
        self.ckpt = ckpt
        self.step = 0
        self.next_save: int | None = None
        self.every: int | None = None
        self.saves = 0
        self.socks = []
        for rank in range(world):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"ipc://{socket}")
            hello = p.Hello(v=p.VERSION, job=name, rank=rank, world_size=world, pid=os.getpid(),
                            checkpoint_dir=str(ckpt), gpus=1, policy=policy,
                            agreement="coordination")  # fmt: skip
            s.send(p.encode(hello))
            self.socks.append(s)

    def plan(self, msg) -> None:  # type: ignore[no-untyped-def]
        self.next_save, self.every = msg.next_step, msg.every_steps

    def advance(self, steps: int) -> list[int]:
        """Move the job on ``steps`` steps; the save steps it passed."""
        saved = []
        end = self.step + steps
        while self.next_save is not None and self.next_save <= end:
            saved.append(self.next_save)
            self.next_save = None if self.every is None else self.next_save + self.every
        if saved:  # a real job's first save creates its directory, which the daemon
            self.ckpt.mkdir(parents=True, exist_ok=True)  # then resolves once, not each second
        self.step = end
        return saved


def ranks_main(args: argparse.Namespace) -> int:
    import zmq

    from adaptd.protocol import job as p

    ctx = zmq.Context()
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    root = Path(args.ckpt_root)
    jobs = [
        Job(ctx, f"job{j:02d}", args.world, args.socket, root / f"tree{j % 4}" / f"job{j:02d}",
            args.policy)
        for j in range(args.jobs)
    ]  # fmt: skip
    poller = zmq.Poller()
    owner = {}
    for job in jobs:
        for rank, s in enumerate(job.socks):
            poller.register(s, zmq.POLLIN)
            owner[s] = (job, rank)
    sent = received = save_reports = 0
    latencies: list[float] = []
    probe: tuple[object, float] | None = None  # (socket, sent at)
    probe_job = 0
    per_batch = max(1, round(args.rate))
    next_send = time.monotonic() + 1.0
    while not stop:
        timeout = max(0.0, next_send - time.monotonic())
        for s, _ in poller.poll(timeout * 1000):
            while s.poll(0):
                msg = p.decode_daemon(s.recv())
                received += 1
                job, rank = owner[s]
                if isinstance(msg, p.Plan) and rank == 0:
                    job.plan(msg)
                elif isinstance(msg, p.JobConfig) and probe is not None and probe[0] is s:
                    latencies.append(time.monotonic() - probe[1])
                    probe = None
        if time.monotonic() < next_send:
            continue
        next_send += 1.0
        probe_s = None
        if probe is None:  # one probe at a time: the next job's rank 0, in turn
            probe_s = jobs[probe_job % len(jobs)].socks[0]
            probe_job += 1
        for job in jobs:
            saved = job.advance(per_batch)
            for rank, s in enumerate(job.socks):
                msg = p.Steps(v=p.VERSION, job=job.name, rank=rank, step=job.step,
                              count=per_batch, mean_s=1.0 / args.rate,
                              max_s=1.3 / args.rate)  # fmt: skip
                s.send(p.encode(msg))
                sent += 1
                if s is probe_s:
                    s.send(p.encode(p.AskConfig(v=p.VERSION, job=job.name, rank=rank)))
                    probe = (s, time.monotonic())
                for step in saved:
                    report = p.SaveReport(v=p.VERSION, job=job.name, rank=rank, step=step,
                                          blocking_s=0.05, durable_s=1.5, bytes=2 << 30,
                                          extra_step_s=0.02, reason="plan")  # fmt: skip
                    s.send(p.encode(report))
                    save_reports += 1
            job.saves += len(saved)
    for job in jobs:
        for rank, s in enumerate(job.socks):
            s.send(p.encode(p.Goodbye(v=p.VERSION, job=job.name, rank=rank, step=job.step)))
            s.close()
    ctx.term()
    print(json.dumps({
        "sent": sent, "received": received, "save_reports": save_reports,
        "saves_per_job": [j.saves for j in jobs], "latencies_s": latencies,
    }))  # fmt: skip
    return 0


# ------------------------------------------------------------------ a day of history


def _rows(db: Path, table: str) -> tuple[list[str], list[tuple]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        cur = conn.execute(f"SELECT * FROM {table} ORDER BY id")
        return [d[0] for d in cur.description], cur.fetchall()


def day_of_history(db: Path, window: tuple[float, float], out: Path) -> dict:
    """Write a day's rows at the rate the daemon wrote them in ``window`` (wall-clock
    seconds: the measured part, after the jobs' start), through the store's own write
    path, into a copy of its database; its size then."""
    from adaptd.state import records
    from adaptd.state.store import Store

    shutil.copy(db, out)
    for suffix in ("-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            shutil.copy(f"{db}{suffix}", f"{out}{suffix}")
    templates = {}
    for table, cls in (("saves", records.SaveRecord), ("decisions", records.DecisionRecord)):
        cols, rows = _rows(db, table)
        fields = set(cls.__dataclass_fields__)
        at = cols.index("started" if table == "saves" else "time")
        made = [
            {c: v for c, v in zip(cols, r, strict=True) if c in fields}
            for r in rows
            if window[0] <= r[at] < window[1]
        ]
        templates[table] = (cls, made)
    measured_s = window[1] - window[0]
    rates = {t: len(m[1]) / measured_s for t, m in templates.items()}
    reasons = Counter(r["reason"].split(" ≈ ")[0] for r in templates["decisions"][1])
    now = [time.time()]
    store = Store.open(out, clock=lambda: now[0])  # the daemon's retention defaults
    written = dict.fromkeys(templates, 0)
    due = dict.fromkeys(templates, 0.0)
    start = now[0]
    t_wall = time.monotonic()
    for second in range(DAY_S):
        now[0] = start + second
        for table, (cls, made) in templates.items():
            if not made:
                continue
            due[table] += rates[table]
            while due[table] >= 1.0:
                due[table] -= 1.0
                kw = dict(made[written[table] % len(made)])
                if table == "saves":
                    span = kw["ended"] - kw["started"]
                    kw["started"], kw["ended"] = now[0], now[0] + span
                    store.record_save(cls(**kw))
                else:
                    kw["time"] = now[0]
                    store.record_decision(cls(**kw))
                written[table] += 1
        store.flush()
    store.close()
    size = sum(Path(f"{out}{s}").stat().st_size for s in ("", "-wal") if Path(f"{out}{s}").exists())
    with sqlite3.connect(out) as conn:
        kept = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in templates}
    return {
        "rows_per_s": rates,
        "decision_reasons": dict(reasons.most_common(5)),
        "rows_written": written,
        "rows_kept": kept,
        "db_bytes": size,
        "synthesis_wall_s": time.monotonic() - t_wall,
    }


# ------------------------------------------------------------------ the measuring process


def measure(args: argparse.Namespace) -> dict:
    import psutil

    from adaptd.commands._spawn import stop_daemon, wait_for_path
    from adaptd.config.kinds import DB_NAME

    me = [sys.executable, str(Path(__file__).resolve())]
    footprint = [sys.executable, str(ROOT / "benchmarks" / "daemon_footprint.py")]
    with tempfile.TemporaryDirectory(prefix="adaptd-host-") as d:
        sock = Path(d) / "adaptd.sock"
        report = Path(d) / "report.json"
        daemon = subprocess.Popen(
            [*footprint, "_daemon", "--socket", str(sock), "--report", str(report),
             "--fixture", args.fixture, "--gpu-pid", str(os.getpid()),
             *(["--profile", args.profile] if args.profile else [])],
        )  # fmt: skip
        ranks = None
        try:
            wait_for_path(sock, daemon, 30.0)
            ranks = subprocess.Popen(
                [*me, "_ranks", "--socket", str(sock), "--jobs", str(args.jobs), "--world",
                 str(args.world), "--rate", str(args.rate), "--ckpt-root", d,
                 "--policy", args.policy],
                stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            proc = psutil.Process(daemon.pid)
            end_warmup = time.monotonic() + args.warmup
            while time.monotonic() < end_warmup and daemon.poll() is None:
                time.sleep(0.2)  # the warm-up is a duration, not a wait for an event
            c0, t0, w0 = proc.cpu_times(), time.monotonic(), time.time()
            rss = []
            next_at = t0
            while time.monotonic() - t0 < args.duration:
                if daemon.poll() is not None or ranks.poll() is not None:
                    raise RuntimeError("a benchmark process exited early")
                rss.append(proc.memory_info().rss)
                next_at += 1.0
                time.sleep(max(0.0, next_at - time.monotonic()))
            c1, t1, w1 = proc.cpu_times(), time.monotonic(), time.time()
        finally:
            ranks_out = "{}"
            if ranks is not None:
                ranks.send_signal(signal.SIGTERM)
                ranks_out, _ = ranks.communicate(timeout=60)
            stop_daemon(daemon)
        inside = json.loads(report.read_text())
        db = Path(d) / "state" / DB_NAME
        day = day_of_history(db, (w0, w1), Path(d) / "day.sqlite3") if args.day else None
    cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
    out = json.loads(ranks_out)
    lat = sorted(out.pop("latencies_s", []))
    return {
        "duration_s": t1 - t0,
        "warmup_s": args.warmup,
        "jobs": args.jobs,
        "ranks": args.jobs * args.world,
        "steps_per_s_per_rank": args.rate,
        "policy": args.policy or "(the daemon's choice)",
        "cpu_fraction_of_one_core": cpu_s / (t1 - t0),
        "rss_peak_bytes": max(rss),
        "rss_last_bytes": rss[-1],
        "decision_latency_s": {
            "n": len(lat),
            "p50": statistics.median(lat) if lat else None,
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
            "max": lat[-1] if lat else None,
        },
        "ranks_process": out,
        "daemon_counters": inside.get("daemon_counters", {}),
        "db_bytes_live": inside.get("db_bytes"),
        "day": day,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    r = sub.add_parser("_ranks")
    r.add_argument("--socket", required=True)
    r.add_argument("--jobs", type=int, required=True)
    r.add_argument("--world", type=int, required=True)
    r.add_argument("--rate", type=float, required=True)
    r.add_argument("--ckpt-root", required=True)
    r.add_argument("--policy", default="")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring")
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--world", type=int, default=8, help="ranks per job")
    parser.add_argument("--rate", type=float, default=10.0, help="steps/s per rank")
    parser.add_argument("--policy", default="fixed:seconds=60",
                        help="the jobs' policy ('' for the daemon's choice)")  # fmt: skip
    parser.add_argument("--fixture", default="h100_8gpu")
    parser.add_argument("--no-day", dest="day", action="store_false",
                        help="skip the day of history (minutes of writing)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--profile", default="", help="write the daemon's cProfile stats (the whole run) here"
    )
    args = parser.parse_args(argv)
    if args.role == "_ranks":
        return ranks_main(args)
    result = measure(args)
    checks = {
        "cpu <= 5% of a core": result["cpu_fraction_of_one_core"] <= CPU_TARGET,
        "rss <= 200 MB": result["rss_peak_bytes"] <= RSS_TARGET,
    }
    result["checks"] = checks
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        lat = result["decision_latency_s"]
        day = result["day"]
        print(f"{result['jobs']} jobs x {args.world} ranks, {args.rate:g} steps/s each, "
              f"{result['duration_s']:.0f}s measured")  # fmt: skip
        print(f"  daemon CPU {100 * result['cpu_fraction_of_one_core']:.2f}% of a core, RSS peak "
              f"{result['rss_peak_bytes'] / 2**20:.1f} MiB")  # fmt: skip
        if lat["n"]:
            print(f"  step report -> decision: p50 {lat['p50'] * 1e3:.2f} ms, p99 "
                  f"{lat['p99'] * 1e3:.2f} ms, max {lat['max'] * 1e3:.2f} ms "
                  f"({lat['n']} probes)")  # fmt: skip
        if day:
            print(f"  a day of history: {day['rows_written']} rows written "
                  f"({', '.join(f'{t} {v:.2f}/s' for t, v in day['rows_per_s'].items())}), "
                  f"{day['rows_kept']} kept, database "
                  f"{day['db_bytes'] / 2**20:.1f} MiB")  # fmt: skip
        for name, ok in checks.items():
            print(f"  {'ok  ' if ok else 'MISS'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
