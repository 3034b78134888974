"""An overdue save reaches a job whose ranks are ahead of the daemon's view.

A job reports its step about once a second and goes on training, so a plan reaches
it some steps after the step it was computed from. An overdue save
planned at "the step after the last report" is then already behind the job, which
takes the next step of the plan's grid; at the next report the daemon, still seeing
the save overdue, planned it again from a newer step, and the job never saved (the
slow-storage test in tests/faults saw 45 s without a save). Here an in-process
daemon on a fake clock and a job following its plans with the hook's own
:class:`SaveSchedule`, applying each plan a few steps after the report it answers
(the hook reads its socket every 25 ms).
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pytest
import zmq

from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.snapshot import Decision, Snapshot
from adaptd.daemon.assembly import Seams, build
from adaptd.daemon.jobs.planner import ahead_of_the_job
from adaptd.daemon.options import DaemonOptions
from adaptd.protocol import admin
from adaptd.protocol import job as p

STEP_S = 0.01  # 100 steps between two reports
LAG = 3  # steps a plan takes to reach the job (its next socket poll)
#: Daly with pinned figures: about a 3 s interval, 300 steps, longer than a report
#: interval, so a grid that moves at every report is never reached
SHORT = "daly:save_cost_s=0.0225,mtbf_s=200"


def test_an_overdue_save_is_made_even_when_the_plan_arrives_a_report_late() -> None:
    clock = [1000.0]
    with tempfile.TemporaryDirectory(prefix="ad-", dir="/tmp") as d:
        daemon = build(
            DaemonOptions(
                socket=Path(d) / "a.sock",
                default_policy="fixed:steps=1000000",
                tick_interval_s=3600,
            ),
            Seams(clock=lambda: clock[0], snapshot_source=lambda: Snapshot(time=clock[0])),
        ).start()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(daemon.endpoint)
        sched = SaveSchedule()
        saves: list[int] = []
        try:

            def plans() -> list[p.Plan]:
                """Hello again (a reconnect): once its Welcome is in, all sent was handled."""
                sock.send(p.encode(p.Hello(v=p.VERSION, job="j", pid=0)))
                got, welcomed = [], False
                while not welcomed or sock.poll(0):
                    assert sock.poll(10_000), "the daemon did not answer within 10 s"
                    msg = p.decode_daemon(sock.recv())
                    welcomed = welcomed or isinstance(msg, p.Welcome)
                    if isinstance(msg, p.Plan):
                        got.append(msg)
                return got

            for plan in plans():
                sched.apply_plan(plan, 0)
            step, late = 0, []
            for _ in range(40):  # 40 reports, 4,000 steps, 40 s
                if step == 1000:  # the operator shortens the interval: 1000 steps overdue
                    reply = admin.request(
                        daemon.socket_path, admin.SetPolicyRequest(job="j", spec=SHORT)
                    )
                    assert isinstance(reply, admin.SetPolicyReply)
                for i in range(100):
                    step += 1
                    clock[0] += STEP_S
                    if i == LAG:  # the plans answering the last report arrive now
                        for plan in late:
                            sched.apply_plan(plan, step)
                    if step >= sched.due:
                        sched.saved(step)
                        saves.append(step)
                        sock.send(p.encode(p.SaveReport(v=p.VERSION, job="j", rank=0, step=step,
                                                        blocking_s=0.02, durable_s=0.05,
                                                        bytes=1)))  # fmt: skip
                sock.send(p.encode(p.Steps(v=p.VERSION, job="j", rank=0, step=step, count=100,
                                           mean_s=STEP_S)))  # fmt: skip
                late = plans()
        finally:
            sock.close(linger=0)
            ctx.term()
            daemon.stop()
    assert saves, "no save in 30 s after the interval was shortened to about 3 s"
    assert saves[0] <= 1000 + 400  # within a report interval and the lead of the change
    gaps = [b - a for a, b in itertools.pairwise(saves)]
    assert len(saves) >= 8 and max(gaps) <= 2 * 300 + 200, saves


def test_ahead_of_the_job_places_an_overdue_save_once_and_holds_it() -> None:
    overdue = Decision(next_step=501, every_steps=300, reason="overdue")
    moved = ahead_of_the_job(overdue, None, 500, 0.01)
    assert moved.next_step == 700  # 2 s of 10 ms steps past the report
    # at the next report the same overdue decision keeps the announced step
    again = Decision(next_step=601, every_steps=290, reason="overdue")
    assert ahead_of_the_job(again, moved, 600, 0.01).next_step == 700
    # a plan in the future, an urgent one, or one without a step time pass unchanged
    ahead = Decision(next_step=900, every_steps=300)
    assert ahead_of_the_job(ahead, None, 500, 0.01) is ahead
    urgent = Decision(next_step=None, urgent=True)
    assert ahead_of_the_job(urgent, None, 500, 0.01) is urgent
    assert ahead_of_the_job(overdue, None, 500, None) is overdue


@pytest.mark.parametrize("step_s", [0.001, 1.0, 30.0])
def test_the_lead_is_at_least_one_step(step_s) -> None:
    d = ahead_of_the_job(Decision(next_step=11, every_steps=5), None, 10, step_s)
    assert d.next_step >= 11
