"""The fixture recorder: what it records from a library replays to the same samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nvml_fixture import FixtureNvml, load, record

from adaptd.telemetry import nvml

ROOT = Path(__file__).resolve().parents[2]


def replay(data: dict, frames: int) -> list:
    fake = FixtureNvml(data, clock=None)
    gpus = nvml.open(fake)
    out = [gpus.sample()]
    for _ in range(frames):
        fake.step()
        out.append(gpus.sample())
    return out


@pytest.mark.parametrize(
    "name", ["h100_8gpu", "h100_8gpu_xid79", "a100_8gpu_ecc", "v100_driver470"]
)
def test_a_recording_replays_like_its_source(name: str) -> None:
    source = load(name)
    frames = len(source.get("frames", []))
    assert frames >= 1
    lib = FixtureNvml(name, clock=None)  # the "real host" being recorded
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += s
        lib.step()

    recorded = record(lib, frames=frames, interval=1.0, sleep=sleep, clock=lambda: t[0])
    recorded = load(json.loads(json.dumps(recorded)))  # survives JSON, passes the format check
    assert [f["t"] for f in recorded["frames"]] == [float(i + 1) for i in range(frames)]
    for frame in recorded["frames"]:  # frames keep only what changed: never the static names
        assert not any("nvmlDeviceGetName" in d for d in frame["devices"].values())
    assert [e["eventData"] for f in recorded["frames"] for e in f["events"]] == [
        e["eventData"] for f in source.get("frames", []) for e in f.get("events", [])
    ]
    assert replay(recorded, frames) == replay(source, frames)
    assert lib.calls.count("nvmlShutdown") == 1


def test_a_host_without_a_driver_records_a_degraded_fixture() -> None:
    recorded = record(FixtureNvml("no_driver", clock=None))
    assert recorded["init"]["nvml_error"] == nvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert isinstance(nvml.open(FixtureNvml(recorded, clock=None)), nvml.NoGpus)


def test_the_script_on_this_gpu_less_machine(tmp_path: Path) -> None:
    """The real pynvml: no driver here, so the script records exactly that."""
    out = tmp_path / "host.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "record_nvml_fixture.py"),
            "--frames",
            "1",
            "--interval",
            "0.01",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    data = load(out)
    if data["init"] is None:  # pragma: no cover - a GPU host
        assert len(data["devices"]) >= 1 and len(data["frames"]) == 1
        return
    assert data["init"]["name"] == "NVML_ERROR_LIBRARY_NOT_FOUND"
    assert "NVML did not start" in r.stderr
