"""``adaptd history JOB``: a job's saves from the daemon's state database, newest last.

Against a real ``adaptd serve`` (its own state database): a raw rank reports saves
(one failed, one to the local tier of two), ``history`` lists them as a table in human
units (with each save's tier) and as JSON, keeps the newest ``--limit``, filters
``--since``; a daemon without a database and an unknown job are refused with one line.
Also here: the daemon-asking commands stop quietly when their output pipe is closed
(tests/test_broken_pipe.py has the others).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from daemon_helpers import DEADLINE, Peer, thread_daemon

from adaptd.cli import BROKEN_PIPE_STATUS
from adaptd.cli import main as cli_main
from adaptd.protocol import job as p

MIB = 2**20


def report(peer: Peer, job: str, step: int, *, rank: int = 0, ok: bool = True, **kw) -> None:
    peer.send(p.SaveReport(v=p.VERSION, job=job, rank=rank, step=step, ok=ok, **{
        "blocking_s": 0.012, "durable_s": 0.85, "bytes": 3 * MIB,
        "reason": "every 10 steps", **kw,
    }))  # fmt: skip


@pytest.fixture(scope="module")
def saved(shared_daemon, zctx_module):
    """Job ``hist`` with saves at steps 10, 20 (failed) and 30 in the shared daemon's
    database, and job ``hist-2`` whose two ranks saved step 5."""
    peer = Peer(zctx_module, shared_daemon.endpoint)
    peer.hello("hist")
    report(peer, "hist", 10, tier="local")  # two tiers: a save to the local tier only
    report(peer, "hist", 20, ok=False, error="disk full (test)", durable_s=0.0, bytes=0)
    report(peer, "hist", 30, blocking_s=1.5, durable_s=150.0, bytes=int(1.5 * 2**30),
           reason="operator request")  # fmt: skip
    peer.barrier("hist")  # the pipe is ordered: every report was handled before this
    two = [Peer(zctx_module, shared_daemon.endpoint) for _ in range(2)]
    for rank, r in enumerate(two):
        r.hello("hist-2", rank=rank, world_size=2)
        report(r, "hist-2", 5, rank=rank)
        r.barrier("hist-2", rank=rank, world_size=2)
    yield str(shared_daemon.socket)
    for r in (peer, *two):
        r.close()


@pytest.fixture(scope="module")
def zctx_module():
    import zmq

    ctx = zmq.Context()
    yield ctx
    ctx.term()


def history(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli_main(["history", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_table_lists_every_save_newest_last_in_human_units(saved, capsys) -> None:
    rc, out, err = history(capsys, "hist", "--socket", saved)
    assert rc == 0, err
    lines = out.splitlines()
    header = ["ENDED", "STEP", "TIER", "REASON", "BLOCKED", "DURABLE", "SIZE", "RESULT"]
    assert lines[0].split() == header
    rows = [ln.split() for ln in lines[1:4]]
    # ENDED is a date and a time: the step is the third word, the tier the fourth
    assert [r[2:4] for r in rows] == [["10", "local"], ["20", "durable"], ["30", "durable"]]
    assert rows[0][4:] == ["every", "10", "steps", "12ms", "850ms", "3.0MiB", "ok"]
    assert rows[1][-1] == "FAILED" and rows[1][-2] == "0B"
    assert rows[2][4:] == ["operator", "request", "1.5s", "2.5min", "1.5GiB", "ok"]
    assert "step 20 failed: disk full (test)" in lines
    assert lines[-1] == "hist: 3 saves, 1 failed"


def test_json_is_the_daemons_reply_for_scripts(saved, capsys) -> None:
    rc, out, _ = history(capsys, "hist", "--json", "--socket", saved)
    data = json.loads(out)
    assert rc == 0 and data["job"] == "hist" and data["more"] is False
    assert [s["step"] for s in data["saves"]] == [10, 20, 30]
    first = data["saves"][0]
    assert (first["blocking_s"], first["durable_s"], first["bytes"]) == (0.012, 0.85, 3 * MIB)
    assert data["saves"][1]["ok"] is False and data["saves"][1]["error"] == "disk full (test)"
    assert [s["tier"] for s in data["saves"]] == ["local", "", ""]
    assert abs(data["saves"][2]["ended"] - time.time()) < 600


def test_limit_keeps_the_newest_and_says_more_were_left_out(saved, capsys) -> None:
    rc, out, _ = history(capsys, "hist", "--limit", "2", "--socket", saved)
    assert rc == 0 and [ln.split()[2] for ln in out.splitlines()[1:3]] == ["20", "30"]
    assert "hist: 2 saves, 1 failed; older ones left out (the newest 2 shown" in out
    assert json.loads(history(capsys, "hist", "--limit", "2", "--json", "--socket", saved)[1])[
        "more"
    ]
    rc, _, err = history(capsys, "hist", "--limit", "0", "--socket", saved)
    assert rc == 2 and "--limit must be in [1, 10000], got 0" in err


def test_since_keeps_the_window(saved, capsys) -> None:
    rc, out, _ = history(capsys, "hist", "--since", "1h", "--json", "--socket", saved)
    assert rc == 0 and len(json.loads(out)["saves"]) == 3
    later = str(time.time() + 3600)
    rc, out, _ = history(capsys, "hist", "--since", later, "--socket", saved)
    assert rc == 0 and out.startswith("hist: no saves since ")
    rc, _, err = history(capsys, "hist", "--since", "yesterday", "--socket", saved)
    assert rc == 2 and "--since 'yesterday': not a duration" in err


def test_a_job_of_several_ranks_shows_the_rank(saved, capsys) -> None:
    rc, out, _ = history(capsys, "hist-2", "--socket", saved)
    lines = out.splitlines()
    assert rc == 0 and lines[0].split()[:5] == ["ENDED", "STEP", "RANK", "TIER", "REASON"]
    assert [ln.split()[2:5] for ln in lines[1:3]] == [["5", "0", "durable"], ["5", "1", "durable"]]


def test_an_unknown_job_and_no_daemon_are_one_line_each(saved, short_dir, capsys) -> None:
    rc, out, err = history(capsys, "ghost", "--socket", saved)
    assert (rc, out) == (1, "") and err.count("\n") == 1
    assert "job 'ghost': no saves in this daemon's history" in err and "hist" in err
    rc, _, err = history(capsys, "hist", "--socket", str(short_dir / "adaptd.sock"))
    assert rc == 1 and "no adaptd daemon is running" in err


def test_a_daemon_without_a_state_database_says_it_keeps_no_history(short_dir, capsys) -> None:
    with thread_daemon(short_dir / "adaptd.sock") as (d, _):
        rc, _, err = history(capsys, "j", "--socket", str(d.socket_path))
    assert rc == 1 and "keeps no save history" in err


@pytest.mark.parametrize(
    "args", [["status"], ["status", "--json"], ["history", "hist"], ["history", "hist", "--json"]]
)
def test_daemon_commands_into_a_closed_pipe_exit_quietly(saved, args) -> None:
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "adaptd.cli", *args, "--socket", saved],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=DEADLINE * 3,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (BROKEN_PIPE_STATUS, "")
