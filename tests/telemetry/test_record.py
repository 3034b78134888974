"""The fixture recorder: what it records from a library, the fake replays identically."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from adaptd.telemetry import nvml
from adaptd.telemetry.nvml_fixture import FixtureNvml, record

ROOT = Path(__file__).resolve().parents[2]


def test_recording_the_fake_round_trips_every_answer_and_event() -> None:
    """Record from a fixture-backed library, replay the recording: same samples."""
    source = FixtureNvml("a100_8gpu_ecc", clock=None)
    now = [0.0]

    def sleep(dt: float) -> None:  # the recorder's pause between frames drives the source
        now[0] += dt
        source.step()

    recorded = record(source, frames=3, interval=1.0, sleep=sleep, clock=lambda: now[0])
    assert recorded["init"] is None and len(recorded["devices"]) == 8
    assert [f["t"] for f in recorded["frames"]] == [1.0, 2.0, 3.0]
    assert recorded["frames"][2]["events"][0]["eventData"] == 94
    # only changed answers are kept in frames
    assert "nvmlDeviceGetName" not in recorded["frames"][0]["devices"].get("3", {})

    original = FixtureNvml("a100_8gpu_ecc", clock=None)
    replay = FixtureNvml(json.loads(json.dumps(recorded)), clock=None)
    a, b = nvml.open(original), nvml.open(replay)
    for _ in range(4):
        assert a.sample() == b.sample()
        original.step()
        replay.step()


def test_recording_a_host_without_nvml_records_the_init_error() -> None:
    data = record(FixtureNvml("no_driver", clock=None))
    assert data["init"]["nvml_error"] == nvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert isinstance(nvml.open(FixtureNvml(data, clock=None)), nvml.NoGpus)


def test_recorder_script_on_this_gpu_less_host_writes_a_degraded_fixture(tmp_path) -> None:
    """The real script with the real pynvml: no driver here, so it records that."""
    out = tmp_path / "here.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_nvml_fixture.py"), "--frames", "0",
         "-o", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    if data["init"] is None:  # pragma: no cover - a GPU host
        assert data["devices"]
        return
    assert data["init"]["nvml_error"] == nvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert "NVML did not start" in proc.stderr
    assert isinstance(nvml.open(FixtureNvml(data, clock=None)), nvml.NoGpus)
