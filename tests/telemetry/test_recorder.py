"""The fixture recorder: what it records from a library replays to the same samples."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from nvml_fixture import FIXTURE_DIR, FixtureNvml, load, record

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


# ------------------------------------------------------------------ honest, and ready


def test_every_fixture_says_where_it_came_from() -> None:
    """A shipped fixture is a recording by the recorder on a real host, or says it is
    synthetic and what it was modelled on (the H200 ones are recordings)."""
    for path in sorted(FIXTURE_DIR.glob("*.json")):
        rec = load(path)["recorded"]
        if rec.get("synthetic") is True:
            assert rec.get("source"), path.name
        else:
            assert rec.get("by") == "scripts/record_nvml_fixture.py" and rec.get("host"), (
                f"{path.name} neither says it is synthetic nor was recorded on a host: {rec}"
            )


class RealSignatures:
    """The fake NVML, refusing any call that the real pynvml module lacks or would not
    accept with these arguments: what the recorder asks of it runs on real bindings."""

    def __init__(self, fake: FixtureNvml) -> None:
        import pynvml

        self._fake, self._real = fake, pynvml
        self.NVMLError = fake.NVMLError
        self.checked: set[str] = set()

    def __getattr__(self, fn: str):  # type: ignore[no-untyped-def]
        real = getattr(self._real, fn, None)
        assert real is not None, f"pynvml has no {fn}"
        target = getattr(self._fake, fn)

        def call(*args):  # type: ignore[no-untyped-def]
            inspect.signature(real).bind(*args)  # TypeError: not how pynvml takes it
            self.checked.add(fn)
            return target(*args)

        return call


@pytest.mark.parametrize("name", ["h100_8gpu_xid79", "v100_driver470"])
def test_the_recorder_asks_real_pynvml_only_what_it_has(name: str) -> None:
    lib = RealSignatures(FixtureNvml(name, clock=None))
    recorded = record(lib, frames=2, interval=0.0, sleep=lambda s: lib._fake.step())
    assert recorded["devices"] and recorded["frames"]
    expected = {q[0] for query in nvml.QUERIES for q in query.calls} | set(nvml.SYSTEM_CALLS)
    expected |= {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlEventSetWait"}
    assert expected <= lib.checked, expected - lib.checked


def test_real_pynvml_structs_record_and_replay_as_the_sampler_reads_them() -> None:
    """What real bindings return (ctypes structs, friendly objects) becomes JSON that
    the fake serves back with the same fields the sampler reads."""
    import pynvml
    from nvml_fixture import to_json

    util = pynvml.c_nvmlUtilization_t(gpu=97, memory=41)
    mem = pynvml.c_nvmlMemory_t(total=80 * 2**30, free=2**30, used=79 * 2**30)
    proc = pynvml.nvmlStructToFriendlyObject(
        pynvml.c_nvmlProcessInfo_v3_t(pid=4242, usedGpuMemory=2**33)
    )
    assert to_json(util) == {"gpu": 97, "memory": 41}
    assert to_json(mem) == {"total": 80 * 2**30, "free": 2**30, "used": 79 * 2**30}
    assert to_json([proc])[0]["pid"] == 4242
    data = load("h100_8gpu")
    data["devices"] = data["devices"][:1]
    data["devices"][0].update(
        {
            "nvmlDeviceGetUtilizationRates": to_json(util),
            "nvmlDeviceGetMemoryInfo": to_json(mem),
            "nvmlDeviceGetComputeRunningProcesses": to_json([proc]),
        }
    )
    data.pop("frames")
    gpu = nvml.open(FixtureNvml(data, clock=None)).sample()[0]
    assert (gpu.util_sm, gpu.mem_total_bytes, gpu.pids) == (0.97, 80 * 2**30, (4242,))


def test_the_script_records_a_replayed_fixture(tmp_path: Path) -> None:
    """The recorder script end to end, against the fake (no GPU here)."""
    out = tmp_path / "replayed.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_nvml_fixture.py"), "--replay",
         "a100_8gpu_ecc", "--frames", "4", "--interval", "0.01", "-o", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = load(out)
    assert data["recorded"]["synthetic"] is True and "a100_8gpu_ecc" in data["recorded"]["source"]
    assert len(data["devices"]) == 8 and len(data["frames"]) == 4
    assert replay(data, 4) == replay(load("a100_8gpu_ecc"), 4)
