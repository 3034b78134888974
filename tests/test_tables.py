"""Command-line tables (adaptd.tables): rich on a real terminal (a pty), the plain layout
when piped, and one number format for both."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from adaptd import tables
from adaptd.commands import drain, status
from adaptd.protocol import admin
from adaptd.tables import Table, number

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ADAPTD = [sys.executable, "-c", "import sys; from adaptd.cli import main; sys.exit(main())"]


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (None, "s", "-"),
        (4720.3, "s", "4720s"),  # an interval in seconds: never 4.72e+03s
        (123456.7, "", "123457"),
        (0.811, "s", "0.811s"),
        (0.25, "s", "0.25s"),
        (40.0, "", "40"),
        (12.345, "", "12.3"),
        (0.01234, "", "0.0123"),
        (1.234e-05, "", "0.0000123"),
        (-2.5, "", "-2.5"),
        (0.0, "", "0"),
        (1200, "", "1200"),
        (float("inf"), "s", "infs"),
    ],
)
def test_number(value, unit, text) -> None:
    assert number(value, unit) == text


def test_number_refuses_no_digits() -> None:
    with pytest.raises(ValueError, match="digits must be >= 1, got 0"):
        number(1.0, digits=0)


def test_a_row_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match=r"row 1 has 1 cells for 2 columns"):
        Table(("A", "B"), [("1", "2"), ("3",)])


def test_plain_layout() -> None:
    t = Table(("JOB", "STEP", "NOTE"), [("a-long-job", "7", ""), ("b", "1200", "x")])
    assert t.plain() == "JOB         STEP  NOTE\na-long-job  7\nb           1200  x"
    out = io.StringIO()  # not a terminal
    tables.emit(["head", t], out)
    assert out.getvalue() == "head\n" + t.plain() + "\n"


# ------------------------------------------------------------------ a real terminal


def read_pty(master: int, until_eof: bool = True, deadline_s: float = 30.0) -> str:
    data = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        ready, _, _ = select.select([master], [], [], 0.2)
        if not ready:
            if not until_eof:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other end closed
            break
        if not chunk:
            break
        data += chunk
    return data.decode()


def on_a_terminal(parts: list[tables.Part]) -> str:
    master, slave = pty.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            assert tty.isatty()
            tables.emit(parts, tty)  # terminal=None: the file says it is one
        return read_pty(master, until_eof=False)
    finally:
        os.close(slave)
        os.close(master)


def reply() -> admin.StatusReply:
    daemon = admin.DaemonInfo(
        version="0.1.0", pid=42, socket="/run/a.sock", admin_socket="/run/a.admin.sock",
        default_policy="default", uptime_s=12.0, messages=9, by_kind={}, rejected={}, sent=5,
        send_dropped=0, plans_sent=1, policy_errors=0, sink_errors=0, jobs_active=1,
        jobs_lost=0, peers=1,
    )  # fmt: skip
    plan = admin.PlanInfo(seq=1, next_step=1200, every_steps=4720, policy="default",
                          reason="daly", interval_s=4720.3, waste=0.0123)  # fmt: skip
    job = admin.JobInfo(
        job="[bold]llm", state="active", world_size=1,
        ranks=[admin.RankInfo(rank=0, pid=1, hostname="h", alive=True, step=10, last_seen_s=0)],
        step=10, start_step=0, step_time_s=0.811, policy="default", plan=plan,
        next_save_step=1200, saves=2, failed_saves=0, save_cost_s=0.3, save_latency_s=0.9,
        last_save=None, last_durable_step=None, waste=0.0123, restore_s=None, failures=0,
        incarnation=1, checkpoint_dir="/c",
    )  # fmt: skip
    return admin.StatusReply(daemon=daemon, jobs=[job])


def test_status_is_a_rich_table_on_a_terminal_and_plain_when_piped() -> None:
    r = reply()
    shown = on_a_terminal(status.parts(r))
    assert "\x1b[1m" in shown  # a bold header: rich drew it
    text = ANSI.sub("", shown)
    assert "─" * 20 in text  # the rule under the header
    row = next(line for line in text.splitlines() if "llm" in line and "active" in line)
    # the job id is text, not rich markup; the interval is the same string as piped
    assert row.split()[:2] == ["[bold]llm", "active"] and "4720s" in row.split()
    piped = status.render(r)
    assert "\x1b" not in piped and "─" not in piped
    head, row = (line for line in piped.splitlines() if line.startswith(("JOB ", "[bold]llm ")))
    assert head.split() == ["JOB", "STATE", "RANKS", "STEP", "STEP_T", "POLICY", "NEXT",
                            "EVERY", "INTERVAL", "SAVES", "COST", "DURABLE", "WASTE"]  # fmt: skip
    assert row.split() == ["[bold]llm", "active", "1/1", "10", "0.811s", "default", "1200",
                           "4720", "4720s", "2", "300ms", "-", "0.0123"]  # fmt: skip


def test_drain_on_a_terminal() -> None:
    r = admin.DrainReply(
        jobs=[admin.DrainJob(job="a", ranks=1, step=10, durable=True, seconds=1.5)],
        seconds=1.6,
        timed_out=False,
    )
    text = ANSI.sub("", on_a_terminal(drain.parts(r)))
    assert "─" * 10 in text and "1/1 job(s) durable in 1.60s" in text
    assert drain.render(r) == "JOB  STEP  DURABLE  SECONDS  NOTE\na    10    yes      1.50\n" + (
        "1/1 job(s) durable in 1.60s\n"
    )


def test_simulate_in_a_real_terminal_and_in_a_pipe(tmp_path) -> None:
    """The command itself, its stdout a pty (rich) or a pipe (plain); its JSON is
    pinned by tests/sim."""
    path = tmp_path / "tiny.toml"
    path.write_text(
        "[job]\nsteps = 2000\nstep_time_s = 1.0\ngpus = 8\n"
        "[checkpoint]\nblocking_s = 2.0\nlatency_s = 10.0\nrestore_s = 30\n"
        "[failures]\nmtbf_gpu_hours = 20\n"
    )
    argv = [*ADAPTD, "simulate", "--scenario", str(path), "--policy", "fixed:steps=50",
            "--policy", "daly", "--seeds", "2", "--jobs", "1"]  # fmt: skip
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.DEVNULL)
        os.close(slave)
        shown = read_pty(master)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(master)
    text = ANSI.sub("", shown)
    assert "\x1b[1m" in shown and "─" * 20 in text
    assert any(line.split()[:1] == ["daly"] for line in text.splitlines())
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "\x1b" not in piped and "─" not in piped
    lines = piped.splitlines()
    assert lines[2].split() == ["policy", "goodput", "±", "wall", "h", "ckpt", "h", "lost",
                                "h", "restart", "h", "warm-up", "h", "saves", "failures",
                                "best"]  # fmt: skip
    assert [line.split()[0] for line in lines[3:5]] == ["fixed:steps=50", "daly"]
