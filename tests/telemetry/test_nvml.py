"""NVML sampling against recorded fixtures (the fake sits at nvml.py's library boundary)."""

from __future__ import annotations

import json
import logging

import pytest
from nvml_fixture import FIXTURE_DIR, FixtureError, FixtureNvml, call_key

from adaptd.core.snapshot import GpuSample
from adaptd.telemetry import nvml


def fixture(name: str) -> FixtureNvml:
    return FixtureNvml(name, clock=None)


def raw(name: str) -> dict:
    return json.loads((FIXTURE_DIR / f"{name}.json").read_text())


def test_every_field_matches_the_recorded_answers() -> None:
    data = raw("h100_8gpu")
    gpus = nvml.open(fixture("h100_8gpu")).sample()
    assert len(gpus) == 8
    for g, rec in zip(gpus, data["devices"], strict=True):
        util = rec["nvmlDeviceGetUtilizationRates"]
        mem = rec["nvmlDeviceGetMemoryInfo"]
        assert g == GpuSample(
            index=g.index,
            uuid=rec["nvmlDeviceGetUUID"],
            name="NVIDIA H100 80GB HBM3",
            util_sm=util["gpu"] / 100,
            util_mem=util["memory"] / 100,
            mem_used_bytes=mem["used"],
            mem_total_bytes=mem["total"],
            power_w=rec["nvmlDeviceGetPowerUsage"] / 1000,
            temperature_c=float(rec["nvmlDeviceGetTemperature(0)"]),
            sm_clock_mhz=rec["nvmlDeviceGetClockInfo(1)"],
            throttle_reasons=rec["nvmlDeviceGetCurrentClocksEventReasons"],
            ecc_corrected=0,
            ecc_uncorrected=0,
            retired_pages_pending=None,  # Hopper remaps rows; page retirement unsupported
            remapped_rows_pending=False,
            xid_events=(),
            pids=(48211 + g.index,),
        )
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].throttle_reasons == 0x4  # SW power cap, as recorded


def test_frames_change_the_answers_over_time() -> None:
    fake = fixture("h100_8gpu")
    gpus = nvml.open(fake)
    first = gpus.sample()
    assert fake.step()
    second = gpus.sample()
    frame = raw("h100_8gpu")["frames"][0]["devices"]["2"]
    assert second[2].power_w == frame["nvmlDeviceGetPowerUsage"] / 1000
    assert second[2].temperature_c == frame["nvmlDeviceGetTemperature(0)"]
    assert first[2].mem_total_bytes == second[2].mem_total_bytes


def test_rising_ecc_then_uncorrected_error_with_row_remap_and_xids() -> None:
    fake = fixture("a100_8gpu_ecc")
    gpus = nvml.open(fake)
    seen = []
    for _ in range(4):
        seen.append(gpus.sample()[3])
        fake.step()
    assert [g.ecc_corrected for g in seen] == [0, 12, 57, 61]
    assert [g.ecc_uncorrected for g in seen] == [0, 0, 0, 1]
    assert [g.remapped_rows_pending for g in seen] == [False, False, False, True]
    assert [g.xid_events for g in seen] == [(), (), (), (94, 63)]
    # the other GPUs stay healthy
    assert all(g.ecc_corrected == 0 for g in gpus.sample() if g.index != 3)


def test_xid79_reaches_the_sample_once_and_the_lost_gpu_keeps_its_pids(caplog) -> None:
    fake = fixture("h100_8gpu_xid79")
    gpus = nvml.open(fake)
    assert gpus.sample()[5].xid_events == ()
    fake.step()
    fake.step()  # t=2: XID 79 on GPU 5, every query on it now answers GPU_IS_LOST
    with caplog.at_level(logging.WARNING, logger="adaptd.telemetry.nvml"):
        lost = gpus.sample()
        again = gpus.sample()
    assert lost[5].xid_events == (79,)
    assert again[5].xid_events == ()  # delivered once, not repeated
    assert lost[5].util_sm is None and lost[5].power_w is None and lost[5].ecc_corrected is None
    assert lost[5].uuid  # still identified
    assert lost[5].pids == (48216,)  # the last known processes, so the event finds its job
    assert all(g.xid_events == () for g in lost if g.index != 5)
    assert lost[4].power_w is not None
    lost_lines = [r for r in caplog.records if "GPU_IS_LOST" in r.getMessage()]
    functions = {r.getMessage().split()[1] for r in lost_lines}
    assert len(lost_lines) == len(functions)  # once per function, not per sample


def test_unsupported_query_is_none_logged_once_and_not_asked_again(caplog) -> None:
    fake = fixture("h100_8gpu")
    with caplog.at_level(logging.INFO, logger="adaptd.telemetry.nvml"):
        gpus = nvml.open(fake)
        for _ in range(3):
            assert all(g.retired_pages_pending is None for g in gpus.sample())
    lines = [r for r in caplog.records if "nvmlDeviceGetRetiredPagesPendingStatus" in r.message]
    assert len(lines) == 1 and "NVML_ERROR_NOT_SUPPORTED" in lines[0].message
    # asked once per GPU, then remembered as unsupported
    assert fake.calls.count("nvmlDeviceGetRetiredPagesPendingStatus") == 8
    assert gpus.query_failures == 8


def test_old_driver_falls_back_to_the_older_functions(caplog) -> None:
    fake = fixture("v100_driver470")
    with caplog.at_level(logging.INFO, logger="adaptd.telemetry.nvml"):
        gpus = nvml.open(fake)
        samples = [gpus.sample(), gpus.sample()]
    for g in samples[1]:
        assert g.name == "Tesla V100-SXM2-32GB"
        assert g.throttle_reasons is not None  # from ClocksThrottleReasons
        assert g.pids == (48211 + g.index,)  # from the _v2 process list
        assert g.retired_pages_pending is False  # Volta retires pages...
        assert g.remapped_rows_pending is None  # ...and has no row remapper
    assert fake.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 8
    assert fake.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 16
    fallback = [r.message for r in caplog.records if "ClocksEventReasons" in r.message]
    assert len(fallback) == 1 and "using nvmlDeviceGetCurrentClocksThrottleReasons" in fallback[0]
    assert gpus.driver_version == "470.199.02"


def test_no_driver_gives_degraded_mode_with_a_hint(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="adaptd.telemetry.nvml"):
        gpus = nvml.open(fixture("no_driver"))
    assert isinstance(gpus, nvml.NoGpus) and not gpus.available
    assert gpus.sample() == ()
    assert gpus.reason.code == nvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert "lsmod" in gpus.reason.hint
    assert len(caplog.records) == 1 and "GPU telemetry disabled" in caplog.records[0].message


def test_typed_exception_at_init() -> None:
    with pytest.raises(nvml.NvmlUnavailable, match="DRIVER_NOT_LOADED"):
        nvml.Nvml(fixture("no_driver"))


def test_real_pynvml_on_this_gpu_less_machine_is_degraded_not_a_crash(caplog) -> None:
    """The real bindings, no stand-in: on a host without the driver, a hint, no GPUs."""
    with caplog.at_level(logging.WARNING, logger="adaptd.telemetry.nvml"):
        gpus = nvml.open()
    if gpus.available:  # pragma: no cover - only on a GPU host
        assert len(gpus.sample()) == gpus.count
        gpus.close()
        pytest.skip("this host has a working NVIDIA driver")
    assert gpus.reason.code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert "libnvidia-ml.so.1" in str(gpus.reason)
    assert gpus.sample() == ()
    assert any("GPU telemetry disabled" in r.message for r in caplog.records)


def test_a_gpu_that_cannot_be_opened_is_listed_without_figures_and_retried() -> None:
    data = raw("h100_8gpu")
    data["devices"][7]["nvmlDeviceGetHandleByIndex"] = {"nvml_error": 15}
    fake = FixtureNvml(data, clock=None)
    gpus = nvml.open(fake)
    first = gpus.sample()
    assert first[7] == GpuSample(index=7, uuid="", name="")
    fake.override(7, "nvmlDeviceGetHandleByIndex", None)  # the GPU comes back
    assert gpus.sample()[7].uuid == data["devices"][7]["nvmlDeviceGetUUID"]


def test_xid_events_unsupported_is_logged_and_sampling_goes_on(caplog) -> None:
    data = raw("h100_8gpu")
    for d in data["devices"]:
        d["nvmlDeviceRegisterEvents"] = {"nvml_error": 3}
    with caplog.at_level(logging.WARNING, logger="adaptd.telemetry.nvml"):
        gpus = nvml.open(FixtureNvml(data, clock=None))
        assert len(gpus.sample()) == 8
    assert sum("XID events unavailable" in r.message for r in caplog.records) == 1


def test_events_are_polled_without_blocking() -> None:
    fake = fixture("h100_8gpu")
    gpus = nvml.open(fake)
    gpus.sample()
    gpus.sample()
    waits = [c for c in fake.calls if c == "nvmlEventSetWait"]
    assert len(waits) == 2  # one poll per sample, answered TIMEOUT at once


def test_clocked_fixture_applies_frames_by_time() -> None:
    now = [100.0]
    fake = FixtureNvml("a100_8gpu_ecc", clock=lambda: now[0])
    gpus = nvml.open(fake)
    assert gpus.sample()[3].ecc_corrected == 0
    now[0] += 2.5  # frames at t=1 and t=2 are due
    assert gpus.sample()[3].ecc_corrected == 57
    assert fake.frame == 2


def test_a_call_the_fixture_does_not_answer_is_a_fixture_error() -> None:
    data = raw("h100_8gpu")
    del data["devices"][0][call_key("nvmlDeviceGetTemperature", (0,))]
    gpus = nvml.open(FixtureNvml(data, clock=None))
    with pytest.raises(FixtureError, match="nvmlDeviceGetTemperature"):
        gpus.sample()


def test_every_shipped_fixture_answers_every_query() -> None:
    """Keeps hand-made fixtures as complete as recorded ones."""
    for path in sorted(FIXTURE_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for i, dev in enumerate(data["devices"]):
            for q in nvml.QUERIES:
                for fn, args in q.calls:
                    assert call_key(fn, args) in dev, f"{path.name} GPU {i}: {fn}{args}"
        for fn in nvml.SYSTEM_CALLS if data["devices"] else ():
            assert fn in data["system"], f"{path.name}: {fn}"


def test_close_shuts_nvml_down_once() -> None:
    fake = fixture("h100_8gpu")
    gpus = nvml.open(fake)
    gpus.close()
    gpus.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake.calls.count("nvmlEventSetFree") == 1


# ------------------------------------------------- recorded on real hardware (an H200)


@pytest.mark.parametrize(
    ("name", "util", "power_w", "pids"),
    [("h200_1gpu_busy", 0.98, 690.065, (459,)), ("h200_1gpu_idle", 0.0, 131.066, ())],
)
def test_a_real_h200_recording_samples_as_the_driver_answered(
    name: str, util: float, power_w: float, pids: tuple[int, ...], caplog
) -> None:
    """Recorded by scripts/record_nvml_fixture.py on a lent H200 host (driver 580.159.04),
    busy with a PyTorch matmul loop and idle: the sampler reads real answers as such,
    including the one query Hopper does not support (page retirement)."""
    rec = raw(name)
    assert "synthetic" not in rec["recorded"] and rec["recorded"]["host"]
    dev = rec["devices"][0]
    with caplog.at_level(logging.INFO, logger="adaptd.telemetry.nvml"):
        gpus = nvml.open(fixture(name))
        (g,) = gpus.sample()
    assert g == GpuSample(
        index=0,
        uuid=dev["nvmlDeviceGetUUID"],
        name="NVIDIA H200",
        util_sm=util,
        util_mem=dev["nvmlDeviceGetUtilizationRates"]["memory"] / 100,
        mem_used_bytes=dev["nvmlDeviceGetMemoryInfo"]["used"],
        mem_total_bytes=150754820096,
        power_w=power_w,
        temperature_c=float(dev["nvmlDeviceGetTemperature(0)"]),
        sm_clock_mhz=dev["nvmlDeviceGetClockInfo(1)"],
        throttle_reasons=dev["nvmlDeviceGetCurrentClocksEventReasons"],
        ecc_corrected=0,
        ecc_uncorrected=0,
        retired_pages_pending=None,  # NVML_ERROR_NOT_SUPPORTED on Hopper: rows are remapped
        remapped_rows_pending=False,
        xid_events=(),
        pids=pids,
    )
    assert gpus.driver_version == "580.159.04"
    assert "driver 580.159.04" in caplog.text


def test_the_real_h200_recording_agrees_with_the_synthetic_hopper_fixture() -> None:
    """The synthetic H100 fixture was modelled on NVML's documentation; the real Hopper
    recording bears out its choices of which queries a Hopper GPU answers (the README's
    step 2: where they differ, the real answer wins)."""
    real, synthetic = raw("h200_1gpu_busy")["devices"][0], raw("h100_8gpu")["devices"][0]
    assert set(real) == set(synthetic)
    for key, value in real.items():
        if isinstance(value, dict) and "nvml_error" in value:
            assert synthetic[key] == value, key
    # the clock-event reason both show under load: SW power cap (bit 0x4)
    assert real["nvmlDeviceGetCurrentClocksEventReasons"] == 4
    fake = fixture("h200_1gpu_idle")
    idle = nvml.open(fake)
    assert idle.sample()[0].throttle_reasons == 0
    assert fake.step() and fake.step()  # two seconds later the idle GPU clocked down
    (g,) = idle.sample()
    assert (g.sm_clock_mhz, g.throttle_reasons) == (435, 0x1)  # reason: GPU idle
