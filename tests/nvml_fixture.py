"""A fake NVML library that replays a fixture of NVML answers, for the tests and benchmarks.

It lives with the tests, not in the runtime package: the daemon and ``adaptd demo``
use the real :mod:`adaptd.telemetry.nvml` (degraded to "no GPUs" where there is no
driver). Import it as ``nvml_fixture`` (pytest puts ``tests/`` on ``sys.path``);
scripts and benchmarks add ``tests/`` to ``sys.path`` first.

:class:`FixtureNvml` stands in for the ``pynvml`` module at the one boundary
where :mod:`adaptd.telemetry.nvml` takes its library. It answers every NVML call
from a fixture: JSON of NVML answers per function per device, errors included as
NVML error codes, optionally changing over time (frames), so an ECC count can rise
and an XID 79 can arrive. ``scripts/record_nvml_fixture.py`` records the format from
a real GPU host; the fixtures shipped in ``tests/fixtures/nvml/`` are synthetic
(modelled on NVML's documentation, and marked so), as no GPU host was available.

Format (``"format": "adaptd-nvml-fixture/1"``)::

    {
      "format": "adaptd-nvml-fixture/1",
      "recorded": {"by": "...", "host": "...", ...},        # provenance, free-form
      "init": null,                                         # or {"nvml_error": 9}
      "system": {"nvmlSystemGetDriverVersion": "550.54.15", ...},
      "devices": [                                          # answers at t = 0
        {"nvmlDeviceGetUUID": "GPU-...", "nvmlDeviceGetPowerUsage": 612345,
         "nvmlDeviceGetTemperature(0)": 61,
         "nvmlDeviceGetUtilizationRates": {"gpu": 98, "memory": 43},
         "nvmlDeviceGetRetiredPagesPendingStatus": {"nvml_error": 3}, ...},
        ...
      ],
      "frames": [                                           # later changes, cumulative
        {"t": 2.0, "devices": {"3": {"nvmlDeviceGetTotalEccErrors(0,0)": 7}},
         "events": [{"device": 5, "eventType": 8, "eventData": 79}]}
      ]
    }

A call is keyed by its function name, with its non-handle arguments in
parentheses when it has any (:func:`call_key`). A struct answer is an object
(read back by attribute, as pynvml's structs are), a list stays a list, an error
is ``{"nvml_error": CODE}``.

Frames apply when the fake's clock passes their ``t`` (seconds since
``nvmlInit``), or one by one with :meth:`FixtureNvml.step` when the fake has no
clock (``clock=None``), which is what deterministic tests use.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FORMAT = "adaptd-nvml-fixture/1"
CALLS_KEPT = 100_000
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_UNINITIALIZED = 1

#: The fixtures shipped with the tests (also used by the benchmarks).
FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures" / "nvml"


class FixtureError(LookupError):
    """The fixture does not answer a call the caller made: extend the fixture."""


def call_key(fn: str, args: tuple[Any, ...] = ()) -> str:
    """The fixture key of a call: ``fn`` or ``fn(a,b)``."""
    return f"{fn}({','.join(str(a) for a in args)})" if args else fn


def to_json(value: Any) -> Any:
    """An NVML answer (ctypes struct, friendly object, bytes, list) as plain JSON."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:  # a ctypes Structure
        return {name: to_json(getattr(value, name)) for name, *_ in fields}
    if hasattr(value, "__dict__"):  # pynvml's nvmlFriendlyObject
        return {k: to_json(v) for k, v in vars(value).items() if not k.startswith("_")}
    if hasattr(value, "value"):  # a ctypes scalar
        return to_json(value.value)
    raise TypeError(f"cannot record NVML answer of type {type(value).__name__}: {value!r}")


def error_json(code: int, name: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"nvml_error": int(code)}
    if name:
        out["name"] = name
    return out


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _from_json(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def load(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Read a fixture (a path, a name under :data:`FIXTURE_DIR`, or a dict) and check it.

    Raises :class:`ValueError` naming the file and what is wrong.
    """
    if isinstance(source, Mapping):
        data, where = dict(source), "<dict>"
    else:
        path = Path(source)
        if not path.exists() and (FIXTURE_DIR / f"{path.name}.json").exists():
            path = FIXTURE_DIR / f"{path.name}.json"
        where = str(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"NVML fixture {where}: cannot read it: {exc}") from exc
    if data.get("format") != FORMAT:
        raise ValueError(
            f"NVML fixture {where}: format is {data.get('format')!r}, expected {FORMAT!r}"
        )
    if not isinstance(data.get("devices"), list):
        raise ValueError(f"NVML fixture {where}: 'devices' must be a list of answer maps")
    return data


class FixtureNvml:
    """A hand-written stand-in for the ``pynvml`` module, replaying a fixture.

    Pass it where :mod:`adaptd.telemetry.nvml` takes its library:
    ``nvml.open(FixtureNvml("h100_8gpu"))``.
    """

    def __init__(
        self,
        fixture: str | os.PathLike[str] | Mapping[str, Any],
        *,
        clock: Callable[[], float] | None = time.monotonic,
    ) -> None:
        self.fixture = load(fixture)
        self.clock = clock
        # calls made, newest last, for tests that check what was asked (bounded: a
        # benchmark or demo may run the fake for hours)
        self.calls: deque[str] = deque(maxlen=CALLS_KEPT)
        self._answers = [dict(d) for d in self.fixture["devices"]]
        self._frames = deque(sorted(self.fixture.get("frames", []), key=lambda f: f["t"]))
        self._handles = [_Handle(i) for i in range(len(self._answers))]
        self._pending: deque[SimpleNamespace] = deque()
        self._registered: dict[int, int] = {}  # device index -> event mask
        self._t0: float | None = None
        self._initialised = False
        self.frame = 0  # frames applied so far

    # fake-only controls ------------------------------------------------------

    def step(self) -> bool:
        """Apply the next frame now; False when none is left."""
        if not self._frames:
            return False
        self._apply(self._frames.popleft())
        return True

    def override(self, index: int, key: str, answer: Any) -> None:
        """Replace one recorded answer (e.g. put live pids in a process list)."""
        self._answers[index][key] = answer

    # the NVML API ------------------------------------------------------------

    class NVMLError(Exception):
        """Like ``pynvml.NVMLError``: the NVML return code is in ``.value``."""

        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            from adaptd.telemetry.nvml import error_name

            return error_name(self.value)

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        answer = self.fixture.get("init")
        if isinstance(answer, dict) and "nvml_error" in answer:
            raise self.NVMLError(int(answer["nvml_error"]))
        self._initialised = True
        self._t0 = self.clock() if self.clock is not None else None

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._check()
        self._initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._tick("nvmlDeviceGetCount")
        return len(self._answers)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._tick("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._answers):
            raise self.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._value(self._answers[index].get("nvmlDeviceGetHandleByIndex"))
        return self._handles[index]

    def nvmlEventSetCreate(self) -> object:
        self._tick("nvmlEventSetCreate")
        self._value(self.fixture.get("system", {}).get("nvmlEventSetCreate"))
        return self

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._tick("nvmlEventSetFree")

    def nvmlDeviceRegisterEvents(self, handle: _Handle, mask: int, event_set: object) -> None:
        self._tick("nvmlDeviceRegisterEvents")
        self._value(self._answers[handle.index].get("nvmlDeviceRegisterEvents"))
        self._registered[handle.index] = self._registered.get(handle.index, 0) | int(mask)

    def nvmlEventSetWait(self, event_set: object, timeoutms: int) -> SimpleNamespace:
        """Deliver a pending event, else NVML_ERROR_TIMEOUT at once (never blocks)."""
        self._tick("nvmlEventSetWait")
        while self._pending:
            event = self._pending.popleft()
            if self._registered.get(event.device.index, 0) & event.eventType:
                return event
        raise self.NVMLError(NVML_ERROR_TIMEOUT)

    nvmlEventSetWait_v2 = nvmlEventSetWait

    def __getattr__(self, fn: str) -> Callable[..., Any]:
        if not fn.startswith("nvml"):
            raise AttributeError(fn)
        if fn.startswith("nvmlSystem"):
            return lambda: self._system(fn)
        return lambda handle, *args: self._device(fn, handle, args)

    # internals ---------------------------------------------------------------

    def _check(self) -> None:
        if not self._initialised:
            raise self.NVMLError(NVML_ERROR_UNINITIALIZED)

    def _tick(self, fn: str) -> None:
        self.calls.append(fn)
        self._check()
        if self.clock is None or self._t0 is None:
            return
        elapsed = self.clock() - self._t0
        while self._frames and self._frames[0]["t"] <= elapsed:
            self._apply(self._frames.popleft())

    def _apply(self, frame: Mapping[str, Any]) -> None:
        self.frame += 1
        for index, answers in frame.get("devices", {}).items():
            self._answers[int(index)].update(answers)
        for ev in frame.get("events", []):
            self._pending.append(
                SimpleNamespace(
                    device=self._handles[int(ev["device"])],
                    eventType=int(ev["eventType"]),
                    eventData=int(ev["eventData"]),
                    gpuInstanceId=int(ev.get("gpuInstanceId", 0xFFFFFFFF)),
                    computeInstanceId=int(ev.get("computeInstanceId", 0xFFFFFFFF)),
                )
            )

    def _value(self, answer: Any) -> Any:
        if isinstance(answer, dict) and "nvml_error" in answer:
            raise self.NVMLError(int(answer["nvml_error"]))
        return _from_json(answer)

    def _system(self, fn: str) -> Any:
        self._tick(fn)
        system = self.fixture.get("system", {})
        if fn not in system:
            raise FixtureError(f"the NVML fixture has no answer for {fn}")
        return self._value(system[fn])

    def _device(self, fn: str, handle: _Handle, args: tuple[Any, ...]) -> Any:
        key = call_key(fn, args)
        self._tick(key)
        answers = self._answers[handle.index]
        if key not in answers:
            raise FixtureError(f"the NVML fixture has no answer for {key} on GPU {handle.index}")
        return self._value(answers[key])


class _Handle:
    """An opaque device handle, like pynvml's ``c_nvmlDevice_t``."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fixture GPU {self.index}>"


# ---------------------------------------------------------------------------- recording

#: Calls the recorder makes per device besides :data:`adaptd.telemetry.nvml.QUERIES`.
EVENT_CALLS = ("nvmlDeviceGetSupportedEventTypes",)


def record(
    lib: Any,
    *,
    frames: int = 0,
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    note: str = "",
) -> dict[str, Any]:
    """Record a fixture from an NVML library (the real ``pynvml`` on a GPU host).

    Asks every call the sampler makes (:data:`adaptd.telemetry.nvml.QUERIES`),
    errors included, then ``frames`` more times ``interval`` apart, keeping only
    the answers that changed, with the XID events that arrived meanwhile. A
    host whose NVML cannot start is recorded as such (``init`` holds the error).
    """
    import platform

    from adaptd.telemetry import nvml

    err_type = lib.NVMLError

    def code_of(exc: BaseException) -> int:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else nvml.NVML_ERROR_UNKNOWN

    def ask(fn: str, *args: Any) -> Any:
        try:
            return to_json(getattr(lib, fn)(*args))
        except err_type as exc:
            return error_json(code_of(exc), nvml.error_name(code_of(exc)))
        except AttributeError:  # the bindings lack it: what an old driver answers
            code = nvml.NVML_ERROR_FUNCTION_NOT_FOUND
            return error_json(code, nvml.error_name(code))

    out: dict[str, Any] = {
        "format": FORMAT,
        "recorded": {
            "by": "scripts/record_nvml_fixture.py",
            "host": platform.node(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "interval_s": interval,
            **({"note": note} if note else {}),
        },
        "init": None,
        "system": {},
        "devices": [],
    }
    try:
        lib.nvmlInit()
    except err_type as exc:
        out["init"] = error_json(code_of(exc), nvml.error_name(code_of(exc)))
        return out
    t0 = clock()
    try:
        for fn in nvml.SYSTEM_CALLS:
            out["system"][fn] = ask(fn)
        try:
            events = lib.nvmlEventSetCreate()
        except err_type as exc:
            events = None
            out["system"]["nvmlEventSetCreate"] = error_json(
                code_of(exc), nvml.error_name(code_of(exc))
            )
        handles: list[Any | None] = []
        for i in range(int(lib.nvmlDeviceGetCount())):
            dev: dict[str, Any] = {}
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(i)
                dev["nvmlDeviceGetHandleByIndex"] = None
            except err_type as exc:
                handle = None
                dev["nvmlDeviceGetHandleByIndex"] = error_json(code_of(exc))
            handles.append(handle)
            if handle is not None:
                dev.update(_ask_device(ask, handle))
                for fn in EVENT_CALLS:
                    dev[fn] = ask(fn, handle)
                supported = dev["nvmlDeviceGetSupportedEventTypes"]
                mask = (
                    supported & nvml.EVENT_TYPE_XID_CRITICAL_ERROR
                    if isinstance(supported, int)
                    else 0
                )
                if events is not None and mask:
                    dev["nvmlDeviceRegisterEvents"] = ask(
                        "nvmlDeviceRegisterEvents", handle, mask, events
                    )
                else:
                    dev["nvmlDeviceRegisterEvents"] = error_json(nvml.NVML_ERROR_NOT_SUPPORTED)
            out["devices"].append(dev)
        keys = {nvml._handle_key(h): i for i, h in enumerate(handles) if h is not None}
        state = [dict(d) for d in out["devices"]]
        recorded_frames = []
        for _ in range(frames):
            sleep(interval)
            frame: dict[str, Any] = {"t": round(clock() - t0, 3), "devices": {}, "events": []}
            if events is not None:
                frame["events"] = _drain(lib, events, keys, err_type)
            for i, handle in enumerate(handles):
                if handle is None:
                    continue
                now = _ask_device(ask, handle, dynamic_only=True)
                changed = {k: v for k, v in now.items() if state[i].get(k) != v}
                state[i].update(changed)
                if changed:
                    frame["devices"][str(i)] = changed
            recorded_frames.append(frame)
        if recorded_frames:
            out["frames"] = recorded_frames
        if events is not None:
            lib.nvmlEventSetFree(events)
    finally:
        lib.nvmlShutdown()
    return out


def _ask_device(ask: Callable[..., Any], handle: Any, dynamic_only: bool = False) -> dict[str, Any]:
    from adaptd.telemetry import nvml

    out = {}
    for q in nvml.QUERIES:
        if dynamic_only and q.field in nvml.STATIC_FIELDS:
            continue
        for fn, args in q.calls:
            out[call_key(fn, args)] = ask(fn, handle, *args)
    return out


def _drain(lib: Any, events: Any, keys: Mapping[Any, int], err_type: type[Exception]) -> list:
    from adaptd.telemetry import nvml

    out = []
    for _ in range(nvml.MAX_EVENTS_PER_SAMPLE):
        try:
            data = lib.nvmlEventSetWait(events, 0)
        except err_type:
            break  # NVML_ERROR_TIMEOUT: nothing pending
        index = keys.get(nvml._handle_key(data.device))
        if index is None:
            continue
        out.append(
            {
                "device": index,
                "eventType": int(data.eventType),
                "eventData": int(data.eventData),
                "gpuInstanceId": int(getattr(data, "gpuInstanceId", 0xFFFFFFFF)),
                "computeInstanceId": int(getattr(data, "computeInstanceId", 0xFFFFFFFF)),
            }
        )
    return out
