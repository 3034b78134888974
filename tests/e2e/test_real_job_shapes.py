"""A real job's shape against a real daemon: a slow first step, then fast steps.

Issue 11's scenario, bounded: ``adaptd serve --policy daly:mtbf_s=2000,probe_s=3``
and a TensorFlow custom loop whose first step takes 3 s and whose later steps take
about 20 ms. Before the step time left warm-up out, the daemon planned "every
2.4-13 s" in 1-4 steps and the job saved at nearly every step.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

import pytest
from faults.zygote import Zygote

from adaptd.client.checkpointer import FINAL_SAVE_REASON
from adaptd.commands._spawn import running_daemon

pytestmark = [pytest.mark.slow, pytest.mark.tf]

HERE = Path(__file__).resolve().parent
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
PLAN = re.compile(r"event=plan .*?every_steps=(\d+).*?interval_s=([0-9.e+-]+)")


def test_a_slow_first_step_does_not_make_the_daemon_save_at_every_step(
    tmp_path: Path, zygote: Zygote
) -> None:
    sock = tmp_path / "adaptd.sock"
    log = tmp_path / "daemon.log"
    with (
        open(log, "w") as out,
        running_daemon(sock, ["--policy", "daly:mtbf_s=2000,probe_s=3"], log=out),
    ):
        # forked from the session's zygote: a process of its own, without TF's import
        job = zygote.spawn(
            [tmp_path / "ckpts", f"ipc://{sock}", "--first-step-s", "3", "--step-s", "0.02",
             "--run-s", "10"], script=HERE / "slow_start_job.py", deadline_s=180,
        )  # fmt: skip
        code = job.wait(180)
    lines = job.log.ended()
    assert code == 0, "\n".join(lines[-60:])
    events = [json.loads(ln) for ln in lines if ln.startswith("{")]
    done = events[-1]
    step_s = done["step_s"]  # the job's real pace, sleeps and training together
    assert 0.015 < step_s < 0.2, done
    plans = [(int(m[1]), float(m[2])) for m in PLAN.finditer(log.read_text())]
    assert plans, log.read_text()[-3000:]
    # every plan's steps take (at least nearly) the interval it states: no "every 2.4 s"
    # planned as 3 steps of 20 ms
    for every, interval_s in plans:
        assert every * step_s >= 0.7 * interval_s, (every, interval_s, step_s, plans)
    saves = [e for e in events if e["event"] == "save" and e["ok"]]
    planned = [e for e in saves if e["reason"] != FINAL_SAVE_REASON]
    shortest = min(interval_s for _, interval_s in plans)
    # as many saves as the stated intervals allow in the run, not one per step
    assert 1 <= len(planned) <= 1 + done["fast_s"] / shortest, (planned, plans)
    assert saves[-1]["reason"] == FINAL_SAVE_REASON  # close() saved the last step
    for a, b in itertools.pairwise(planned):
        assert (b["step"] - a["step"]) * step_s >= 0.7 * shortest, (planned, plans)
