"""``adaptd status``: the daemon's jobs, plans and save costs, as a table or JSON.

Per job: its policy (``*`` when set by ``adaptd set-policy``), the current plan's
interval and why, the last save's cost, the predicted waste, and whether it is
paused; then, when the daemon replicates checkpoints (tiered storage), one line per
job and destination (newest replicated step, the running and queued uploads, bytes
pending, seconds behind, throughput, failures and the last error); then the host's
telemetry (GPUs, storage) when the daemon has a sampler.
Asks the admin socket beside the job socket, with a deadline: with no daemon it
prints one line and exits 1, it never hangs. The daemon's side is
:func:`adaptd.daemon.admin.answers.status` (:class:`~adaptd.daemon.admin.status.StatusView`).
"""

from __future__ import annotations

import argparse
from typing import Any

from adaptd import tables
from adaptd.commands import _operator
from adaptd.protocol.admin import StatusRequest
from adaptd.tables import Table, number

HELP = "show the daemon's jobs, plans and telemetry"


def configure(parser: argparse.ArgumentParser) -> None:
    _operator.add_socket_args(parser, json_help="machine-readable output", timeout_flag="--timeout")


def run(args: argparse.Namespace) -> int:
    return _operator.call("status", args, StatusRequest(), lambda r: tables.emit(parts(r)))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def render(reply: object) -> str:
    """The status as plain text (what a pipe gets): :func:`parts` laid out as text."""
    return tables.plain(parts(reply))


def parts(reply: object) -> list[tables.Part]:
    """The daemon's header, the job table, each plan's reason, the replication table,
    the host's telemetry: tables and text for :func:`adaptd.tables.emit`."""
    from adaptd.protocol import admin

    assert isinstance(reply, admin.StatusReply)
    d = reply.daemon
    out: list[tables.Part] = [
        f"adaptd {d.version}  pid {d.pid}  up {d.uptime_s:.0f}s  socket {d.socket}\n"
        f"default policy {d.default_policy}  jobs {d.jobs_active} active, {d.jobs_lost} lost  "
        f"messages {d.messages}  sent {d.sent}  rejected "
        + (", ".join(f"{k}={v}" for k, v in sorted(d.rejected.items())) or "0")
        + "\n",
    ]
    if not reply.jobs:
        out.append("no jobs")
        return out + _replication(reply) + _telemetry(reply)
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
    rows = []
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
                number(j.step_time_s, "s"),
                j.policy + ("*" if j.policy_set else ""),
                "paused" if j.paused else number(j.next_save_step),
                number(plan.every_steps if plan else None)
                + (f" k={plan.durable_every}" if plan and plan.durable_every else ""),
                number(plan.interval_s if plan else None, "s"),
                f"{j.saves}" + (f"+{j.failed_saves}err" if j.failed_saves else ""),
                _ms(j.save_cost_s),
                _ms(last.durable_s if last else None),
                number(j.waste),
            )
        )
    numeric = frozenset(range(2, 13)) - {5, 9}
    if any(j.agreement != "none" for j in reply.jobs):  # a job of several ranks: who decides
        header = (*header[:6], "DECIDED_BY", *header[6:])
        rows = [(*row[:6], _decider(j), *row[6:]) for row, j in zip(rows, reply.jobs, strict=True)]
        numeric = frozenset(range(2, 14)) - {5, 6, 10}
    out.append(Table(header, rows, numeric=numeric))
    notes = []
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
        if j.agreement != "none":
            note += f"  ({_agreement(j)})"
        if j.stalled:
            note += f"  (stalled, its ranks told to abort: {j.stall_reason})"
        elif j.stall_threshold_s is not None:
            note += f"  (hang after {j.stall_threshold_s:.3g}s without a step)"
        if j.failures_covered:
            share = f", planned with {j.jit_coverage:.0%}" if j.jit_coverage is not None else ""
            note += (f"  (failures: {j.failures_covered} covered just in time, "
                     f"{j.failures - j.failures_covered} not{share})")  # fmt: skip
        notes.append(f"{j.job}: {note}")
    out.append("\n" + "\n".join(notes))
    return out + _replication(reply) + _telemetry(reply)


def _decider(j: Any) -> str:
    """Which host decides a job's plan: this one ("here"), another, or not known yet."""
    if j.agreement == "none":
        return "-"
    if j.decided_here:
        return f"here ({j.decided_by})" if j.decided_by else "here"
    return j.decided_by or "rank 0's host"


def _agreement(j: Any) -> str:
    """How a multi-rank job's ranks agree, and where its plan stands."""
    if j.agreement == "daemon":
        text = "ranks agree through this daemon"
        if j.rounds is not None:
            text += f": {j.rounds.committed} rounds committed, {j.rounds.aborted} aborted"
            if j.rounds.open_round is not None:
                waiting = ", ".join(map(str, j.rounds.waiting_for)) or "none"
                text += (
                    f"; round {j.rounds.open_round} ({j.rounds.open_action} at step "
                    f"{j.rounds.open_at_step}) waits for rank(s) {waiting}"
                )
    else:
        text = "ranks agree on the coordination service"
        text += "; plan decided here" if j.decided_here else f"; plan decided by {_decider(j)}"
    if j.plan_from_step is not None:
        text += f"; agreed plan in force from step {j.plan_from_step}"
    return text


def _replication(reply: object) -> list[tables.Part]:
    """One row per job and destination, then each failing one's last error."""
    rows = getattr(reply, "replication", None)
    if not rows:
        return []
    header = ("REPLICATION", "JOB", "REPLICATED", "UPLOADING", "QUEUED", "PENDING", "BEHIND",
              "RATE", "OK", "FAILED", "SKIPPED")  # fmt: skip
    table = []
    for r in rows:
        rate = r.throughput_bytes_s
        table.append(
            (
                r.destination,
                r.job,
                number(r.last_step),
                number(r.uploading_step) + (" (yielding)" if r.yielding else ""),
                number(r.pending_step),
                tables.size(r.pending_bytes),
                f"{r.seconds_behind:.0f}s",
                tables.size(rate if rate is not None else r.last_throughput_bytes_s, "/s"),
                str(r.uploads),
                str(r.failures),
                str(r.skipped),
            )
        )
    errors = []
    for r in rows:
        if r.last_error:
            retry = f", retry in {r.next_retry_s:.0f}s" if r.next_retry_s is not None else ""
            errors.append(f"{r.job} -> {r.destination}: last error{retry}: {r.last_error}")
    out: list[tables.Part] = ["", Table(header, table, numeric=frozenset(range(2, 11)))]
    if errors:
        out.append("\n".join(errors))
    return out


def _telemetry(reply: object) -> list[tables.Part]:
    import time

    from adaptd.telemetry import report

    data = getattr(reply, "telemetry", None)
    if not data:
        return []
    fleet: list[tables.Part] = []
    if isinstance(data.get("fleet"), dict):
        from adaptd.fleet.report import render as render_fleet

        data = dict(data)
        fleet = [render_fleet(data.pop("fleet"))]
    return [*fleet, "", *report.parts(data, now=time.monotonic())]
