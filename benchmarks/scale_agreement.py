"""An agreement round against the number of workers: its latency and the chief's
key-value operations, on TensorFlow's real coordination service.

Each run is a job of N ranks whose workers are forked from one process that imported
TensorFlow once (tests/faults/zygote.py, as the suite's multi-worker tests are:
tests/multiworker/forked.py's ``ForkedCluster``). Every worker process is a real
``MultiWorkerMirroredStrategy`` member, so task 0 hosts the coordination service and
every other process reaches it over gRPC, as in a real job. Each rank runs the real
:class:`adaptd.client.agreement.rounds.Agreement` (its watcher thread, its mailbox) on
a :class:`adaptd.client.agreement.kv.CountingStore` over the process's
:class:`~adaptd.client.agreement.coordination.Coordination`, so every key-value call
the agreement makes is counted where it is made.

Two kinds of run:

- **one rank per process** (``--sizes 2 4 8 16``): N real workers, as a job has them;
- **many ranks per process** (``--wide 32 64 128 --procs 4``): N ranks spread over a
  few worker processes, each rank with its own agreement and watcher thread on its
  process's client of the one service. What a rank sends and reads is the same as in
  a process of its own (the counts are exact); the latency is an upper bound, the
  ranks of one process sharing its GIL and gRPC channel.

What a rank does not do here is train: its step is fixed below the proposal's step,
so every acknowledgement says yes at once and a round is the protocol alone. The chief
(rank 0) proposes ``--rounds`` urgent saves, one after the other; after each committed
round every other rank posts its save's cost to the chief (:class:`~adaptd.protocol.
job.SaveCost`, one ``put``, as the hook does after a save), and the next round starts
``--gap`` seconds after the last rank recorded the previous one. Then every rank idles
``--idle`` seconds, to count what the chief's watcher does between rounds.

Figures per N: round latency (the proposer's ``put`` to the last rank's record, and
to the proposer's own record) p50 and max; the chief's operations per round by
operation and key kind; a non-chief rank's; the chief's operations per second while
idle; the CPU time of the chief's process (rank 0 and the coordination service) per
round and gap, and of every process of the job per round. Then least-squares fits (a
power law for the exponent; a line), over all runs and over each kind alone, and
their value at 2,048 ranks.

Usage::

    nice -n 10 python benchmarks/scale_agreement.py                      # 2..16 and 32..256
    nice -n 10 python benchmarks/scale_agreement.py --sizes 2 4 --wide --json
    python benchmarks/scale_agreement.py --plot docs/scale_agreement.png before.json after.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the zygote and the forked cluster

JOB = "scale"
TARGET_N = 2048
TARGET_ROUND_S = 1.0


# ------------------------------------------------------------------ a worker process


class BenchRank:
    """One rank: its agreement on a counting store, the times it recorded rounds."""

    def __init__(self, base: Any, rank: int, world: int, timeout_s: float) -> None:
        from adaptd.client.agreement.kv import CountingStore
        from adaptd.client.agreement.ranks import Identity
        from adaptd.client.agreement.rounds import Agreement, AgreementOptions
        from adaptd.client.save.schedule import SaveSchedule

        self.rank = rank
        self.store = CountingStore(base)
        self.step = 0
        self.recorded: list[float] = []  # monotonic time each round was recorded here
        self.changed = threading.Condition()
        self.schedule = SaveSchedule()
        self.agreement = Agreement(
            self.store,
            Identity(JOB, rank, world),
            position=lambda: self.step,
            wake=self._wake,
            session=0,
            options=AgreementOptions(timeout_s=timeout_s, lead_time_s=0.0),
        )

    def _wake(self) -> None:
        # called with the agreement's lock held: at an acknowledgement and at a record
        n = len(self.agreement.ledger.rounds)
        if n > len(self.recorded):
            self.recorded.append(time.monotonic())
            with self.changed:
                self.changed.notify_all()

    def wait_rounds(self, n: int, deadline: float) -> bool:
        with self.changed:
            while len(self.recorded) < n:
                left = deadline - time.monotonic()
                if left <= 0 or self.agreement.broken:
                    return False
                self.changed.wait(min(left, 0.5))
        return True


def _rss_mb() -> float:
    """This process's resident memory, in MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _counts(store: Any) -> dict[str, int]:
    return {f"{op} {kind}": n for (op, kind), n in sorted(store.counts().items())}


def _misses(store: Any) -> dict[str, int]:
    """The chief's gets that found no key (each one the coordination service and its
    client keep: 35 KB until the key is written, 88 bytes of Python for good)."""
    return {f"{op} {kind}": n for (op, kind), n in sorted(store.misses().items())}


def _minus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0)}


def worker() -> int:
    import tensorflow as tf

    from adaptd.client.agreement import ranks
    from adaptd.client.agreement.coordination import Coordination
    from adaptd.protocol import job as p

    tf.distribute.MultiWorkerMirroredStrategy()
    task, tasks = ranks.resolve()
    n = int(os.environ["BENCH_N"])
    rounds = int(os.environ["BENCH_ROUNDS"])
    gap_s = float(os.environ["BENCH_GAP"])
    idle_s = float(os.environ["BENCH_IDLE"])
    timeout_s = float(os.environ["BENCH_TIMEOUT"])
    base = Coordination(task, tasks)
    mine = [BenchRank(base, r, n, timeout_s) for r in range(task, n, tasks)]
    for r in mine:
        r.agreement.start()
    base.barrier("bench/start", 300)
    chief = mine[0] if task == 0 else None
    out: dict[str, Any] = {"task": task, "ranks": [r.rank for r in mine], "rounds": []}
    deadline_each = 4 * timeout_s + 30
    cpu_start = time.process_time()  # every thread of this process: its ranks, its service
    for i in range(rounds):
        if chief is not None:
            cycle = _counts(chief.store)
            cpu_cycle = time.process_time()
            time.sleep(gap_s)  # rounds of a real job are seconds to minutes apart
            before = _counts(chief.store)
            chief.step = 1000 * (i + 1)
            t0 = time.monotonic()
            chief.agreement.want_save(f"bench {i}", chief.step)
            chief.agreement.boundary(chief.step, chief.schedule, None)
        ok = all(r.wait_rounds(i + 1, time.monotonic() + deadline_each) for r in mine)
        if not ok:
            raise SystemExit(f"task {task}: round {i} not recorded by every rank in time")
        # not counted (the benchmark's own key): when this process's ranks recorded it
        base.put(f"bench/{i}/end/{task}", repr(max(r.recorded[i] for r in mine)))
        for r in mine:  # what each rank's hook does after the save: its cost to the chief
            if r.rank:
                cost = p.SaveCost(v=p.VERSION, job=JOB, rank=r.rank, step=1000 * (i + 1),
                                  blocking_s=0.01)  # fmt: skip
                r.agreement.mailbox.post(cost)
        if chief is not None:
            ends = []
            for t in range(tasks):
                raw = base.get(f"bench/{i}/end/{t}", deadline_each)
                if raw is None:
                    raise SystemExit(f"task {t} did not finish round {i}")
                ends.append(float(raw))
            out["rounds"].append({
                "commit_s": chief.recorded[i] - t0,
                "all_s": max(ends) - t0,
                "chief_ops": _minus(_counts(chief.store), before),
                "cycle_ops": _minus(_counts(chief.store), cycle),
                "cycle_cpu_s": time.process_time() - cpu_cycle,
            })  # fmt: skip
    out["cpu_s"] = time.process_time() - cpu_start
    # rounds over: everyone idles, and the chief's watcher is counted meanwhile
    base.barrier("bench/rounds-over", 300)
    if chief is not None:
        # the idle window starts once the chief has read every save's cost (the mail
        # of the last rounds is still being read a while after them)
        expected, until = rounds * (n - 1), time.monotonic() + 120
        while len(chief.agreement.mailbox.inbox) < expected and time.monotonic() < until:
            time.sleep(0.05)
        out["mail_drain_s"] = time.monotonic() - (until - 120)
        before = _counts(chief.store)
        rss0 = _rss_mb()
        t0 = time.monotonic()
        series = []  # (seconds into the window, MB) every 30 s: does it level off?
        while (left := t0 + idle_s - time.monotonic()) > 0:
            time.sleep(min(30.0, left))
            series.append((round(time.monotonic() - t0, 1), _rss_mb()))
        out["idle"] = {"seconds": time.monotonic() - t0,
                       "chief_ops": _minus(_counts(chief.store), before),
                       # the chief's process holds the coordination service
                       "chief_rss_mb": [rss0, series[-1][1] if series else rss0],
                       "chief_rss_series_mb": series}  # fmt: skip
        out["mail_read"] = len(chief.agreement.mailbox.inbox)
        out["misses"] = _misses(chief.store)  # the whole run: rounds, mail, idle
    others = [r for r in mine if r.rank]
    if others:
        out["rank_ops"] = _counts(others[0].store)
        out["rank_total"] = others[0].store.total()
    base.barrier("bench/idle-over", idle_s + 300)  # the chief idles, then reads its memory
    for r in mine:
        r.agreement.close()
    out["broken"] = [r.agreement.broken for r in mine if r.agreement.broken]
    Path(os.environ["RESULT"]).write_text(json.dumps(out))
    # no task leaves before every task is done with the service (a task that left can
    # make the service fail the others' calls), and the chief, which hosts it, leaves
    # last: once every other task made its last call
    base.put(f"bench/done/{task}", "1")
    for t in range(tasks):
        base.get(f"bench/done/{t}", 120)
    if task:
        base.put(f"bench/left/{task}", "1")
    else:
        for t in range(1, tasks):
            base.get(f"bench/left/{t}", 120)
    return 0


# ------------------------------------------------------------------ the measuring process


def run_size(zygote: Any, workdir: Path, n: int, procs: int, args: argparse.Namespace) -> dict:
    from multiworker.forked import ForkedCluster

    env = {
        "BENCH_N": str(n),
        "BENCH_ROUNDS": str(args.rounds),
        "BENCH_GAP": str(args.gap),
        "BENCH_IDLE": str(args.idle),
        "BENCH_TIMEOUT": str(args.timeout),
    }
    cluster = ForkedCluster(zygote, workdir / f"n{n}-p{procs}", procs, Path(__file__),
                            ["_worker"], env=env)  # fmt: skip
    t0 = time.monotonic()
    with cluster:
        results = cluster.wait_ok(args.deadline)
    chief = results[0]
    rounds = chief["rounds"][1:] or chief["rounds"]  # the first round warms the channels
    total = lambda ops: sum(ops.values())  # noqa: E731
    per_round: dict[str, float] = {}
    for r in rounds:
        for k, v in r["chief_ops"].items():
            per_round[k] = per_round.get(k, 0) + v / len(rounds)
    rank_rounds = args.rounds
    rank_ops = next((r["rank_ops"] for r in results if "rank_ops" in r), {})
    idle = chief["idle"]
    return {
        "n": n,
        "procs": procs,
        "wall_s": time.monotonic() - t0,
        "round_all_p50_s": statistics.median(r["all_s"] for r in rounds),
        "round_all_max_s": max(r["all_s"] for r in rounds),
        "round_commit_p50_s": statistics.median(r["commit_s"] for r in rounds),
        "chief_ops_per_round": statistics.mean(total(r["chief_ops"]) for r in rounds),
        "chief_ops_per_cycle": statistics.mean(total(r["cycle_ops"]) for r in rounds),
        # the chief's process (rank 0 and the coordination service) per round and gap
        "chief_cpu_per_cycle_s": statistics.mean(r["cycle_cpu_s"] for r in rounds),
        # every process of the job, per round (the gaps and the mail included)
        "job_cpu_per_round_s": sum(r["cpu_s"] for r in results) / args.rounds,
        "chief_ops_by_kind": {k: round(v, 1) for k, v in sorted(per_round.items())},
        "rank_ops_per_round": sum(rank_ops.values()) / rank_rounds if rank_ops else None,
        "rank_ops_by_kind": rank_ops,
        "chief_idle_ops_per_s": total(idle["chief_ops"]) / idle["seconds"],
        "chief_idle_ops": idle["chief_ops"],
        # what an idle job grows the chief's process by (issue 35: a get that timed out
        # on a missing key stays with the coordination service until the key is written)
        "chief_idle_rss_mb": idle.get("chief_rss_mb"),
        "chief_idle_rss_series_mb": idle.get("chief_rss_series_mb"),
        "chief_idle_rss_mb_per_rank_hour": (
            (idle["chief_rss_mb"][1] - idle["chief_rss_mb"][0]) / idle["seconds"] * 3600 / n
            if "chief_rss_mb" in idle
            else None
        ),
        "mail_read": chief["mail_read"],
        "mail_drain_s": chief["mail_drain_s"],
        "chief_misses": chief.get("misses"),
        # the chief's gets of mail keys that were not there, per save (every rank's cost)
        "chief_mail_misses_per_save": (
            sum(v for k, v in chief["misses"].items() if k.endswith(" mail")) / args.rounds
            if "misses" in chief
            else None
        ),
        "broken": [b for r in results for b in r["broken"]],
    }


def fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """y = a + b·x (least squares) and y = c·x^k (least squares on logs)."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    out = {"a": a, "b": b, "at_target": a + b * TARGET_N}
    if all(y > 0 for y in ys):
        lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
        mlx, mly = statistics.mean(lx), statistics.mean(ly)
        k = sum((u - mlx) * (v - mly) for u, v in zip(lx, ly, strict=True)) / sum(
            (u - mlx) ** 2 for u in lx
        )
        out["exponent"] = k
        out["power_at_target"] = math.exp(mly - k * mlx) * TARGET_N**k
    return out


def plot(path: Path, runs: list[Path]) -> None:
    """Round latency and the chief's calls per round against N, one line per saved
    ``--json`` output (named after its file), on log-log axes with the 1 s goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for run in runs:
        data = json.loads(run.read_text())
        ns = [s["n"] for s in data["sizes"]]
        label = run.stem
        ax1.plot(ns, [s["round_all_p50_s"] for s in data["sizes"]], "o-", label=label)
        ax2.plot(ns, [s["chief_ops_per_cycle"] for s in data["sizes"]], "o-", label=label)
        f = data["fits"].get("round_all_p50_s (many)")
        if f:
            x0 = min(s["n"] for s in data["sizes"] if s["procs"] < s["n"])
            if f["a"] + f["b"] * x0 <= 0:  # a line below 0 there: from where it is above
                x0 = -2 * f["a"] / f["b"]
            xs = [x0, TARGET_N]
            ax1.plot(xs, [f["a"] + f["b"] * x for x in xs], ":", color=ax1.lines[-1].get_color())
    ax1.axhline(TARGET_ROUND_S, color="grey", lw=0.8)
    ax1.set(xscale="log", yscale="log", xlabel="ranks (N)", ylabel="round p50 (s)",
            title="round latency (dotted: line fitted to the many-ranks runs)")  # fmt: skip
    ax2.set(xscale="log", yscale="log", xlabel="ranks (N)", ylabel="chief key-value calls",
            title="chief's calls per round, mail included")  # fmt: skip
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="*", default=[2, 4, 8, 16],
                        help="jobs of one rank per worker process")  # fmt: skip
    parser.add_argument("--wide", type=int, nargs="*", default=[32, 64, 128, 256],
                        help="jobs of many ranks over --procs worker processes")  # fmt: skip
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--gap", type=float, default=0.6, help="seconds between rounds")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds counted idle")
    parser.add_argument("--timeout", type=float, default=60.0, help="the agreement's timeout_s")
    parser.add_argument("--deadline", type=float, default=600.0, help="bound on one job")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, help="draw saved --json outputs (given after it)")
    parser.add_argument("runs", nargs="*", type=Path, default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "_worker":
        return worker()
    if args.plot:
        plot(args.plot, [Path(args.role), *args.runs] if args.role else args.runs)
        return 0
    from faults.zygote import Zygote

    runs = [(n, n) for n in args.sizes] + [(n, min(args.procs, n)) for n in args.wide]
    sizes = []
    with tempfile.TemporaryDirectory(prefix="adaptd-scale-") as d:
        zygote = Zygote(Path(d) / "zygote")
        try:
            for n, procs in runs:
                r = run_size(zygote, Path(d), n, procs, args)
                sizes.append(r)
                if not args.json:
                    print(f"N={n:5d} procs={procs:3d}  round p50 {r['round_all_p50_s']*1e3:8.1f} ms"
                          f" (max {r['round_all_max_s']*1e3:8.1f})  commit p50 "
                          f"{r['round_commit_p50_s']*1e3:8.1f} ms  chief ops/round "
                          f"{r['chief_ops_per_round']:7.1f} (cycle {r['chief_ops_per_cycle']:7.1f})"
                          f"  rank ops/round {r['rank_ops_per_round'] or 0:5.1f}  chief idle "
                          f"ops/s {r['chief_idle_ops_per_s']:7.1f}  chief cpu/cycle "
                          f"{r['chief_cpu_per_cycle_s']*1e3:6.1f} ms  job cpu/round "
                          f"{r['job_cpu_per_round_s']*1e3:7.1f} ms", flush=True)  # fmt: skip
        finally:
            zygote.close()
    ns = [float(r["n"]) for r in sizes]
    fits = {}
    if len(sizes) >= 2:
        keys = ("round_all_p50_s", "round_commit_p50_s", "chief_ops_per_round",
                "chief_ops_per_cycle", "chief_idle_ops_per_s", "chief_cpu_per_cycle_s",
                "job_cpu_per_round_s")  # fmt: skip
        for key in keys:
            fits[key] = fit(ns, [float(r[key]) for r in sizes])
        # the same over each kind of run alone (one rank per process; many)
        for kind, part in (("one", [r for r in sizes if r["procs"] == r["n"]]),
                           ("many", [r for r in sizes if r["procs"] < r["n"]])):  # fmt: skip
            if len(part) >= 2:
                for key in keys:
                    fits[f"{key} ({kind})"] = fit(
                        [float(r["n"]) for r in part], [float(r[key]) for r in part]
                    )
    report = {
        "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end",
        "rounds": args.rounds,
        "sizes": sizes,
        "fits": fits,
        "target": {"n": TARGET_N, "round_s": TARGET_ROUND_S},
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key, f in fits.items():
            print(f"{key}: {f['a']:.4g} + {f['b']:.4g}·N, at N={TARGET_N}: {f['at_target']:.4g}"
                  + (f"; power law exponent {f['exponent']:.2f}, at N={TARGET_N}: "
                     f"{f['power_at_target']:.4g}" if "exponent" in f else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
