"""Status helpers: a snapshot as JSON-safe data and as tables."""

from __future__ import annotations

import json

import msgspec
from nvml_fixture import FixtureNvml

from adaptd.core.snapshot import HostSample, Snapshot, StorageSample
from adaptd.telemetry import nvml, report


def snapshot(fixture: str = "h100_8gpu_xid79", steps: int = 2) -> Snapshot:
    fake = FixtureNvml(fixture, clock=None)
    gpus = nvml.open(fake)
    gpus.sample()
    for _ in range(steps):
        fake.step()
    return Snapshot(
        time=12.0,
        gpus=gpus.sample(),
        storage=(
            StorageSample(
                "/scratch",
                "/scratch",
                "xfs",
                "dm-0",
                2.5e9,
                1200.0,
                0.93,
                0.0031,
                ("llm-a", "llm-b"),
            ),
            StorageSample("/dev/shm", "/dev/shm", "tmpfs", None, jobs=("ram",)),
        ),
        host=HostSample(64 * 2**30, 256 * 2**30, 0.42),
    )


def test_to_dict_is_json_and_msgpack_safe_and_complete() -> None:
    snap = snapshot()
    d = report.to_dict(snap)
    assert json.loads(json.dumps(d)) == d
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(d)) == d
    assert d["gpus"][5]["xid_events"] == [79]
    assert d["storage"][0]["jobs"] == ["llm-a", "llm-b"]
    assert set(d["gpus"][0]) == {f for f in snap.gpus[0].__slots__}
    assert d["host"]["cpu_load"] == 0.42


def test_tables_show_health_throughput_and_busy() -> None:
    snap = snapshot()
    text = report.render(report.to_dict(snap), now=13.5)
    lines = text.splitlines()
    assert lines[0] == "telemetry (1.5s old)"
    assert lines[1] == "host: memory 64.0 of 256.0 GiB available, load 0.42 per core"
    gpu5 = next(ln for ln in lines if ln.startswith("5 "))
    assert "xid 79" in gpu5 and " - " in gpu5  # lost GPU: no figures
    gpu0 = next(ln for ln in lines if ln.startswith("0 "))
    assert f" {snap.gpus[0].util_sm * 100:.0f}% " in gpu0
    assert snap.gpus[0].throttle_reasons == 0x4 and " sw-power " in gpu0 and " ok " in gpu0
    scratch = next(ln for ln in lines if ln.startswith("/scratch"))
    assert scratch.split() == [
        "/scratch",
        "xfs",
        "dm-0",
        "2.5GB/s",
        "1200",
        "93%",
        "3.1ms",
        "llm-a,llm-b",
    ]
    shm = next(ln for ln in lines if ln.startswith("/dev/shm"))
    assert shm.split() == ["/dev/shm", "tmpfs", "-", "-", "-", "-", "-", "ram"]


def test_rising_ecc_shows_in_health() -> None:
    d = report.to_dict(snapshot("a100_8gpu_ecc", steps=3))
    assert report.health(d["gpus"][3]) == "xid 94,63; ecc 1 uncorr; ecc 61 corr; rows pending"
    assert report.health(d["gpus"][0]) == "ok"


def test_empty_telemetry_says_why() -> None:
    text = report.render(report.to_dict(Snapshot(time=1.0)))
    assert "host: no data" in text
    assert "gpus: none seen" in text
    assert "storage: no job" in text
    assert report.format_gpus([]) == "" and report.format_storage([]) == ""


def test_throttle_names() -> None:
    assert report.throttle_names(0x44) == "sw-power,hw-thermal"
    assert report.throttle_names(0) == ""
    assert report.throttle_names(None) == "-"
    assert report.throttle_names(0x1000) == "0x1000"
