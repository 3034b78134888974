"""Save storm: N jobs checkpoint at the same moment onto one shared, throttled server.

Two ways of getting the checkpoints onto the shared destination are measured side by
side in one run, with the same jobs, state sizes and bandwidth cap:

* ``direct`` — each job's ``AdaptiveCheckpointer`` writes straight into its folder on
  the shared destination (no daemon: the hook's embedded policy);
* ``staged`` — each job writes to its own plain local directory (staging), and a real
  ``adaptd serve`` (started with a config file naming the destination and the
  staging directories) replicates every completed checkpoint to the same shared
  destination with its Replicator: one upload at a time per destination, oldest
  first (staggered).

The shared destination is a ``scripts/slowfs.py`` FUSE passthrough mount with one
token bucket (``--bandwidth-mib-s``) shared by every writer, standing for an NFS
server that all jobs share. Each job is a real TensorFlow process holding
``--state-mb`` of float32 state that changes every step (a small matmul plus an
optimizer-like update of every variable, then a ``--step-ms`` wait standing for the
accelerator's share of the step: on a GPU host the training loop's CPU is mostly
idle, and 8 CPU-bound jobs would otherwise measure only this machine's 2 cores).
The jobs train without pause; the driver writes "go" to every job's stdin at once
and each calls ``save()`` at its next step (a storm). The first storm is a warm-up
and is not counted; the first measured storm starts once the warm-up is durable
everywhere. The next storms follow every ``--interval-s`` (by default half the time
the capped destination needs for one storm's bytes): as in a real storm, a job's
next save comes while its previous write may still be running, which is where
writing straight to a slow shared server blocks the training loop (the hook allows
one write in flight). ``--interval-s 0`` releases each storm only when the previous
one is durable everywhere (isolated storms).

Per save it records:

* ``blocked`` — the time the training loop spent in the save call (the hook's
  ``blocking_s``: includes waiting for the job's previous write, if any), and
  ``stall`` = blocked + the extra step time while the write ran (``extra_step_s``);
* ``durable on shared`` — from the save call to the moment a checkpoint of that
  step or a newer one is complete on the shared destination: the ``checkpoint``
  state file names it (direct) or the job's ``LATEST`` there names it (staged),
  polled every 10 ms on the mount's backing directory by a watcher thread (so the
  figure's resolution is about 10 ms).

and per mode how many of the measured checkpoints reached the shared destination
(the Replicator skips a checkpoint superseded while it waited for its turn).

Usage::

    python benchmarks/save_storm.py                      # 8 jobs x 32 MiB, 64 MiB/s
    python benchmarks/save_storm.py --jobs 4 --state-mb 16 --storms 2 --json

Needs root or FUSE permissions for the slowfs mount (mfusepy and libfuse3, see
scripts/slowfs.py). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import queue
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ("direct", "staged")
POLL_S = 0.01


# ---------------------------------------------------------------------- the job


VAR_BYTES = 16 * 2**20  # the state is float32 variables of 16 MiB each


def _state_bytes(mb: int) -> int:
    return max(1, math.ceil(mb / 16)) * VAR_BYTES


def _build(mb: int):
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.random.set_seed(0)
    per_var = VAR_BYTES // 4
    n_vars = _state_bytes(mb) // VAR_BYTES
    state = tf.Module()
    state.vars = [tf.Variable(tf.random.uniform([per_var]), name=f"w{i}") for i in range(n_vars)]
    a = tf.Variable(tf.random.uniform([192, 192]))

    @tf.function
    def train_step():
        x = a
        for _ in range(4):
            x = tf.tanh(tf.matmul(x, a))
        delta = tf.reduce_mean(x) * 1e-6
        for v in state.vars:
            v.assign_add(tf.fill(tf.shape(v), delta))
        return delta

    return state, train_step


def worker(args: argparse.Namespace) -> int:
    """One job: trains without pause; each "go" line on stdin makes it save at once.

    The loop never stops for the barrier (a real job does not either): the hook
    reports a save only from ``step()``, and its extra step time is real slowdown,
    not idle waiting.
    """
    from adaptd.client import AdaptiveCheckpointer

    state, train_step = _build(args.state_mb)
    hook = AdaptiveCheckpointer(
        args.dir,
        job=args.job,
        max_to_keep=2,
        policy="fixed:steps=1000000000",  # saves happen only when the storm says so
        socket=args.socket,
        daemon_timeout=5.0,
        handle_sigterm=False,
        state=state,
    )
    hook.restore_or_initialize()
    commands: queue.SimpleQueue[str] = queue.SimpleQueue()

    def read_stdin() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("eof")

    threading.Thread(target=read_stdin, daemon=True).start()
    device = threading.Event()  # never set: waiting on it stands for the device's step time

    def one_step() -> None:
        train_step()
        if args.step_ms > 0:
            device.wait(args.step_ms / 1000)
        hook.step()

    for _ in range(args.steps_between):  # warm up (tf.function tracing, first reports)
        one_step()
    print("ready", flush=True)
    starts: dict[int, float] = {}
    while len(starts) <= args.storms:
        one_step()
        try:
            command = commands.get_nowait()
        except queue.Empty:
            continue
        if command != "go":
            return 2
        starts[hook.step_count] = time.time()
        hook.save(reason=f"storm {len(starts) - 1}")
        print(f"saved {len(starts) - 1} {hook.step_count}", flush=True)
    # keep training until the last write is reported (its extra step time is measured),
    # then a little longer
    while len(hook.history) < len(starts):
        one_step()
    for _ in range(args.steps_between):
        one_step()
    hook.close()
    saves = [
        {
            "step": r.step,
            "wall_start": starts.get(r.step),
            "blocking_s": r.blocking_s,
            "extra_step_s": r.extra_step_s,
            "local_durable_s": r.durable_s,
            "bytes": r.bytes,
            "ok": r.ok,
            "error": r.error,
        }
        for r in hook.history
    ]
    print("RESULT " + json.dumps({"job": args.job, "mode": hook.mode, "saves": saves}), flush=True)
    return 0


# ---------------------------------------------------------------------- the driver


class Jobs:
    """The N worker processes; their stdout lines arrive on one queue."""

    def __init__(self, cmds: list[list[str]], env: dict[str, str], logs: Path) -> None:
        self.lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.procs: list[subprocess.Popen] = []
        for i, cmd in enumerate(cmds):
            err = open(logs / f"job-{i}.log", "wb")  # noqa: SIM115 - closed with the process
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, text=True
            )
            err.close()
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(i, proc), daemon=True).start()
        self.results: dict[int, dict] = {}

    def _read(self, i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.put((i, line.strip()))
        self.lines.put((i, None))

    def wait_all(self, pattern: str, deadline_s: float) -> dict[int, re.Match]:
        """Wait until every job printed a line matching ``pattern`` (RESULT lines are kept)."""
        got: dict[int, re.Match] = {}
        end = time.monotonic() + deadline_s
        while len(got) < len(self.procs):
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"jobs {sorted(set(range(len(self.procs))) - set(got))} "
                    f"did not print {pattern!r} within {deadline_s:.0f}s"
                )
            try:
                i, line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                if i not in got:
                    raise RuntimeError(
                        f"job {i} exited ({self.procs[i].wait()}) before {pattern!r}"
                    )
                continue
            if line.startswith("RESULT "):
                self.results[i] = json.loads(line[7:])
            m = re.fullmatch(pattern, line)
            if m:
                got[i] = m
        return got

    def release(self) -> float:
        """Tell every job to save now; returns the wall time of the release."""
        t = time.time()
        for proc in self.procs:
            proc.stdin.write("go\n")
        for proc in self.procs:
            proc.stdin.flush()
        return t

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _state_step(path: Path) -> int | None:
    """The step a destination file names: TF's ``checkpoint`` file or adaptd's ``LATEST``."""
    try:
        text = path.read_text()
    except (FileNotFoundError, OSError):
        return None
    if path.name == "LATEST":
        try:
            return int(json.loads(text)["step"])
        except (ValueError, KeyError, TypeError):
            return None
    m = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', text, re.M)
    return int(m.group(1)) if m else None


class Durability:
    """Watches each job's state file on the destination (on a thread, every ``POLL_S``).

    Records the wall time each file first named each newer step, so the driver can
    release the next storm while earlier checkpoints are still on their way.
    """

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self._seen: list[list[tuple[float, int]]] = [[] for _ in files]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for k, path in enumerate(self.files):
                s = _state_step(path)
                with self._lock:
                    seen = self._seen[k]
                    if s is not None and (not seen or s > seen[-1][1]):
                        seen.append((now, s))
            self._stop.wait(POLL_S)

    def steps_seen(self, k: int, after: int) -> int:
        """How many different steps newer than ``after`` file ``k`` named (copies that
        reached the destination; a superseded checkpoint the Replicator skipped is not
        one)."""
        with self._lock:
            return sum(1 for _, s in self._seen[k] if s > after)

    def when(self, k: int, step: int) -> float | None:
        """When file ``k`` first named ``step`` or a later one (None: not yet)."""
        with self._lock:
            return next((t for t, s in self._seen[k] if s >= step), None)

    def wait(self, steps: list[int], deadline_s: float, jobs: Jobs) -> None:
        """Until file ``k`` names ``steps[k]`` or later, for every k; raises if a job dies
        or time runs out."""
        end = time.monotonic() + deadline_s
        pause = threading.Event()
        while True:
            missing = [
                f"{p} (step {steps[k]})"
                for k, p in enumerate(self.files)
                if self.when(k, steps[k]) is None
            ]
            if not missing:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"not durable within {deadline_s:.0f}s: {missing}")
            for k, proc in enumerate(jobs.procs):
                if proc.poll() not in (None, 0):
                    raise RuntimeError(f"job {k} exited with status {proc.returncode}")
            pause.wait(POLL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _daemon_config(root: Path, dest: str, local: Path, args: argparse.Namespace) -> Path:
    cap = f"bandwidth_mib_s = {args.replicator_mib_s}\n" if args.replicator_mib_s else ""
    text = (
        f"[daemon]\nstate_dir = {json.dumps(str(root / 'state'))}\n"
        f'[metrics]\nlisten = "off"\n'
        f"[destinations.shared]\nurl = {json.dumps(dest)}\n{cap}"
        f"max_concurrent = {args.max_concurrent}\nkeep_last = 2\n"
        f'[jobs."storm-*"]\nstaging = {json.dumps(str(local / "{job}"))}\n'
        f'replicate_to = ["shared"]\n'
    )
    path = root / "adaptd.toml"
    path.write_text(text)
    return path


def run_mode(mode: str, args: argparse.Namespace, root: Path, mount: Path, backing: Path) -> dict:
    """All storms of one mode; returns its per-save records."""
    from adaptd.commands._spawn import running_daemon

    work = root / mode
    work.mkdir()
    logs = work / "logs"
    logs.mkdir()
    jobs_ids = [f"storm-{i}" for i in range(args.jobs)]
    with ExitStack() as stack:
        socket = work / "adaptd.sock"
        if mode == "direct":
            dirs = [mount / "direct" / j for j in jobs_ids]
            watch = [backing / "direct" / j / "checkpoint" for j in jobs_ids]
        else:
            local = work / "staging"
            local.mkdir()
            dest = str(mount / "staged")
            config = _daemon_config(work, dest, local, args)
            dlog = open(logs / "daemon.log", "wb")  # noqa: SIM115
            stack.callback(dlog.close)
            stack.enter_context(
                running_daemon(socket, ["--config", str(config)], log=dlog, deadline_s=120)
            )
            dirs = [local / j for j in jobs_ids]
            watch = [backing / "staged" / j / "LATEST" for j in jobs_ids]
        cmds = [
            [
                sys.executable,
                __file__,
                "--worker",
                "--job",
                j,
                "--dir",
                str(d),
                "--socket",
                f"ipc://{socket}",
                "--state-mb",
                str(args.state_mb),
                "--storms",
                str(args.storms),
                "--steps-between",
                str(args.steps_between),
                "--step-ms",
                str(args.step_ms),
            ]
            for j, d in zip(jobs_ids, dirs, strict=True)
        ]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        env.pop("ADAPTD_RESTORE_FROM", None)
        jobs = Jobs(cmds, env, logs)
        stack.callback(jobs.stop)
        durability = Durability(watch)
        stack.callback(durability.stop)
        jobs.wait_all(r"ready", deadline_s=args.deadline_s)
        released: dict[int, float] = {}
        saved: dict[int, list[int]] = {}  # storm -> each job's step
        pace = threading.Event()
        last = 0.0
        for storm in range(args.storms + 1):
            if storm == 1 or (storm > 1 and args.interval_s == 0):
                # after the warm-up, and between isolated storms: the previous one is durable
                durability.wait(saved[storm - 1], args.deadline_s, jobs)
            elif storm > 1:
                pace.wait(max(0.0, last + args.interval_s - time.monotonic()))
            last = time.monotonic()
            released[storm] = jobs.release()
            got = jobs.wait_all(rf"saved {storm} (\d+)", deadline_s=args.deadline_s)
            saved[storm] = [int(got[i].group(1)) for i in range(args.jobs)]
            print(
                f"… {mode}: storm {storm} at steps {min(saved[storm])}-{max(saved[storm])}",
                file=sys.stderr,
                flush=True,
            )
        durability.wait(saved[args.storms], args.deadline_s, jobs)
        jobs.wait_all(r"RESULT .*", deadline_s=args.deadline_s)
        for proc in jobs.procs:
            proc.wait(timeout=args.deadline_s)
    records = []
    for i, res in sorted(jobs.results.items()):
        storm_of = {saved[storm][i]: storm for storm in saved}
        for s in res["saves"]:
            storm = storm_of.get(s["step"])
            if storm is None or storm == 0 or s["wall_start"] is None:
                continue  # the warm-up
            if not s["ok"]:
                raise RuntimeError(f"{mode}: job {i} save at step {s['step']} failed: {s['error']}")
            s["job"] = res["job"]
            s["storm"] = storm
            s["hook_mode"] = res["mode"]
            s["shared_durable_s"] = durability.when(i, s["step"]) - s["wall_start"]
            s["release_skew_s"] = s["wall_start"] - released[storm]
            records.append(s)
    copied = sum(durability.steps_seen(i, saved[0][i]) for i in range(args.jobs))
    return {"mode": mode, "saves": records, "copied": copied}


def _pct(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100)."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarise(run: dict) -> dict:
    saves = run["saves"]
    blocked = [s["blocking_s"] for s in saves]
    stall = [s["blocking_s"] + s["extra_step_s"] for s in saves]
    shared = [s["shared_durable_s"] for s in saves]
    local = [s["local_durable_s"] for s in saves]
    return {
        "mode": run["mode"],
        "saves": len(saves),
        "bytes_per_save": statistics.mean(s["bytes"] for s in saves),
        "blocked_mean_s": statistics.mean(blocked),
        "blocked_p95_s": _pct(blocked, 95),
        "stall_mean_s": statistics.mean(stall),
        "stall_p95_s": _pct(stall, 95),
        "hook_durable_mean_s": statistics.mean(local),
        "shared_durable_mean_s": statistics.mean(shared),
        "shared_durable_p95_s": _pct(shared, 95),
        "shared_durable_max_s": max(shared),
        "release_skew_max_s": max(s["release_skew_s"] for s in saves),
        "hook_modes": sorted({s["hook_mode"] for s in saves}),
        "copied_to_shared": run["copied"],
    }


def upload_only(args: argparse.Namespace, root: Path, mount: Path) -> int:
    """``--upload-only N``: one upload stream alone, as the Replicator runs it."""
    from adaptd.tiers.replica import Replica

    stage = root / "stage"
    stage.mkdir()
    rng = random.Random(0)
    size = _state_bytes(args.state_mb)
    replica = Replica(str(mount / "upload-only"))
    rows = []
    for step in range(1, args.upload_only + 1):
        (stage / f"ckpt-{step}.data-00000-of-00001").write_bytes(rng.randbytes(size))
        (stage / f"ckpt-{step}.index").write_bytes(b"index %d" % step)
        t0, c0 = time.monotonic(), time.process_time()
        result = replica.upload(stage, step, "upload-only")
        seconds, cpu = time.monotonic() - t0, time.process_time() - c0
        rows.append({"step": step, "bytes": result.bytes_sent, "seconds": seconds, "cpu_s": cpu})
        print(
            f"upload {step}: {result.bytes_sent / 2**20:.1f} MiB in {seconds:.3f} s = "
            f"{result.bytes_sent / 2**20 / seconds:.1f} MiB/s (cap {args.bandwidth_mib_s:g}), "
            f"uploader CPU {cpu:.3f} s"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": _machine(), "uploads": rows}))
    return 0


@contextlib.contextmanager
def _plain_dir(backing: Path, mount: Path, **_: object) -> Iterator[None]:
    """``--unthrottled``: the mount point is a link to the backing directory, no cap."""
    mount.rmdir()
    mount.symlink_to(backing, target_is_directory=True)
    yield


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs saving at once (default 8)")
    parser.add_argument(
        "--state-mb", type=int, default=32, help="state per job, MiB, in 16 MiB variables (32)"
    )
    parser.add_argument(
        "--bandwidth-mib-s",
        type=float,
        default=64.0,
        help="the shared destination's total bandwidth (default 64 MiB/s)",
    )
    parser.add_argument("--storms", type=int, default=3, help="measured storms (plus 1 warm-up)")
    parser.add_argument(
        "--steps-between", type=int, default=10, help="warm-up steps, and steps after the last"
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=200.0,
        help="per step, a wait standing for the accelerator's compute (default 200: 8 "
        "jobs then leave the 2-core development VM some CPU, as GPU jobs leave a host's)",
    )
    parser.add_argument(
        "--interval-s",
        type=float,
        default=None,
        help="seconds between the measured storms (default: half the time the destination "
        "needs for one storm, so a job's next save comes while its last write may still "
        "run); 0: each storm waits until the previous one is durable everywhere",
    )
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=1,
        help="the Replicator's uploads at once to the destination (default 1)",
    )
    parser.add_argument(
        "--replicator-mib-s",
        type=float,
        default=None,
        help="the Replicator's own bandwidth cap (default: none, slowfs caps)",
    )
    parser.add_argument(
        "--unthrottled",
        action="store_true",
        help="no slowfs: the 'shared destination' is a plain local directory, uncapped",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--upload-only",
        type=int,
        default=0,
        metavar="N",
        help="no jobs, no daemon: time N single Replica.upload calls of one job's "
        "checkpoint size through the same mount (what one upload stream reaches)",
    )
    parser.add_argument("--workdir", default=None, help="where the run's files go (default: tmp)")
    parser.add_argument("--deadline-s", type=float, default=600.0, help="per-phase deadline")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--json-out", default=None, help="also write the JSON to this file")
    parser.add_argument(
        "--keep", action="store_true", help="keep the jobs' and the daemon's logs (workdir)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    for name in ("jobs", "state_mb", "storms", "steps_between", "max_concurrent"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.step_ms < 0:
        parser.error(f"--step-ms must be >= 0, got {args.step_ms}")
    if not args.bandwidth_mib_s > 0:
        parser.error(f"--bandwidth-mib-s must be > 0, got {args.bandwidth_mib_s}")
    # the time the capped destination needs for one storm's bytes, at best
    storm_s = args.jobs * _state_bytes(args.state_mb) / (args.bandwidth_mib_s * 2**20)
    if args.interval_s is None:
        args.interval_s = round(storm_s / 2, 2)
    elif args.interval_s < 0:
        parser.error(f"--interval-s must be >= 0, got {args.interval_s}")
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"--modes: unknown {bad}; choose from {', '.join(MODES)}")
    sys.path.insert(0, str(REPO / "scripts"))
    from slowfs import SlowFSError, slow_mount

    if args.unthrottled:
        slow_mount = _plain_dir  # the same call, without a cap

    root = Path(tempfile.mkdtemp(prefix="adaptd-storm-", dir=args.workdir))
    runs = []
    try:
        backing, mount = root / "backing", root / "shared"
        backing.mkdir()
        mount.mkdir()
        with slow_mount(backing, mount, bandwidth_mib_s=args.bandwidth_mib_s) as fs:
            if args.upload_only:
                return upload_only(args, root, mount)
            for mode in modes:
                runs.append(run_mode(mode, args, root, mount, backing))
    except SlowFSError as exc:
        print(
            f"save_storm: the throttled shared mount (scripts/slowfs.py) failed: {exc}\n"
            "--unthrottled measures with a plain local directory instead",
            file=sys.stderr,
        )
        return 1
    finally:
        if args.keep:
            for data in (root / "backing", root / "staged" / "staging"):  # checkpoints
                shutil.rmtree(data, ignore_errors=True)
            print(f"save_storm: logs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    summary = [summarise(r) for r in runs]
    by = {s["mode"]: s for s in summary}
    ratios = {}
    if "direct" in by and "staged" in by:
        for key in (
            "blocked_mean_s",
            "blocked_p95_s",
            "stall_mean_s",
            "stall_p95_s",
            "shared_durable_mean_s",
            "shared_durable_p95_s",
        ):
            d = by["direct"][key]
            ratios[key] = by["staged"][key] / d if d > 0 else None
    setup = {
        "jobs": args.jobs,
        "state_mb": args.state_mb,
        "bandwidth_mib_s": args.bandwidth_mib_s,
        "storms": args.storms,
        "steps_between": args.steps_between,
        "step_ms": args.step_ms,
        "interval_s": args.interval_s,
        "storm_ideal_s": round(storm_s, 2),
        "max_concurrent": args.max_concurrent,
        "replicator_mib_s": args.replicator_mib_s,
        "replicator": "real adaptd serve (config file), its Replicator",
        "destination": "plain local directory, UNTHROTTLED"
        if args.unthrottled
        else f"scripts/slowfs.py mount, {args.bandwidth_mib_s:g} MiB/s shared",
        "poll_s": POLL_S,
    }
    result = {
        "machine": _machine(),
        "setup": setup,
        "summary": summary,
        "ratios_staged_over_direct": ratios,
        "slowfs": getattr(fs, "stats", None),  # the mount's own counters, both modes
        "saves": runs,
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"machine: {_machine()}")
    print(
        f"{args.jobs} jobs x {args.state_mb} MB, shared destination: {setup['destination']}, "
        f"{args.storms} storms (+1 warm-up)"
    )
    head = (
        "mode",
        "saves",
        "blocked mean ms",
        "blocked p95 ms",
        "stall mean ms",
        "stall p95 ms",
        "local durable mean s",
        "shared durable mean s",
        "shared durable p95 s",
        "copied",
    )
    rows = [
        (
            s["mode"],
            str(s["saves"]),
            f"{s['blocked_mean_s'] * 1e3:.1f}",
            f"{s['blocked_p95_s'] * 1e3:.1f}",
            f"{s['stall_mean_s'] * 1e3:.1f}",
            f"{s['stall_p95_s'] * 1e3:.1f}",
            f"{s['hook_durable_mean_s']:.2f}",
            f"{s['shared_durable_mean_s']:.2f}",
            f"{s['shared_durable_p95_s']:.2f}",
            f"{s['copied_to_shared']} of {s['saves']}",
        )
        for s in summary
    ]
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    if ratios:
        print(
            "staged / direct: "
            + ", ".join(
                f"{k.removesuffix('_s')} {v:.2f}x" for k, v in ratios.items() if v is not None
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
