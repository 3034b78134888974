"""``adaptd status``: the daemon's jobs, plans and save costs, as a table or JSON.

Per job: its policy (``*`` when set by ``adaptd set-policy``), the current plan's
interval and why, the last save's cost, the predicted waste, and whether it is
paused; then, when the daemon replicates checkpoints (tiered storage), one line per
job and destination (newest replicated step, the running and queued uploads, bytes
pending, seconds behind, throughput, failures and the last error); then the host's
telemetry (GPUs, storage) when the daemon has a sampler.
Asks the admin socket beside the job socket, with a deadline: with no daemon it
prints one line and exits 1, it never hangs.
"""

from __future__ import annotations

import argparse
import math
import sys

import msgspec

HELP = "show the daemon's jobs, plans and telemetry"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--socket", metavar="PATH", help="the daemon's job socket")
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=3.0,
        help="give up when the daemon does not answer within this long (default: 3)",
    )


def run(args: argparse.Namespace) -> int:
    from adaptd import admin, paths

    try:
        reply = admin.request(
            paths.socket_path(args.socket), admin.StatusRequest(), timeout_s=args.timeout
        )
    except admin.AdminError as exc:
        print(f"adaptd status: {exc}", file=sys.stderr)
        return 1
    assert isinstance(reply, admin.StatusReply)
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(reply), indent=2).decode())
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(reply))
    return 0


def _num(value: float | int | None, unit: str = "", digits: int = 3) -> str:
    """``digits`` significant digits, never in exponent notation: an interval of
    4,720 s reads ``4720s``, not ``4.72e+03s``; a tiny figure keeps its digits."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value}{unit}"
    if not math.isfinite(value):
        return f"{value}{unit}"
    if value == 0 or abs(value) >= 10 ** (digits - 1):
        return f"{value:.0f}{unit}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    text = f"{value:.{decimals}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + unit


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def render(reply: object) -> str:
    """The human table: one line per job, then its plan's reason, then the counters."""
    from adaptd import admin

    assert isinstance(reply, admin.StatusReply)
    d = reply.daemon
    lines = [
        f"adaptd {d.version}  pid {d.pid}  up {d.uptime_s:.0f}s  socket {d.socket}",
        f"default policy {d.default_policy}  jobs {d.jobs_active} active, {d.jobs_lost} lost  "
        f"messages {d.messages}  sent {d.sent}  rejected "
        + (", ".join(f"{k}={v}" for k, v in sorted(d.rejected.items())) or "0"),
        "",
    ]
    if not reply.jobs:
        lines.append("no jobs")
        return "\n".join(lines) + "\n" + _replication(reply) + _telemetry(reply)
    header = (
        "JOB",
        "STATE",
        "RANKS",
        "STEP",
        "STEP_T",
        "POLICY",
        "NEXT",
        "EVERY",
        "INTERVAL",
        "SAVES",
        "COST",
        "DURABLE",
        "WASTE",
    )
    rows = [header]
    for j in reply.jobs:
        alive = sum(r.alive for r in j.ranks)
        plan = j.plan
        last = j.last_save
        rows.append(
            (
                j.job,
                j.state,
                f"{alive}/{j.world_size}",
                str(j.step),
                _num(j.step_time_s, "s"),
                j.policy + ("*" if j.policy_set else ""),
                "paused" if j.paused else _num(j.next_save_step),
                _num(plan.every_steps if plan else None),
                _num(plan.interval_s if plan else None, "s"),
                f"{j.saves}" + (f"+{j.failed_saves}err" if j.failed_saves else ""),
                _ms(j.save_cost_s),
                _ms(last.durable_s if last else None),
                _num(j.waste),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    lines.append("")
    for j in reply.jobs:
        note = j.plan.reason if j.plan else "no plan yet"
        if j.state == "lost":
            note = f"lost: {j.lost_reason}"
        if j.paused and not note.startswith("paused"):
            note = f"paused by operator; {note}"
        if j.urgent:
            note += f"  (save requested: {j.urgent})"
        if j.last_save and not j.last_save.ok:
            note += f"  (last save failed: {j.last_save.error})"
        if j.restore_fallback:
            note += f"  (resumed past a damaged checkpoint: {j.restore_fallback})"
        lines.append(f"{j.job}: {note}")
    return "\n".join(lines) + "\n" + _replication(reply) + _telemetry(reply)


def _bytes(n: float | None, unit: str = "") -> str:
    if n is None:
        return "-"
    for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f}{name}{unit}"
    return f"{n:.0f}B{unit}"


def _replication(reply: object) -> str:
    """One line per job and destination, then each failing one's last error."""
    rows = getattr(reply, "replication", None)
    if not rows:
        return ""
    header = ("REPLICATION", "JOB", "REPLICATED", "UPLOADING", "QUEUED", "PENDING", "BEHIND",
              "RATE", "OK", "FAILED", "SKIPPED")  # fmt: skip
    table = [header]
    for r in rows:
        rate = r.throughput_bytes_s
        table.append(
            (
                r.destination,
                r.job,
                _num(r.last_step),
                _num(r.uploading_step) + (" (yielding)" if r.yielding else ""),
                _num(r.pending_step),
                _bytes(r.pending_bytes),
                f"{r.seconds_behind:.0f}s",
                _bytes(rate if rate is not None else r.last_throughput_bytes_s, "/s"),
                str(r.uploads),
                str(r.failures),
                str(r.skipped),
            )
        )
    widths = [max(len(t[i]) for t in table) for i in range(len(header))]
    lines = ["", *("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip()
                   for t in table)]  # fmt: skip
    for r in rows:
        if r.last_error:
            retry = f", retry in {r.next_retry_s:.0f}s" if r.next_retry_s is not None else ""
            lines.append(f"{r.job} -> {r.destination}: last error{retry}: {r.last_error}")
    return "\n".join(lines) + "\n"


def _telemetry(reply: object) -> str:
    import time

    from adaptd.telemetry import report

    data = getattr(reply, "telemetry", None)
    if not data:
        return ""
    fleet = ""
    if isinstance(data.get("fleet"), dict):
        from adaptd.fleet.report import render as render_fleet

        data = dict(data)
        fleet = render_fleet(data.pop("fleet"))
    return fleet + "\n" + report.render(data, now=time.monotonic())
