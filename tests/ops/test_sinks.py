"""Store and metrics as the daemon's event sinks: one job's life, event by event."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from adaptd import events as ev
from adaptd.core.snapshot import Decision
from adaptd.metrics.exporter import Metrics
from adaptd.protocol.job import VERSION, SaveReport
from adaptd.state.store import Store

W = 1_700_000_000.0  # wall clock of the story; monotonic time is W - 1e9


def report(rank: int, step: int, *, ok: bool = True, blocking: float = 0.01) -> SaveReport:
    return SaveReport(v=VERSION, job="llm", rank=rank, step=step, blocking_s=blocking,
                      durable_s=3.0, bytes=500, ok=ok, error="" if ok else "EIO")  # fmt: skip


def story() -> list[ev.Event]:
    m = -1e9  # monotonic offset
    plan = Decision(next_step=100, every_steps=100, policy="fixed", reason="every 100 steps",
                    interval_s=50.0, waste=0.02)  # fmt: skip
    out: list[ev.Event] = []
    for rank in (0, 1):  # jobs_active: the registry's count of active jobs after the event
        out.append(
            ev.JobRegistered(W + m, W, "llm", rank, 2, 100 + rank, "h1", "/ck", 0, 1, jobs_active=1)
        )
    out.append(ev.PlanChanged(W + 1 + m, W + 1, "llm", 1, 0, plan, 2))
    for rank in (0, 1):  # both ranks fail to save step 100: one failed save, not two
        out.append(
            ev.SaveReported(W + 60 + m, W + 60, "llm", report(rank, 100, ok=False), rank == 0)
        )
    for rank in (0, 1):
        out.append(ev.SaveReported(W + 110 + m, W + 110, "llm", report(rank, 200), rank == 0))
    out.append(ev.SaveRequested(W + 120 + m, W + 120, "llm", 230, "operator: save-now", 2))
    out.append(
        ev.JobLost(
            W + 200 + m, W + 200, "llm", 290, 200, W + 150 + m, "pid 100 gone", 16, 2, jobs_active=0
        )
    )
    out.append(
        ev.JobRegistered(W + 230 + m, W + 230, "llm", 0, 2, 300, "h1", "/ck", 200, 2, jobs_active=1)
    )
    out.append(ev.JobResumed(W + 240 + m, W + 240, "llm", W + 200 + m, 290, 200, 40.0))
    out.append(ev.JobFinished(W + 900 + m, W + 900, "llm", 1500, "done", jobs_active=0))
    return out


def test_the_store_records_a_jobs_life(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "s.db", clock=lambda: W + 1000)
    for e in story():
        s.on_event(e)
    saves = s.saves("llm")
    assert [(r.rank, r.step, r.ok) for r in saves] == [
        (0, 100, False), (1, 100, False), (0, 200, True), (1, 200, True),
    ]  # fmt: skip
    assert saves[2].ended == W + 110 and saves[2].started == W + 107
    decisions = s.decisions("llm")
    assert [(d.step, d.next_step, d.every_steps, d.urgent) for d in decisions] == [
        (0, 100, 100, False), (230, None, None, True),
    ]  # fmt: skip
    assert decisions[0].interval_s == 50.0 and decisions[1].reason == "operator: save-now"
    (failure,) = s.failures("llm")
    assert (failure.time, failure.lost_at_step, failure.resumed_step, failure.restart_s) == (
        W + 200, 290, 200, 40.0,
    )  # fmt: skip
    s.close()


def test_metrics_follow_a_jobs_life() -> None:
    m = Metrics()
    seen = []
    for e in story():
        m.on_event(e)
        seen.append(_value(m, "adaptd_jobs_connected", {}))
        if isinstance(e, ev.JobResumed):
            mid = m.render().decode()
    assert seen == [1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0]
    vals = _samples(mid)
    job = (("job_id", "llm"),)
    assert vals[("adaptd_saves_total", (("job_id", "llm"), ("result", "failed")))] == 1
    assert vals[("adaptd_saves_total", (("job_id", "llm"), ("result", "ok")))] == 1
    assert (
        vals[("adaptd_save_blocking_seconds_count", (*job, ("tier", "durable")))] == 4
    )  # every rank's block counts
    assert vals[("adaptd_save_written_bytes_total", job)] == 1000
    assert vals[("adaptd_job_bad_save_streak", job)] == 0  # failed once, then saved
    assert vals[("adaptd_job_failures_total", job)] == 1
    assert vals[("adaptd_job_interval_seconds", job)] == 50.0
    # the second incarnation restarted the no-save clock
    assert vals[("adaptd_job_start_timestamp_seconds", job)] == W + 230
    assert vals[("adaptd_job_last_save_timestamp_seconds", job)] == W + 110
    # a clean finish removes the job's series after the grace period, not at once
    finished = next(e.time for e in story() if isinstance(e, ev.JobFinished))
    assert ("adaptd_saves_total", (("job_id", "llm"), ("result", "ok"))) in _samples(
        m.render().decode()
    )
    assert m.expire(finished + m.job_series_grace_s - 0.001) == []
    assert m.expire(finished + m.job_series_grace_s) == ["llm"]
    after = _samples(m.render().decode())
    assert not [k for k in after if ("job_id", "llm") in k[1]]
    assert after[("adaptd_host_saves_total", (("result", "ok"),))] == 1  # the host keeps it


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _value(m: Metrics, name: str, labels: dict[str, str]) -> float | None:
    return m.registry.get_sample_value(name, labels)
