"""Two tiers through a real ``adaptd serve`` (issue 24): a job that says it has a
memory tier and reports a cheap local save beside a costly durable one gets a plan
from the ``tiers`` policy that makes only every k-th save durable (k > 1), the plan
carries k, and ``adaptd status --json`` shows it beside the interval; the daemon's
database keeps k with the decision and each save's tier, which ``adaptd history``
(its table and ``--json``) and ``adaptd report`` show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from adaptd.protocol import job as p

from ._serve import NotifyListener, Peer, Serve


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.term()


def _report(job: str, step: int, blocking_s: float, tier: str) -> p.SaveReport:
    return p.SaveReport(v=p.VERSION, job=job, rank=0, step=step, blocking_s=blocking_s,
                        durable_s=blocking_s * 4, bytes=1 << 20, tier=tier)  # fmt: skip


@pytest.mark.slow
def test_the_daemon_plans_two_tiers_from_the_measured_costs(short_dir: Path, ctx) -> None:
    state = short_dir / "state"
    conf = short_dir / "adaptd.toml"
    conf.write_text(  # no metrics port: the default one may be another daemon's
        f'[daemon]\nstate_dir = "{state}"\n[policy]\ndefault = "tiers"\n[metrics]\nlisten = "off"\n'
    )
    sock = short_dir / "a.sock"
    notify = NotifyListener(short_dir / "notify")
    d = Serve(["--config", str(conf), "--socket", str(sock)], notify, {})
    peer = None
    try:
        d.ready()
        peer = Peer(ctx, f"ipc://{sock}", "j1")
        peer.send(p.Hello(v=p.VERSION, job="j1", pid=os.getpid(), gpus=1, local_tier="memory"))
        peer.until(p.Welcome)
        step, plan = 0, None
        deadline = time.monotonic() + 20
        while plan is None or not plan.durable_every or plan.durable_every < 2:
            assert time.monotonic() < deadline, plan
            step += 10
            peer.steps(step, mean_s=0.5)
            local = step % 20 == 10
            peer.send(_report("j1", step, 0.01 if local else 5.0, "local" if local else ""))
            try:
                while True:
                    msg = peer.recv(0.3)
                    if isinstance(msg, p.Plan):
                        plan = msg
            except TimeoutError:
                pass
        assert "two tiers" in plan.reason and f"every {plan.durable_every}th" in plan.reason
        out = subprocess.run(
            [sys.executable, "-m", "adaptd.cli", "status", "--socket", str(sock), "--json"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        (job,) = json.loads(out.stdout)["jobs"]
        assert job["plan"]["durable_every"] == plan.durable_every
        assert job["plan"]["every_steps"] == plan.every_steps
        table = subprocess.run(
            [sys.executable, "-m", "adaptd.cli", "status", "--socket", str(sock)],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        assert f"k={plan.durable_every}" in table
        # the history keeps each save's tier (`adaptd history --json`)
        hist = subprocess.run(
            [sys.executable, "-m", "adaptd.cli", "history", "j1", "--socket", str(sock),
             "--json"], capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        tiers = {(s["step"], s["tier"]) for s in json.loads(hist)["saves"]}
        assert (10, "local") in tiers and (20, "") in tiers, tiers
        plain = subprocess.run(
            [sys.executable, "-m", "adaptd.cli", "history", "j1", "--socket", str(sock)],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.splitlines()  # fmt: skip
        assert plain[0].split()[2] == "TIER"
        assert [ln.split()[2:4] for ln in plain[1:3]] == [["10", "local"], ["20", "durable"]]
        d.terminate()
        assert peer.until(p.SaveNow).reason == "shutdown"  # the drain: a durable save
        peer.steps(step + 1, count=1, mean_s=0.5)
        peer.send(_report("j1", step + 1, 5.0, ""))
        assert d.wait() == 0, d.log.text()
        # the daemon's database keeps k with each decision, and the report shows it
        db = state / "adaptd.sqlite3"
        html = short_dir / "r.html"
        subprocess.run(
            [sys.executable, "-m", "adaptd.cli", "report", "--job", "j1", "--db", str(db),
             "--out", str(html)], capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        page = html.read_text()
        k = plan.durable_every
        local = sum(x % 20 == 10 for x in range(10, step + 1, 10))
        assert f"every {k}th save durable; {local} local saves" in page
        assert "<td>local</td>" in page and "<td>durable</td>" in page
    finally:
        if peer is not None:
            peer.close()
        d.kill()
        notify.close()
