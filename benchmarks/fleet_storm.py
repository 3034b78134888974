"""Fleet storm: N hosts' daemons, one real TensorFlow job each, one shared throttled mount.

Each "host" is a real ``adaptd serve`` (its own socket, state directory and config) and
one real TensorFlow job whose hook saves straight onto ONE ``scripts/slowfs.py`` FUSE
mount with one bandwidth cap (a stand-in for the NFS server of the seed scenario). Two
modes run side by side in one invocation, with the same jobs, state sizes, mount and
cap:

* ``uncoordinated`` — each daemon decides alone (``io_aware`` sees one job per host,
  so nothing staggers the hosts): every job saves when its interval says;
* ``fleet`` — the same daemons with ``[fleet]`` on one real etcd (started here on
  loopback): the mount is a shared target with ``--cap`` fleet-wide write slots;
  ``io_aware`` defers a due save until its job holds a slot.

Every job runs the same policy, ``io_aware:inner=fixed:steps=K,max_defer=D``: a save
every K steps (a step count, not seconds: on this loaded 2-core box the daemon's
step-time estimate runs far from the wall clock, and an interval in seconds would
follow it), due one interval after the job's previous save as ``io_aware`` counts it,
and deferred at most D intervals. The jobs start stepping at the same moment (the driver
releases them together once every one is warm), so their first saves are due at the
same step: a storm. Later saves follow one interval after each job's last save (so in
fleet mode the staggering of one storm carries into the next, as it would in
production). The first save of each job is the warm-up and is reported apart.

Measured, per mode:

* **writers on the mount** — sampled every 10 ms: how many jobs have a TensorFlow
  write in progress on the mount (a ``ckpt-N_temp`` directory exists in the job's
  folder on the backing directory); max, and mean over the samples with a writer;
* **loop blocked per save** — the hook's ``blocking_s`` (p50, p95);
* **time to durable** — from the moment the save was *due* (the wall time of the step
  one planned interval after the job's previous save, as ``io_aware`` counts it: a
  deferred save's wait counts) until the hook saw the write durable (mean, p95).

Targets (issue 13): writers never above the cap in fleet mode; mean time to durable
≤ 0.6× uncoordinated; loop blocked time no worse.

Usage::

    python benchmarks/fleet_storm.py                       # 16 hosts, 16 MiB, 32 MiB/s
    python benchmarks/fleet_storm.py --hosts 8 --saves 2 --json

Needs FUSE (scripts/slowfs.py), etcd (Debian etcd-server) and the fleet extra
(etcd3gw). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))

from save_storm import Jobs, _build, _machine, _pct, _state_bytes  # noqa: E402

MODES = ("uncoordinated", "fleet")
WARM_STEPS = 30
SAMPLE_S = 0.01


# ---------------------------------------------------------------------- the job


def worker(args: argparse.Namespace) -> int:
    """One host's job: warm up, wait for "go", train until ``--saves`` + 1 saves are
    reported (the daemon decides when), then a few steps more."""
    from adaptd.client import AdaptiveCheckpointer

    state, train_step = _build(args.state_mb)
    hook = AdaptiveCheckpointer(
        args.dir,
        job=args.job,
        max_to_keep=2,
        socket=args.socket,
        daemon_timeout=5.0,
        handle_sigterm=False,
        state=state,
    )
    hook.restore_or_initialize()
    device = threading.Event()  # never set: waiting on it stands for the device's step

    def one_step() -> float:
        train_step()
        if args.step_ms > 0:
            device.wait(args.step_ms / 1000)
        t = time.time()
        hook.step()  # a save the plan asks for starts here, at this step's boundary
        return t

    walls: dict[int, float] = {}
    every: dict[int, int] = {}  # the plan's interval in steps, after each step
    # Warm up with the hook, so the daemon's step time is this loop's before the wait for
    # "go" (one long step among WARM_STEPS moves its average little): no save is due in
    # it (an interval is many more steps).
    for _ in range(WARM_STEPS):
        walls[hook.step_count + 1] = one_step()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 2
    start_step = 0
    while len(hook.history) < args.saves + 1:
        walls[hook.step_count + 1] = one_step()
        plan = hook._schedule.decision  # instrumentation: the plan the hook follows
        if plan is not None and plan.every_steps:
            every[hook.step_count] = plan.every_steps
        if hook.step_count - start_step > args.max_steps:
            print("too many steps without the saves", file=sys.stderr)
            return 3
    for _ in range(3):
        walls[hook.step_count + 1] = one_step()
    hook.close()
    saves = []
    previous = start_step

    def wall_at(step: int) -> float:
        """The wall time of ``step``'s boundary (the nearest recorded before it)."""
        return walls.get(step) or walls[max([k for k in walls if k <= step] or [min(walls)])]

    def interval_at(step: int) -> int:
        """The plan's interval in force at ``step`` (the newest recorded at or before it)."""
        known = [s for s in every if s <= step] or sorted(every)[:1]
        return every[max(known)] if known else 1

    for r in hook.history[: args.saves + 1]:
        due = min(previous + interval_at(previous + 1), r.step)
        saves.append(
            {
                "step": r.step,
                "due_step": due,
                "due_wall": wall_at(due),
                "start_wall": wall_at(r.step),
                "blocking_s": r.blocking_s,
                "durable_s": r.durable_s,
                "extra_step_s": r.extra_step_s,
                "ok": r.ok,
                "error": r.error,
            }
        )
        previous = r.step
    print("RESULT " + json.dumps({"job": args.job, "mode": hook.mode, "saves": saves}), flush=True)
    return 0


# ---------------------------------------------------------------------- the driver


class Writers:
    """Samples, every ``SAMPLE_S``, how many jobs have a write in progress on the mount
    (TensorFlow writes a checkpoint into ``ckpt-N_temp/`` and renames it at the end)."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            n = 0
            for f in self.folders:
                with contextlib.suppress(OSError):  # not created yet
                    n += any(e.name.endswith("_temp") for e in os.scandir(f))
            self.samples.append((time.time(), n))
            self._stop.wait(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def policy_spec(args: argparse.Namespace) -> str:
    """``io_aware`` over a save every ``--every`` steps."""
    return f"io_aware:inner=fixed:steps={args.every},max_defer={args.max_defer}"


def _config(root: Path, i: int, mount: Path, args: argparse.Namespace, etcd: str | None) -> Path:
    policy = policy_spec(args)
    text = (
        f"[daemon]\nstate_dir = {json.dumps(str(root / f'state-{i}'))}\n"
        f"liveness_timeout_s = 600\n"
        f'[metrics]\nlisten = "off"\n'
        f"[policy]\ndefault = {json.dumps(policy)}\n"
        f'[storage."shared"]\npath = {json.dumps(str(mount))}\n'
        f"max_concurrent_saves = {args.cap}\n"
    )
    if etcd is not None:
        text += (
            f'[fleet]\netcd = [{json.dumps(etcd)}]\nhost = "host-{i}"\n'
            f'prefix = "/fleet-storm/"\nlease_ttl_s = 10\n'
            f'[fleet.shared]\n{json.dumps(str(mount))} = "slowfs://fleet-storm"\n'
        )
    path = root / f"adaptd-{i}.toml"
    path.write_text(text)
    return path


def run_mode(mode: str, args: argparse.Namespace, root: Path, mount: Path, backing: Path,
             etcd: str | None) -> dict:  # fmt: skip
    from adaptd.commands._spawn import running_daemon

    work = root / mode
    logs = work / "logs"
    logs.mkdir(parents=True)
    ids = [f"{mode}-{i}" for i in range(args.hosts)]
    steps_cap = int(args.every * (args.saves + 1) * (1 + args.max_defer) + WARM_STEPS)
    with ExitStack() as stack:
        sockets = []
        for i in range(args.hosts):
            config = _config(work, i, mount, args, etcd if mode == "fleet" else None)
            sock = work / f"d{i}.sock"
            dlog = stack.enter_context(open(logs / f"daemon-{i}.log", "wb"))
            stack.enter_context(
                running_daemon(sock, ["--config", str(config)], log=dlog, deadline_s=180)
            )
            sockets.append(sock)
        cmds = [
            [sys.executable, __file__, "--worker", "--job", j, "--dir", str(mount / j),
             "--socket", f"ipc://{s}", "--state-mb", str(args.state_mb),
             "--saves", str(args.saves), "--step-ms", str(args.step_ms),
             "--max-steps", str(steps_cap)]
            for j, s in zip(ids, sockets, strict=True)
        ]  # fmt: skip
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        env.pop("ADAPTD_RESTORE_FROM", None)
        jobs = Jobs(cmds, env, logs)
        stack.callback(jobs.stop)
        jobs.wait_all(r"ready", deadline_s=args.deadline_s)
        writers = Writers([backing / j for j in ids])
        stack.callback(writers.stop)
        load = os.getloadavg()
        jobs.release()
        print(f"… {mode}: {args.hosts} jobs released", file=sys.stderr, flush=True)
        jobs.wait_all(r"RESULT .*", deadline_s=args.deadline_s)
        for proc in jobs.procs:
            proc.wait(timeout=args.deadline_s)
        writers.stop()
    saves, first = [], []
    for res in jobs.results.values():
        for n, s in enumerate(res["saves"]):
            if not s["ok"]:
                raise RuntimeError(f"{mode}: {res['job']} save at {s['step']} failed: {s['error']}")
            s["job"] = res["job"]
            s["hook_mode"] = res["mode"]
            s["to_durable_s"] = s["start_wall"] + s["durable_s"] - s["due_wall"]
            s["deferred_steps"] = s["step"] - s["due_step"]
            (saves if n else first).append(s)  # the first storm is the warm-up
    return {"mode": mode, "saves": saves, "first": first, "writers": writers.samples,
            "load_before": load}  # fmt: skip


def summarise(run: dict, cap: int) -> dict:
    saves = run["saves"]
    blocked = [s["blocking_s"] for s in saves]
    durable = [s["to_durable_s"] for s in saves]
    counts = [n for _, n in run["writers"]]
    busy = [n for n in counts if n > 0]
    return {
        "mode": run["mode"],
        "saves": len(saves),
        "writers_max": max(counts, default=0),
        "writers_mean": statistics.mean(busy) if busy else 0.0,
        "samples": len(counts),
        "samples_over_cap": sum(n > cap for n in counts),
        "blocked_p50_s": _pct(blocked, 50),
        "blocked_p95_s": _pct(blocked, 95),
        "to_durable_mean_s": statistics.mean(durable),
        "to_durable_p95_s": _pct(durable, 95),
        "deferred_steps_mean": statistics.mean(s["deferred_steps"] for s in saves),
        "first_storm_to_durable_mean_s": statistics.mean(s["to_durable_s"] for s in run["first"]),
        "first_storm_blocked_p95_s": _pct([s["blocking_s"] for s in run["first"]], 95),
        "hook_modes": sorted({s["hook_mode"] for s in saves}),
        "load_before": [round(x, 2) for x in run["load_before"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16, help="daemons, one job each (16)")
    parser.add_argument("--state-mb", type=int, default=16, help="state per job, MiB (16)")
    parser.add_argument("--bandwidth-mib-s", type=float, default=32.0,
                        help="the shared mount's total bandwidth (32 MiB/s)")  # fmt: skip
    parser.add_argument("--cap", type=int, default=2, help="fleet write slots on the mount (2)")
    parser.add_argument("--every", type=int, default=150,
                        help="steps between a job's saves (150: 30 s at 200 ms)")  # fmt: skip
    parser.add_argument("--max-defer", type=float, default=3.0,
                        help="io_aware's bound, in intervals (3)")  # fmt: skip
    parser.add_argument("--saves", type=int, default=3, help="measured saves per job (+1 warm-up)")
    parser.add_argument("--step-ms", type=float, default=200.0,
                        help="per step, a wait standing for the accelerator (200)")  # fmt: skip
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--deadline-s", type=float, default=900.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the daemons' and jobs' logs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--max-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    from local_etcd import running
    from slowfs import SlowFSError, slow_mount

    root = Path(tempfile.mkdtemp(prefix="adaptd-fleet-storm-", dir=args.workdir))
    runs = []
    try:
        backing, mount = root / "backing", root / "shared"
        backing.mkdir()
        mount.mkdir()
        with ExitStack() as stack:
            etcd = stack.enter_context(running(root / "etcd")).url if "fleet" in modes else None
            stack.enter_context(slow_mount(backing, mount, bandwidth_mib_s=args.bandwidth_mib_s))
            for mode in modes:
                runs.append(run_mode(mode, args, root, mount, backing, etcd))
    except SlowFSError as exc:
        print(
            f"fleet_storm: the throttled mount (scripts/slowfs.py) failed: {exc}", file=sys.stderr
        )
        shutil.rmtree(root, ignore_errors=True)
        return 1
    if args.keep:
        shutil.rmtree(root / "backing", ignore_errors=True)  # the checkpoints; logs stay
        print(f"fleet_storm: logs kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    rows = [summarise(r, args.cap) for r in runs]
    out = {
        "machine": _machine(),
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "job", "dir")},
        "storm_bytes": args.hosts * _state_bytes(args.state_mb),
        "results": rows,
    }
    by = {r["mode"]: r for r in rows}
    if len(by) == 2:
        u, f = by["uncoordinated"], by["fleet"]
        out["ratios"] = {
            "to_durable_mean": f["to_durable_mean_s"] / u["to_durable_mean_s"],
            "to_durable_p95": f["to_durable_p95_s"] / u["to_durable_p95_s"],
            "blocked_p50": f["blocked_p50_s"] / u["blocked_p50_s"],
            "blocked_p95": f["blocked_p95_s"] / u["blocked_p95_s"],
        }
        out["targets"] = {
            "fleet writers never above the cap": f["writers_max"] <= args.cap,
            "mean time to durable <= 0.6x uncoordinated": out["ratios"]["to_durable_mean"] <= 0.6,
            "loop blocked time no worse (p50, p95 within 10%)": out["ratios"]["blocked_p50"] <= 1.1
            and out["ratios"]["blocked_p95"] <= 1.1,
        }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"machine: {out['machine']}; {args.hosts} hosts x {args.state_mb} MiB, one mount at "
          f"{args.bandwidth_mib_s:g} MiB/s, policy {policy_spec(args)}, steps of "
          f"{args.step_ms:g} ms, cap {args.cap}")  # fmt: skip
    head = ("mode", "saves", "writers max", "writers mean", "blocked p50", "blocked p95",
            "durable mean", "durable p95", "deferred")  # fmt: skip
    print("  ".join(f"{h:>13}" for h in head))
    for r in rows:
        print("  ".join(f"{v:>13}" for v in (
            r["mode"], r["saves"], r["writers_max"], f"{r['writers_mean']:.2f}",
            f"{r['blocked_p50_s']:.3f}s", f"{r['blocked_p95_s']:.3f}s",
            f"{r['to_durable_mean_s']:.2f}s", f"{r['to_durable_p95_s']:.2f}s",
            f"{r['deferred_steps_mean']:.1f} st")))  # fmt: skip
    for r in rows:
        print(f"{r['mode']}: first (warm-up) storm, not in the figures above: time to durable "
              f"mean {r['first_storm_to_durable_mean_s']:.2f}s, blocked p95 "
              f"{r['first_storm_blocked_p95_s']:.3f}s")  # fmt: skip
    for k, v in out.get("ratios", {}).items():
        print(f"fleet/uncoordinated {k}: {v:.2f}x")
    for k, v in out.get("targets", {}).items():
        print(f"{'PASS' if v else 'FAIL'}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
