"""An ended job's series stay for a grace period, and the host's totals have no job
label: checked with real scrapes (HTTP GET of /metrics), of the Metrics endpoint driven
by the daemon's events and of a whole Service that a real ZeroMQ peer says goodbye to."""

from __future__ import annotations

import time
import urllib.request

import pytest
import zmq

from adaptd import events as ev
from adaptd.config import loader as config
from adaptd.daemon.sdnotify import Notifier
from adaptd.daemon.service import Service
from adaptd.metrics.exporter import Metrics
from adaptd.protocol import job as p
from adaptd.telemetry.sampler import Sampler

from .test_metrics import samples

DEADLINE = 30.0
JOB = (("job_id", "short"),)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        return samples(r.read().decode())


def job_series(got: dict) -> set[str]:
    return {name for name, labels in got if ("job_id", "short") in labels}


def report(step: int, ok: bool = True, job: str = "short") -> p.SaveReport:
    return p.SaveReport(v=p.VERSION, job=job, rank=0, step=step, blocking_s=0.01,
                        durable_s=0.5, bytes=4096, ok=ok, error="" if ok else "EIO")  # fmt: skip


def test_a_finished_jobs_saves_are_scraped_during_the_grace_period() -> None:
    m = Metrics(job_series_grace_s=30.0)
    srv = m.serve("127.0.0.1", 0)
    try:
        t = 1000.0  # the daemon's monotonic clock
        m.on_event(ev.JobRegistered(t, 1e9, "short", 0, 1, 1, "h", "/c", 0, 1))
        for step, ok in ((10, True), (20, False), (30, True)):
            m.on_event(ev.SaveReported(t + step, 1e9 + step, "short", report(step, ok), True))
        m.on_event(ev.JobFinished(t + 31, 1e9 + 31, "short", 30, "done"))
        assert m.expire(t + 31 + 29.9) == []
        got = scrape(srv.url)  # the scrape after the job ended still sees its last saves
        assert got[("adaptd_saves_total", (*JOB, ("result", "ok")))] == 2
        assert got[("adaptd_saves_total", (*JOB, ("result", "failed")))] == 1
        assert got[("adaptd_save_written_bytes_total", JOB)] == 2 * 4096
        assert got[("adaptd_jobs_connected", ())] == 0
        assert m.expire(t + 31 + 30.0) == ["short"]
        got = scrape(srv.url)
        assert job_series(got) == set()
        # the host's totals, without a job label, keep every save
        assert got[("adaptd_host_saves_total", (("result", "ok"),))] == 2
        assert got[("adaptd_host_saves_total", (("result", "failed"),))] == 1
        assert got[("adaptd_host_save_written_bytes_total", ())] == 2 * 4096
    finally:
        srv.stop()


def test_a_job_back_within_its_grace_period_keeps_its_series() -> None:
    m = Metrics(job_series_grace_s=30.0)
    m.on_event(ev.JobRegistered(0.0, 1e9, "short", 0, 1, 1, "h", "/c", 0, 1))
    m.on_event(ev.SaveReported(1.0, 1e9, "short", report(1), True))
    m.on_event(ev.JobFinished(2.0, 1e9, "short", 1, "done"))
    m.on_event(ev.JobRegistered(10.0, 1e9, "short", 0, 1, 1, "h", "/c", 1, 2))  # restarted
    assert m.expire(100.0) == []
    got = samples(m.render().decode())
    assert got[("adaptd_saves_total", (*JOB, ("result", "ok")))] == 1  # counting on


def test_a_forgotten_jobs_grace_counts_from_when_it_was_forgotten() -> None:
    m = Metrics(job_series_grace_s=30.0)
    m.on_event(ev.JobRegistered(0.0, 1e9, "short", 0, 1, 1, "h", "/c", 0, 1))
    m.expire(500.0)  # the daemon's clock is at 500 s
    m.on_event(ev.JobForgotten(5.0, "short"))  # carries its last message's time
    assert m.expire(529.0) == [] and m.expire(530.0) == ["short"]


def test_no_grace_removes_at_once_and_a_negative_one_is_refused() -> None:
    m = Metrics(job_series_grace_s=0)
    m.on_event(ev.JobRegistered(0.0, 1e9, "short", 0, 1, 1, "h", "/c", 0, 1))
    m.on_event(ev.JobFinished(1.0, 1e9, "short", 0, "done"))
    assert job_series(samples(m.render().decode())) == set()
    with pytest.raises(ValueError, match="job_series_grace_s must be >= 0, got -1"):
        Metrics(job_series_grace_s=-1)


# ------------------------------------------------------------------ the whole daemon


def test_the_daemon_keeps_a_goodbye_jobs_series_for_the_configured_grace(short_dir) -> None:
    cfg = config.loads(
        f'[daemon]\nsocket = "{short_dir}/a.sock"\nstate_dir = "{short_dir}/st"\n'
        '[metrics]\nlisten = "127.0.0.1:0"\nscrape_interval_s = 1.0\n'  # grace: 2 s
    )
    assert cfg.job_series_grace_s == 2.0
    svc = Service(cfg, notifier=Notifier(env={}), sampler=Sampler())
    svc.open()
    ctx = zmq.Context()
    try:
        svc.daemon.start()
        url = svc.metrics_server.url
        peer = ctx.socket(zmq.DEALER)
        peer.connect(svc.daemon.endpoint)
        peer.send(p.encode(p.Hello(v=p.VERSION, job="short", pid=0)))
        assert peer.poll(DEADLINE * 1000), "no welcome"
        peer.send(p.encode(report(5)))
        peer.send(p.encode(p.Goodbye(v=p.VERSION, job="short", rank=0, step=5, reason="done")))
        deadline = time.monotonic() + DEADLINE
        ok = ("adaptd_saves_total", (*JOB, ("result", "ok")))
        # the goodbye is handled (the job is gone) and its save counted: a scrape on a
        # loaded box (three xdist workers) once came between the two, and read 0 saves
        while time.monotonic() < deadline:
            got = scrape(url)
            if got[("adaptd_jobs_connected", ())] == 0 and job_series(got) and got.get(ok):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the goodbye or the save was not seen: {sorted(job_series(got))}")
        ended = time.monotonic()
        assert got[ok] == 1
        while time.monotonic() < deadline and job_series(got):
            time.sleep(0.1)
            got = scrape(url)
        gone = time.monotonic()
        assert not job_series(got), "the series were never removed"
        assert gone - ended >= 2.0 - 1.0  # the grace, less the tick's 1 s granularity
        assert got[("adaptd_host_saves_total", (("result", "ok"),))] == 1
        assert got[("adaptd_host_save_written_bytes_total", ())] == 4096
        peer.close(linger=0)
    finally:
        ctx.destroy(linger=0)
        svc.daemon.stop()
        svc.close()


def test_a_flood_of_short_jobs_keeps_a_bounded_number_waiting() -> None:
    """Thousands of jobs ending within one grace period: only the newest
    MAX_ENDED_JOBS keep their series, so the daemon's memory stays bounded."""
    from adaptd.metrics.exporter import MAX_ENDED_JOBS

    m = Metrics(job_series_grace_s=120.0)
    n = MAX_ENDED_JOBS + 50
    for i in range(n):
        job = f"j{i}"
        m.on_event(ev.JobRegistered(float(i), 1e9, job, 0, 1, 1, "h", "/c", 0, 1))
        m.on_event(ev.SaveReported(float(i), 1e9, job, report(1, job=job), True))
        m.on_event(ev.JobFinished(float(i), 1e9, job, 1, "done"))
    jobs = {dict(labels).get("job_id") for _, labels in samples(m.render().decode())} - {None}
    assert jobs == {f"j{i}" for i in range(50, n)}
    got = samples(m.render().decode())
    assert got[("adaptd_host_saves_total", (("result", "ok"),))] == n
