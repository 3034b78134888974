"""GPU utilisation and health from NVML: the only module that imports ``pynvml``.

The NVML library object is injected: by default the real ``pynvml`` module (from
nvidia-ml-py); the tests and benchmarks pass ``FixtureNvml`` (``tests/nvml_fixture.py``,
kept out of the runtime package), which replays a fixture (synthetic today, see
``tests/fixtures/nvml/README.md``).
Anything with the same function names, an ``NVMLError`` class carrying the error
code in ``.value`` and NVML's integer codes will do.

Two tiers of failure, as in nvitop's ``libnvml``:

* **No library, no driver, no permission** -> :class:`NvmlUnavailable` from
  :class:`Nvml`; :func:`open` catches it once and returns a :class:`NoGpus` that
  reports no GPUs, after logging the reason once with a hint. The daemon keeps
  running; GPU fields are simply absent from the snapshot.
* **One query unsupported or failing** (``NVML_ERROR_NOT_SUPPORTED``, an old
  driver without the function, a lost GPU) -> ``None`` for that field, logged
  once per function and error. Queries that can never succeed on a device are
  not asked again.

XID events come from an NVML event set polled without blocking
(``nvmlEventSetWait`` with timeout 0) at every sample.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from adaptd.core.snapshot import GpuSample
from adaptd.telemetry.once import OnceLog

__all__ = [
    "ERROR_NAMES",
    "EVENT_TYPE_XID_CRITICAL_ERROR",
    "MAX_EVENTS_PER_SAMPLE",
    "NVML_CLOCK_SM",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_TIMEOUT",
    "NVML_ERROR_UNKNOWN",
    "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_TEMPERATURE_GPU",
    "NVML_VOLATILE_ECC",
    "PERMANENT_ERRORS",
    "QUERIES",
    "STATIC_FIELDS",
    "SYSTEM_CALLS",
    "NoGpus",
    "Nvml",
    "NvmlLibrary",
    "NvmlUnavailable",
    "Query",
    "error_name",
    "load_library",
    "open",
]

log = logging.getLogger(__name__)

# NVML's error codes and constants (nvml.h); stable across driver versions.
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

#: Errors that mean "this device will never answer this query": do not ask again.
PERMANENT_ERRORS = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})

#: Most events drained per sample, so an XID storm cannot stall the sampler.
MAX_EVENTS_PER_SAMPLE = 64

#: NVML_ERROR_* names by code, for log lines and fixtures.
ERROR_NAMES = {
    1: "NVML_ERROR_UNINITIALIZED",
    2: "NVML_ERROR_INVALID_ARGUMENT",
    3: "NVML_ERROR_NOT_SUPPORTED",
    4: "NVML_ERROR_NO_PERMISSION",
    6: "NVML_ERROR_NOT_FOUND",
    9: "NVML_ERROR_DRIVER_NOT_LOADED",
    10: "NVML_ERROR_TIMEOUT",
    12: "NVML_ERROR_LIBRARY_NOT_FOUND",
    13: "NVML_ERROR_FUNCTION_NOT_FOUND",
    14: "NVML_ERROR_CORRUPTED_INFOROM",
    15: "NVML_ERROR_GPU_IS_LOST",
    16: "NVML_ERROR_RESET_REQUIRED",
    17: "NVML_ERROR_OPERATING_SYSTEM",
    18: "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    999: "NVML_ERROR_UNKNOWN",
}

_INIT_HINTS = {
    NVML_ERROR_LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 was not found: this host has no NVIDIA driver installed, or the "
        "daemon runs in a container without the driver libraries (use the NVIDIA container "
        "toolkit, or set LD_LIBRARY_PATH to the driver's lib directory)"
    ),
    NVML_ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded (check `nvidia-smi` and `lsmod | grep nvidia`)"
    ),
    NVML_ERROR_NO_PERMISSION: (
        "no permission to open /dev/nvidia*: run the daemon as a user in the group that owns "
        "the device nodes (often `video`)"
    ),
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVML library and the loaded kernel driver differ in version (a driver update "
        "without a reboot): reboot or reload the nvidia modules"
    ),
}


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"NVML error {code}")


# ---------------------------------------------------------------------------- queries


@dataclass(frozen=True)
class Query:
    """One per-device NVML query: alternatives tried in order.

    An alternative that the driver lacks (``NVML_ERROR_FUNCTION_NOT_FOUND``) is
    dropped for good and the next one is used: ``nvmlDeviceGetCurrentClocksEventReasons``
    only exists from driver 535, ``..._v3`` process lists from 510.
    """

    field: str
    calls: tuple[tuple[str, tuple[int, ...]], ...]


#: Every per-device query the sampler makes. The fixture recorder records exactly
#: these calls, so a recorded fixture answers everything the sampler asks.
QUERIES: tuple[Query, ...] = (
    Query("name", (("nvmlDeviceGetName", ()),)),
    Query("uuid", (("nvmlDeviceGetUUID", ()),)),
    Query("utilization", (("nvmlDeviceGetUtilizationRates", ()),)),
    Query("memory", (("nvmlDeviceGetMemoryInfo", ()),)),
    Query("power", (("nvmlDeviceGetPowerUsage", ()),)),
    Query("temperature", (("nvmlDeviceGetTemperature", (NVML_TEMPERATURE_GPU,)),)),
    Query("sm_clock", (("nvmlDeviceGetClockInfo", (NVML_CLOCK_SM,)),)),
    Query(
        "throttle",
        (
            ("nvmlDeviceGetCurrentClocksEventReasons", ()),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
        ),
    ),
    Query(
        "ecc_corrected",
        (("nvmlDeviceGetTotalEccErrors", (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC)),),
    ),
    Query(
        "ecc_uncorrected",
        (
            (
                "nvmlDeviceGetTotalEccErrors",
                (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
            ),
        ),
    ),
    Query("retired_pending", (("nvmlDeviceGetRetiredPagesPendingStatus", ()),)),
    Query("remapped_rows", (("nvmlDeviceGetRemappedRows", ()),)),
    Query(
        "processes",
        (
            ("nvmlDeviceGetComputeRunningProcesses", ()),
            ("nvmlDeviceGetComputeRunningProcesses_v2", ()),
        ),
    ),
)

#: Device-independent calls made once at start (and recorded by the recorder).
SYSTEM_CALLS: tuple[str, ...] = ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion")
#: Per-device calls made once at start (not per sample).
STATIC_FIELDS = frozenset({"name", "uuid"})


class NvmlLibrary(Protocol):
    """What :class:`Nvml` needs of a library: pynvml's names (looked up by name)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host; ``hint`` says what would fix it."""

    def __init__(self, reason: str, hint: str = "", code: int | None = None) -> None:
        super().__init__(f"{reason}: {hint}" if hint else reason)
        self.reason = reason
        self.hint = hint
        self.code = code


def load_library() -> Any:
    """The real NVML bindings (``pynvml`` from nvidia-ml-py).

    Raises :class:`NvmlUnavailable` when the package is not installed.
    """
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            "the NVML bindings are not installed",
            "pip install nvidia-ml-py (it provides the pynvml module)",
        ) from exc
    return pynvml


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle (ctypes pointers compare by address)."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


class Nvml:
    """A live NVML session: enumerates GPUs once, samples them on demand.

    Raises :class:`NvmlUnavailable` when NVML cannot be initialised (no library,
    no driver, no permission, version mismatch).
    """

    available = True

    def __init__(self, lib: Any | None = None) -> None:
        self.lib = lib if lib is not None else load_library()
        self._error_type: type[Exception] = self.lib.NVMLError
        self.once = OnceLog(log)
        try:
            self.lib.nvmlInit()
        except self._error_type as exc:
            code = self._code(exc)
            raise NvmlUnavailable(
                f"NVML could not be initialised ({error_name(code)})",
                _INIT_HINTS.get(code, "check `nvidia-smi` on this host"),
                code,
            ) from exc
        except OSError as exc:  # a broken libnvidia-ml that fails to load
            raise NvmlUnavailable(f"NVML could not be loaded ({exc})", _INIT_HINTS[12]) from exc
        self.system: dict[str, str | None] = {}
        for fn in SYSTEM_CALLS:
            self.system[fn] = self._text_or_none(fn)
        try:
            self.count = int(self.lib.nvmlDeviceGetCount())
        except self._error_type as exc:
            self.close()
            raise NvmlUnavailable(
                f"NVML could not count the GPUs ({error_name(self._code(exc))})",
                "check `nvidia-smi -L` on this host",
                self._code(exc),
            ) from exc
        self._handles: list[Any | None] = [None] * self.count
        self._static: list[dict[str, str]] = [{} for _ in range(self.count)]
        self._by_handle: dict[Any, int] = {}
        self._by_uuid: dict[str, int] = {}
        # (index, field) -> the alternative call that works; absent -> try all
        self._chosen: dict[tuple[int, str], tuple[str, tuple[int, ...]] | None] = {}
        # (index, function, args) that can never answer on this device
        self._dead: set[tuple[int, str, tuple[int, ...]]] = set()
        self._events: Any | None = None
        self._last_pids: list[tuple[int, ...]] = [() for _ in range(self.count)]
        self._closed = False
        self._open_event_set()
        for i in range(self.count):
            self._handle(i)
        log.info("NVML: %d GPU(s), driver %s", self.count, self.system.get(SYSTEM_CALLS[0]) or "?")

    # ---------------------------------------------------------------- plumbing

    @staticmethod
    def _code(exc: BaseException) -> int:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else NVML_ERROR_UNKNOWN

    def _text_or_none(self, fn: str) -> str | None:
        try:
            return _text(getattr(self.lib, fn)())
        except (self._error_type, AttributeError):
            return None

    def _handle(self, index: int) -> Any | None:
        """The handle of GPU ``index``; retried each sample while it fails."""
        handle = self._handles[index]
        if handle is not None:
            return handle
        try:
            handle = self.lib.nvmlDeviceGetHandleByIndex(index)
        except self._error_type as exc:
            code = self._code(exc)
            self.once(
                ("handle", index, code),
                logging.WARNING,
                "NVML: GPU %d cannot be opened (%s); it is reported without figures",
                index,
                error_name(code),
            )
            return None
        self._handles[index] = handle
        self._by_handle[_handle_key(handle)] = index
        for field in STATIC_FIELDS:
            value = self._query(index, handle, field)
            if value is not None:
                self._static[index][field] = _text(value)
        if uuid := self._static[index].get("uuid"):
            self._by_uuid[uuid] = index
        if self._events is not None:
            self._register_events(index, handle)
        return handle

    def _open_event_set(self) -> None:
        try:
            self._events = self.lib.nvmlEventSetCreate()
        except (self._error_type, AttributeError) as exc:
            self._events = None
            self.once(
                "eventset",
                logging.WARNING,
                "NVML: no event set (%s); XID events will not be seen",
                error_name(self._code(exc)) if isinstance(exc, self._error_type) else exc,
            )

    def _register_events(self, index: int, handle: Any) -> None:
        try:
            supported = int(self.lib.nvmlDeviceGetSupportedEventTypes(handle))
            wanted = supported & EVENT_TYPE_XID_CRITICAL_ERROR
            if not wanted:
                raise self._error_type(NVML_ERROR_NOT_SUPPORTED)
            self.lib.nvmlDeviceRegisterEvents(handle, wanted, self._events)
        except self._error_type as exc:
            self.once(
                ("events", self._code(exc)),
                logging.WARNING,
                "NVML: XID events unavailable on GPU %d (%s); logged once for all GPUs",
                index,
                error_name(self._code(exc)),
            )

    def _query(self, index: int, handle: Any, field: str) -> Any | None:
        """Answer one :data:`QUERIES` field, ``None`` when NVML cannot."""
        query = _QUERY_BY_FIELD[field]
        chosen = self._chosen.get((index, field))
        calls = (chosen,) if chosen is not None else query.calls
        for n, (fn, args) in enumerate(calls):
            if (index, fn, args) in self._dead:
                continue
            fallback = calls[n + 1][0] if n + 1 < len(calls) else None
            try:
                value = getattr(self.lib, fn)(handle, *args)
            except self._error_type as exc:
                code = self._code(exc)
                if code in PERMANENT_ERRORS:
                    self._dead.add((index, fn, args))
                older = code == NVML_ERROR_FUNCTION_NOT_FOUND and fallback is not None
                self.once(
                    (fn, code),
                    logging.INFO if code in PERMANENT_ERRORS else logging.WARNING,
                    "NVML: %s failed with %s on GPU %d (logged once per function and error); %s",
                    fn,
                    error_name(code),
                    index,
                    f"using {fallback} instead" if older else f"{field} is reported as unknown",
                )
                if older:
                    continue  # an older driver: try the older function
                return None
            except AttributeError:  # the bindings lack the function altogether
                self._dead.add((index, fn, args))
                continue
            self._chosen[(index, field)] = (fn, args)
            return value
        return None

    # ---------------------------------------------------------------- sampling

    def poll_events(self) -> dict[int, list[int]]:
        """XID codes per GPU index since the last poll; never blocks."""
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                data = self.lib.nvmlEventSetWait(self._events, 0)
            except self._error_type as exc:
                code = self._code(exc)
                if code != NVML_ERROR_TIMEOUT:
                    self.once(
                        ("eventwait", code),
                        logging.WARNING,
                        "NVML: polling events failed (%s)",
                        error_name(code),
                    )
                break
            if not int(data.eventType) & EVENT_TYPE_XID_CRITICAL_ERROR:
                continue
            index = self._by_handle.get(_handle_key(data.device))
            if index is None:
                try:
                    index = self._by_uuid.get(_text(self.lib.nvmlDeviceGetUUID(data.device)))
                except self._error_type:
                    index = None
            if index is None:
                self.once(
                    "event-unknown-gpu",
                    logging.WARNING,
                    "NVML: XID %d on a GPU that cannot be identified",
                    int(data.eventData),
                )
                continue
            out.setdefault(index, []).append(int(data.eventData))
        return out

    def sample(self) -> tuple[GpuSample, ...]:
        """One :class:`GpuSample` per GPU, in index order."""
        xids = self.poll_events()
        out = []
        for i in range(self.count):
            handle = self._handle(i)
            static = self._static[i]
            base = {"index": i, "uuid": static.get("uuid", ""), "name": static.get("name", "")}
            if handle is None:
                out.append(GpuSample(**base, xid_events=tuple(xids.get(i, ()))))
                continue
            q: Callable[[str], Any] = lambda f, i=i, h=handle: self._query(i, h, f)  # noqa: E731
            util = q("utilization")
            mem = q("memory")
            power = q("power")
            temp = q("temperature")
            clock = q("sm_clock")
            throttle = q("throttle")
            corr = q("ecc_corrected")
            unc = q("ecc_uncorrected")
            retired = q("retired_pending")
            remapped = q("remapped_rows")
            procs = q("processes")
            out.append(
                GpuSample(
                    **base,
                    util_sm=None if util is None else int(util.gpu) / 100.0,
                    util_mem=None if util is None else int(util.memory) / 100.0,
                    mem_used_bytes=None if mem is None else int(mem.used),
                    mem_total_bytes=None if mem is None else int(mem.total),
                    power_w=None if power is None else int(power) / 1000.0,
                    temperature_c=None if temp is None else float(temp),
                    sm_clock_mhz=None if clock is None else int(clock),
                    throttle_reasons=None if throttle is None else int(throttle),
                    ecc_corrected=None if corr is None else int(corr),
                    ecc_uncorrected=None if unc is None else int(unc),
                    retired_pages_pending=None if retired is None else bool(int(retired)),
                    remapped_rows_pending=None if remapped is None else bool(int(remapped[2])),
                    xid_events=tuple(xids.get(i, ())),
                    pids=self._pids(i, procs),
                )
            )
        return tuple(out)

    def _pids(self, index: int, procs: Any | None) -> tuple[int, ...]:
        """Compute pids on the GPU; the last known ones when NVML cannot say.

        A GPU that just fell off the bus (XID 79) answers nothing more, yet the
        event must still reach the jobs that were running on it.
        """
        if procs is not None:
            self._last_pids[index] = tuple(sorted({int(p.pid) for p in procs}))
        return self._last_pids[index]

    def close(self) -> None:
        """Free the event set and shut NVML down; safe to call twice."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            if getattr(self, "_events", None) is not None:
                self.lib.nvmlEventSetFree(self._events)
            self.lib.nvmlShutdown()
        except self._error_type as exc:
            log.debug("NVML shutdown: %s", exc)

    @property
    def driver_version(self) -> str | None:
        return self.system.get(SYSTEM_CALLS[0])

    @property
    def query_failures(self) -> int:
        """Failed queries since start (each is also logged once per function)."""
        return self.once.total


_QUERY_BY_FIELD = {q.field: q for q in QUERIES}


class NoGpus:
    """Degraded mode: NVML is unusable here, so the snapshot carries no GPUs."""

    available = False
    count = 0
    driver_version = None
    query_failures = 0

    def __init__(self, reason: NvmlUnavailable) -> None:
        self.reason = reason

    def sample(self) -> tuple[GpuSample, ...]:
        return ()

    def close(self) -> None:
        return None


def open(lib: Any | None = None) -> Nvml | NoGpus:
    """Start GPU sampling; never raises for a missing GPU stack.

    Returns an :class:`Nvml` session, or a :class:`NoGpus` after logging, once,
    why NVML is unusable and what would fix it.
    """
    try:
        return Nvml(lib)
    except NvmlUnavailable as exc:
        log.warning("GPU telemetry disabled: %s", exc)
        return NoGpus(exc)
