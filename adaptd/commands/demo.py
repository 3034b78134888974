"""``adaptd demo``: a daemon and a real TensorFlow job, killed once and resumed.

The demo starts ``adaptd serve`` on a private socket, runs a small Keras model
(Dropout, Adam, a shuffled ``tf.data`` pipeline) with the adaptd hook as a child
process, shows a progress bar and a line per decision and per save, kills the job
with SIGKILL part-way, resumes it, and ends with a summary table. The training
job is :mod:`adaptd.client.demo_job`; this module never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from adaptd.commands import UsageError
from adaptd.commands._spawn import DaemonStartError, start_daemon, stop_daemon

HELP = "run a daemon and a small real TensorFlow job, with a crash and resume"

#: Seconds of compute before the demo's first save (the default policy's probe, which
#: measures what a save costs). Production waits min(300 s, M/10); at the demo's 120 s
#: prior that is 12 s, as long as the whole 1,500-step run on a quiet 2-core VM, and the
#: probe receded past the run's end as the step time settled: no save, so no kill.
DEMO_PROBE_S = 2.0

#: The demo daemon's config: private state, no metrics port, and a failure prior
#: short enough that the fitted interval shows within a minute of training.
DEMO_CONFIG = """\
# written by `adaptd demo`
[daemon]
state_dir = "{state}"
drain_grace_s = 10.0
[policy]
default = "default:probe_s={probe_s:g}"
gpu_mtbf_hours = {mtbf_h:.6g}
[metrics]
listen = "off"
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default="demo-run", help="work directory (default: ./demo-run)")
    parser.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    parser.add_argument(
        "--kill-at",
        type=float,
        default=0.45,
        help="SIGKILL the job at this fraction of the steps, or after its first durable save "
        "if that comes later (default 0.45; 0 disables)",
    )
    parser.add_argument(
        "--policy",
        default="",
        help="policy spec the job insists on (default: the daemon's choice)",
    )
    parser.add_argument(
        "--mtbf-s",
        type=float,
        default=120.0,
        help="the demo daemon's prior mean time between failures, in seconds (default 120; "
        "production's default is ~50,000 GPU-hours)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


@dataclass
class Phase:
    """One run of the training job (before or after the kill)."""

    resumed_from: int = 0
    last_step: int = 0
    saves: list[dict] = field(default_factory=list)
    plans: list[dict] = field(default_factory=list)
    killed_at: int | None = None
    last_durable: int = 0
    exit_code: int | None = None
    wall_s: float = 0.0
    final: dict | None = None


def _run_job(
    args: argparse.Namespace,
    workdir: Path,
    socket: Path,
    kill_at: int | None,
    ui,
) -> Phase:
    cmd = [
        sys.executable, "-m", "adaptd.client.demo_job",
        "--dir", str(workdir / "ckpts"), "--steps", str(args.steps),
        "--socket", str(socket), "--seed", str(args.seed),
    ]  # fmt: skip
    if args.policy:
        cmd += ["--policy", args.policy]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    phase = Phase()
    started = time.monotonic()
    with open(workdir / "job.log", "a") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        try:
            _follow(proc, phase, args, kill_at, ui)
            phase.exit_code = proc.wait()
        finally:  # the demo stopped early (its output pipe closed, ^C): so does the job
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    phase.wall_s = time.monotonic() - started
    ui.stop()
    return phase


def _follow(
    proc: subprocess.Popen, phase: Phase, args: argparse.Namespace, kill_at: int | None, ui
) -> None:
    """Show the job's events as they come, and kill it at ``kill_at``."""
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = ev.get("event")
        if kind == "start":
            phase.resumed_from = ev["step"]
            ui.start(ev["step"], args.steps)
        elif kind == "progress":
            phase.last_step = ev["step"]
            ui.progress(ev["step"], ev.get("loss"))
            # kill part-way, but only once a save is durable: a crash before the
            # first save would just restart from scratch, which shows nothing
            if (
                kill_at is not None
                and ev["step"] >= kill_at
                and phase.killed_at is None
                and phase.last_durable > 0
            ):
                proc.send_signal(signal.SIGKILL)
                phase.killed_at = ev["step"]
                ui.line(f"[bold red]SIGKILL[/] the job at step {ev['step']}")
        elif kind == "plan":
            phase.plans.append(ev)
            ui.line(
                f"[cyan]plan[/]  ({ev['mode']}) next save at step {ev['next_step']}: {ev['reason']}"
            )
        elif kind == "save":
            phase.saves.append(ev)
            if ev["ok"]:
                phase.last_durable = max(phase.last_durable, ev["step"])
                blocked, durable = ev["blocking_s"] * 1e3, ev["durable_s"] * 1e3
                ui.line(
                    f"[green]save[/]  step {ev['step']:>5}: blocked {blocked:6.1f} ms,"
                    f" durable {durable:7.1f} ms, {ev['bytes'] / 1e6:6.2f} MB"
                )
            else:
                ui.line(f"[red]save failed[/] at step {ev['step']}: {ev['error']}")
        elif kind == "done":
            phase.final = ev


def _console(stderr: bool):
    """A rich console whose closed output pipe ends the command as every command's does
    (:func:`adaptd.cli.main`: quietly, status 141) instead of rich's own exit 1."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console(stderr=stderr, highlight=False)


class _Ui:
    """Progress bar and log lines (rich when on a terminal, plain lines otherwise)."""

    def __init__(self, quiet: bool) -> None:
        self.console = _console(stderr=quiet)
        self.quiet = quiet
        self.progress_bar = None
        self.task = None

    def start(self, step: int, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress_bar = Progress(
            TextColumn("training"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"), console=self.console, transient=True,
        )  # fmt: skip
        self.task = self.progress_bar.add_task("train", total=total, completed=step, loss="")
        self.progress_bar.start()
        if step:
            self.line(f"[bold]resumed[/] from step {step}")
        else:
            self.line("[bold]started[/] fresh")

    def progress(self, step: int, loss: float | None) -> None:
        if self.progress_bar is not None:
            text = f"loss {loss:.4f}" if loss is not None else ""
            self.progress_bar.update(self.task, completed=step, loss=text)

    def line(self, text: str) -> None:
        self.console.print(text)

    def stop(self) -> None:
        if self.progress_bar is not None:
            self.progress_bar.stop()
            self.progress_bar = None


def run(args: argparse.Namespace) -> int:
    if args.steps < 100:
        raise UsageError(f"--steps must be at least 100, got {args.steps}")
    if not args.mtbf_s > 0:
        raise UsageError(f"--mtbf-s must be > 0, got {args.mtbf_s}")
    if not 0 <= args.kill_at < 1:
        raise UsageError(f"--kill-at must be in [0, 1), got {args.kill_at}")
    workdir = Path(args.dir).resolve()
    for old in ("ckpts", "state"):  # a demo starts from nothing learned and nothing saved
        if (workdir / old).exists():
            shutil.rmtree(workdir / old)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("job.log", "daemon.log"):
        (workdir / name).unlink(missing_ok=True)
    socket = workdir / "adaptd.sock"
    ui = _Ui(quiet=args.json)
    ui.line(f"adaptd demo in {workdir} (logs: daemon.log, job.log)")
    config = workdir / "adaptd.toml"
    config.write_text(
        DEMO_CONFIG.format(state=workdir / "state", mtbf_h=args.mtbf_s / 3600, probe_s=DEMO_PROBE_S)
    )
    ui.line(
        f"daemon: policy {args.policy or 'default (Daly, fitted online; the first save after '}"
        f"{'' if args.policy else f'{DEMO_PROBE_S:g} s, to measure its cost)'}, failure prior "
        f"{args.mtbf_s:g} s between failures (a flaky fleet, scaled to a one-minute demo)"
    )
    with open(workdir / "daemon.log", "w") as dlog:
        try:
            daemon = start_daemon(socket, ["--config", str(config)], log=dlog)
        except DaemonStartError as exc:
            raise UsageError(f"{exc} (see {workdir / 'daemon.log'})") from None
    try:
        ui.line(f"daemon pid {daemon.pid} listening on ipc://{socket}")
        kill_at = int(args.steps * args.kill_at) if args.kill_at else None
        first = _run_job(args, workdir, socket, kill_at, ui)
        phases = [first]
        if first.killed_at is not None:
            phases.append(_run_job(args, workdir, socket, None, ui))
    finally:
        stop_daemon(daemon)
    return _summary(args, phases, ui)


def _summary(args: argparse.Namespace, phases: list[Phase], ui: _Ui) -> int:
    saves = [s for p in phases for s in p.saves if s["ok"]]
    failed = [s for p in phases for s in p.saves if not s["ok"]]
    last = phases[-1]
    completed = last.final is not None and last.final.get("step") == args.steps
    first = phases[0]
    resumed = phases[1].resumed_from if len(phases) > 1 else None
    # work lost: what the killed run had done past the checkpoint the resume started from
    lost_steps = first.killed_at - (resumed or 0) if first.killed_at is not None else 0
    step_s = last.final.get("step_time_s") if last.final else None

    def mean(key: str) -> float:
        return sum(s[key] for s in saves) / len(saves) if saves else 0.0

    summary = {
        "completed": completed,
        "steps": args.steps,
        "saves": len(saves),
        "failed_saves": len(failed),
        "mean_blocking_s": mean("blocking_s"),
        "mean_durable_s": mean("durable_s"),
        "mean_extra_step_s": mean("extra_step_s"),
        "mean_bytes": mean("bytes"),
        "killed_at_step": first.killed_at,
        "last_durable_before_kill": first.last_durable if first.killed_at is not None else None,
        "resumed_from_step": resumed,
        "lost_steps": lost_steps,
        "lost_s": lost_steps * step_s if step_s else None,
        "plans": [p for ph in phases for p in ph.plans],
        "wall_s": sum(p.wall_s for p in phases),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        from rich.table import Table

        table = Table(title="adaptd demo summary", show_header=False)
        table.add_row("training", f"{args.steps} steps, completed: {'yes' if completed else 'NO'}")
        table.add_row("saves", f"{len(saves)} ok, {len(failed)} failed")
        blocked, extra = summary["mean_blocking_s"] * 1e3, summary["mean_extra_step_s"] * 1e3
        table.add_row(
            "save cost (mean)",
            f"blocked {blocked:.1f} ms + {extra:.1f} ms extra step time;"
            f" durable after {summary['mean_durable_s'] * 1e3:.0f} ms;"
            f" {summary['mean_bytes'] / 1e6:.2f} MB",
        )
        if first.killed_at is not None:
            lost = f"{lost_steps} steps"
            if summary["lost_s"] is not None:
                lost += f" ≈ {summary['lost_s']:.1f} s of training"
            table.add_row("killed", f"SIGKILL at step {first.killed_at}")
            table.add_row("work lost to the kill", lost)
            table.add_row("resumed from", f"step {resumed}")
        table.add_row("wall time", f"{summary['wall_s']:.0f} s")
        ui.console.print(table)
    # a resume must start from the newest save reported durable (or a newer one that
    # became durable in the instant before the kill)
    ok = completed and (first.killed_at is None or (resumed or 0) >= first.last_durable)
    return 0 if ok else 1
