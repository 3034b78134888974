"""Metrics: scraped over real HTTP, linted by promtool, values traced to events."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from adaptd.core.snapshot import GpuSample, HostSample, Snapshot, StorageSample
from adaptd.metrics.exporter import SAVE_BUCKETS, Metrics, MetricsError
from adaptd.state.store import DecisionRecord, FailureRecord, SaveRecord

from ._tools import run, tool

T = 1_700_000_000.0


def save(job: str, *, blocking: float = 0.02, durable: float = 2.0, ok: bool = True,
         nbytes: int = 1000, ended: float = T, tier: str = "") -> SaveRecord:  # fmt: skip
    return SaveRecord(job=job, rank=0, step=1, started=ended - durable, ended=ended,
                      blocking_s=blocking, durable_s=durable, bytes=nbytes, ok=ok,
                      tier=tier)  # fmt: skip


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Exposition text -> {(sample name, sorted labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


def busy_host() -> Metrics:
    m = Metrics(slow_save_s=1.0)
    m.on_job_started("llama", time=T - 600)
    m.on_job_started("bert", time=T - 60)
    m.on_decision(DecisionRecord("llama", T - 590, 0, 100, every_steps=100, policy="adaptive",
                                 interval_s=300.0, waste=0.021, step_time_s=3.0))  # fmt: skip
    m.on_save(save("llama", blocking=0.004, durable=12.0, nbytes=7_000_000_000, ended=T - 300))
    m.on_save(save("llama", blocking=7.5, durable=40.0, nbytes=7_000_000_000, ended=T))
    m.on_save(save("bert", ok=False))
    m.on_job_started("t5", time=T - 60)  # two tiers: a local save beside a durable one
    m.on_save(save("t5", blocking=0.003, durable=0.004, tier="local"))
    m.on_save(save("t5", blocking=0.8, durable=9.0))
    m.on_failure(FailureRecord("llama", T - 100, lost_at_step=950, resumed_step=900))
    m.on_rejected("malformed")
    m.on_rejected("malformed")
    m.on_rejected("version")
    m.set_jobs(2)
    m.set_paused("bert", True)
    m.set_state_stats(write_errors=1, dropped_rows=0)
    m.on_snapshot(
        Snapshot(
            time=5.0,
            gpus=(
                GpuSample(0, "GPU-aaaa", name="H100", util_sm=0.93, util_mem=0.41,
                          mem_used_bytes=70 * 2**30, mem_total_bytes=80 * 2**30, power_w=612.5,
                          temperature_c=71.0, ecc_corrected=12, ecc_uncorrected=0,
                          retired_pages_pending=False, remapped_rows_pending=True,
                          xid_events=(79, 79)),
                GpuSample(1, "GPU-bbbb", util_sm=None),  # unsupported figure: absent
            ),
            storage=(
                StorageSample("nfs:/ckpt", "/ckpt", fstype="nfs4", busy_fraction=0.35,
                              write_bytes_per_s=1.5e9, write_latency_s=0.004,
                              writing_jobs=("llama",)),
            ),
            host=HostSample(mem_available_bytes=500 * 2**30),
        )
    )  # fmt: skip
    return m


@pytest.fixture
def scrape() -> object:
    servers = []

    def get(m: Metrics) -> str:
        srv = m.serve("127.0.0.1", 0)
        servers.append(srv)
        with urllib.request.urlopen(srv.url, timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            return resp.read().decode()

    yield get
    for srv in servers:
        srv.stop()


def test_scraped_over_http_and_clean_under_promtool(scrape: object) -> None:
    promtool = tool("promtool")
    text = scrape(busy_host())  # type: ignore[operator]
    checked = run(promtool, "check", "metrics", input=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == ""  # no lint findings


def test_values_follow_events(scrape: object) -> None:
    text = scrape(busy_host())  # type: ignore[operator]
    v = lambda name, **kw: value(text, name, **kw)  # noqa: E731
    # histograms: one llama save fell above the 5 s bucket, one below 5 ms
    assert v("adaptd_save_blocking_seconds_count", job_id="llama", tier="durable") == 2
    assert v("adaptd_save_blocking_seconds_bucket", job_id="llama", tier="durable", le="0.005") == 1
    assert v("adaptd_save_blocking_seconds_bucket", job_id="llama", tier="durable", le="5.0") == 1
    assert v("adaptd_save_blocking_seconds_bucket", job_id="llama", tier="durable", le="10.0") == 2
    assert v("adaptd_save_blocking_seconds_sum", job_id="llama", tier="durable") == pytest.approx(
        7.504
    )
    assert v("adaptd_save_durable_seconds_sum", job_id="llama", tier="durable") == pytest.approx(
        52.0
    )
    # a failed save blocked the loop but never became durable
    assert v("adaptd_save_blocking_seconds_count", job_id="bert", tier="durable") == 1
    assert v("adaptd_save_durable_seconds_count", job_id="bert", tier="durable") == 0
    assert v("adaptd_saves_total", job_id="bert", result="failed") == 1
    assert v("adaptd_saves_total", job_id="llama", result="ok") == 2
    assert v("adaptd_save_written_bytes_total", job_id="llama") == 14e9
    assert v("adaptd_job_last_save_timestamp_seconds", job_id="llama") == T
    assert v("adaptd_job_last_save_timestamp_seconds", job_id="bert") is None
    assert v("adaptd_job_start_timestamp_seconds", job_id="bert") == T - 60
    # llama's second save blocked 7.5 s > slow_save_s, and took 40 s < 300 s planned
    assert v("adaptd_job_bad_save_streak", job_id="llama") == 1
    assert v("adaptd_job_bad_save_streak", job_id="bert") == 1
    assert v("adaptd_job_interval_seconds", job_id="llama") == 300
    assert v("adaptd_job_interval_steps", job_id="llama") == 100
    assert v("adaptd_job_predicted_waste_ratio", job_id="llama") == 0.021
    assert v("adaptd_job_step_seconds", job_id="llama") == 3.0
    assert v("adaptd_job_failures_total", job_id="llama") == 1
    assert v("adaptd_job_failures_total", job_id="bert") == 0  # created at start, at zero
    assert v("adaptd_job_paused", job_id="bert") == 1
    assert v("adaptd_decisions_total", job_id="llama") == 1
    assert v("adaptd_jobs_connected") == 2
    assert v("adaptd_rejected_messages_total", code="malformed") == 2
    assert v("adaptd_rejected_messages_total", code="version") == 1
    assert v("adaptd_build_info", version=__import__("adaptd").__version__) == 1
    # host figures from the snapshot
    g0 = {"gpu": "0", "uuid": "GPU-aaaa"}
    assert v("adaptd_gpu_utilization_ratio", **g0) == 0.93
    assert v("adaptd_gpu_utilization_ratio", gpu="1", uuid="GPU-bbbb") is None
    assert v("adaptd_gpu_memory_used_bytes", **g0) == 70 * 2**30
    assert v("adaptd_gpu_power_watts", **g0) == 612.5
    assert v("adaptd_gpu_temperature_celsius", **g0) == 71.0
    assert v("adaptd_gpu_ecc_errors_total", **g0, type="corrected") == 12
    assert v("adaptd_gpu_ecc_errors_total", **g0, type="uncorrected") == 0
    assert v("adaptd_gpu_repair_pending", **g0, kind="remapped_rows") == 1
    assert v("adaptd_gpu_xid_events_total", **g0, xid="79") == 2
    st = {"target": "nfs:/ckpt", "mountpoint": "/ckpt"}
    assert v("adaptd_storage_busy_ratio", **st) == 0.35
    assert v("adaptd_storage_write_latency_seconds", **st) == 0.004
    assert v("adaptd_storage_saves_in_flight", **st) == 1
    assert v("adaptd_host_memory_available_bytes") == 500 * 2**30
    assert v("adaptd_state_write_errors_total") == 1


def test_host_figures_follow_the_newest_snapshot_only() -> None:
    m = busy_host()
    m.on_snapshot(Snapshot(time=6.0, gpus=(GpuSample(1, "GPU-bbbb", util_sm=0.5),)))
    text = m.render().decode()
    assert value(text, "adaptd_gpu_utilization_ratio", gpu="0", uuid="GPU-aaaa") is None
    assert value(text, "adaptd_gpu_utilization_ratio", gpu="1", uuid="GPU-bbbb") == 0.5
    assert value(text, "adaptd_storage_busy_ratio", target="nfs:/ckpt", mountpoint="/ckpt") is None
    # XID counts accumulate across snapshots and stay after the GPU's figures go
    assert value(text, "adaptd_gpu_xid_events_total", gpu="0", uuid="GPU-aaaa", xid="79") == 2


# (saves as (blocking_s, durable_s, ok), planned interval_s, expected streak after each)
STREAKS = [
    ([(0.1, 2, True)] * 3, 60.0, [0, 0, 0]),
    ([(0.1, 2, False)] * 3, 60.0, [1, 2, 3]),
    ([(1.5, 2, True), (0.1, 2, False), (0.1, 90, True), (0.1, 2, True)], 60.0, [1, 2, 3, 0]),
    ([(0.1, 90, True)] * 2, None, [0, 0]),  # no plan known: durable time is not judged
    ([(1.0, 2, True)], None, [0]),  # at the threshold is not over it
]  # fmt: skip


@pytest.mark.parametrize(("events", "interval", "expected"), STREAKS)
def test_bad_save_streak(
    events: list[tuple[float, float, bool]], interval: float | None, expected: list[int]
) -> None:
    m = Metrics(slow_save_s=1.0)
    m.on_decision(DecisionRecord("j", T, 0, 10, every_steps=10, interval_s=interval))
    got = []
    for blocking, durable, ok in events:
        m.on_save(save("j", blocking=blocking, durable=durable, ok=ok))
        got.append(value(m.render().decode(), "adaptd_job_bad_save_streak", job_id="j"))
    assert got == expected


def test_unknown_plan_figures_are_absent_not_zero() -> None:
    m = Metrics()
    m.on_decision(DecisionRecord("j", T, 0, 10, every_steps=10, interval_s=None, waste=0.1,
                                 step_time_s=0.5))  # fmt: skip
    text = m.render().decode()
    assert value(text, "adaptd_job_interval_seconds", job_id="j") == 5.0  # steps x step time
    m.on_decision(DecisionRecord("j", T, 0, None))  # "waiting for a measurement"
    text = m.render().decode()
    for name in ("adaptd_job_interval_seconds", "adaptd_job_interval_steps",
                 "adaptd_job_predicted_waste_ratio", "adaptd_job_step_seconds"):  # fmt: skip
        assert value(text, name, job_id="j") is None, name
    assert value(text, "adaptd_decisions_total", job_id="j") == 2


def test_remove_job_stops_its_series() -> None:
    m = busy_host()
    m.remove_job("llama")
    m.remove_job("never-seen")  # no error
    text = m.render().decode()
    assert not [k for k in samples(text) if ("job_id", "llama") in k[1]]
    m.remove_job("t5")  # both tiers' series go
    assert not [k for k in samples(m.render().decode()) if ("job_id", "t5") in k[1]]
    assert value(text, "adaptd_saves_total", job_id="bert", result="failed") == 1


def test_server_binds_port_zero_stops_cleanly_and_reports_a_busy_port() -> None:
    m = busy_host()
    srv = m.serve("127.0.0.1", 0)
    port = srv.port
    assert port > 0 and srv.url == f"http://127.0.0.1:{port}/metrics"
    with pytest.raises(MetricsError, match=rf"metrics.listen 127.0.0.1:{port}: cannot listen"):
        Metrics().serve("127.0.0.1", port)
    srv.stop()
    srv.stop()  # twice is fine
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    # the port is free again
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_the_endpoint_stops_at_once_so_the_daemon_exits_at_once() -> None:
    """Stopping waited for the server's 0.5 s poll: an idle daemon took that long and
    more to exit after SIGTERM. Five start/stop cycles: 2.5 s of waits at worst before,
    about 0.25 s now."""
    import time

    m = Metrics()
    total = 0.0
    for host in ("127.0.0.1", "::1", "127.0.0.1", "::1", "127.0.0.1"):
        server = m.serve(host, 0)
        with urllib.request.urlopen(server.url, timeout=5) as r:
            assert b"adaptd_build_info" in r.read()
        t0 = time.perf_counter()
        server.stop()
        total += time.perf_counter() - t0
    assert total < 0.6, total


def test_buckets_span_one_millisecond_to_ten_minutes() -> None:
    assert SAVE_BUCKETS[0] == 0.001 and SAVE_BUCKETS[-1] == 600.0
    assert list(SAVE_BUCKETS) == sorted(SAVE_BUCKETS)
    assert 5.0 in SAVE_BUCKETS  # the alert threshold is a bucket boundary
    # no decade without at least two boundaries
    for lo in (0.001, 0.01, 0.1, 1.0, 10.0, 100.0):
        assert sum(lo <= b < lo * 10 for b in SAVE_BUCKETS) >= 2, lo


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.set_jobs(3)
    assert value(b.render().decode(), "adaptd_jobs_connected") == 0
    with pytest.raises(ValueError, match="slow_save_s"):
        Metrics(slow_save_s=0)


def test_a_two_tier_plan_shows_its_durable_cadence() -> None:
    from adaptd import events
    from adaptd.core.snapshot import Decision

    m = Metrics()
    two = Decision(next_step=10, every_steps=10, durable_every=4, reason="two tiers")
    m.on_event(events.PlanChanged(1.0, T, "j", 1, 0, two, 1, step_time_s=0.5))
    assert value(m.render().decode(), "adaptd_job_durable_every", job_id="j") == 4
    one = Decision(next_step=10, every_steps=10, reason="one tier")
    m.on_event(events.PlanChanged(2.0, T, "j", 2, 0, one, 1, step_time_s=0.5))
    assert value(m.render().decode(), "adaptd_job_durable_every", job_id="j") is None


def test_save_times_are_apart_by_tier(scrape: object) -> None:
    """A two-tier job's local saves and durable saves fill separate histograms (the
    tier label), so their costs are seen apart; a one-tier job has durable ones only."""
    text = scrape(busy_host())  # type: ignore[operator]
    v = lambda name, tier, **kw: value(text, name, job_id="t5", tier=tier, **kw)  # noqa: E731
    assert v("adaptd_save_blocking_seconds_count", "local") == 1
    assert v("adaptd_save_blocking_seconds_sum", "local") == pytest.approx(0.003)
    assert v("adaptd_save_durable_seconds_sum", "local") == pytest.approx(0.004)
    assert v("adaptd_save_blocking_seconds_count", "durable") == 1
    assert v("adaptd_save_blocking_seconds_sum", "durable") == pytest.approx(0.8)
    assert v("adaptd_save_durable_seconds_bucket", "durable", le="5.0") == 0
    assert v("adaptd_save_durable_seconds_bucket", "durable", le="10.0") == 1
    assert value(text, "adaptd_save_blocking_seconds_count", job_id="llama", tier="local") is None


def test_a_two_tier_plan_creates_the_local_series_at_zero() -> None:
    """The local tier's histograms exist from the two-tier plan on, so ``increase()``
    sees the first local save; a one-tier job starts with the durable ones only."""
    from adaptd import events
    from adaptd.core.snapshot import Decision

    m = Metrics()
    m.on_job_started("j", time=T)
    count = lambda tier: value(  # noqa: E731
        m.render().decode(), "adaptd_save_blocking_seconds_count", job_id="j", tier=tier
    )
    assert (count("durable"), count("local")) == (0, None)
    two = Decision(next_step=10, every_steps=10, durable_every=4, reason="two tiers")
    m.on_event(events.PlanChanged(1.0, T, "j", 1, 0, two, 1, step_time_s=0.5))
    assert (count("durable"), count("local")) == (0, 0)
