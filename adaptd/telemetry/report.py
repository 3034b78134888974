"""Telemetry for people and scripts: a snapshot as JSON-safe data, and as tables.

Pure functions, no I/O: the daemon puts :func:`to_dict` of its newest snapshot
in its status reply, and ``adaptd status`` prints :func:`parts` of that dict (rich
tables on a terminal, :func:`render`'s plain text when piped; see
:mod:`adaptd.tables`), or dumps it as is with ``--json``. The tables work from the
dict form, so the command line needs nothing but what came over the admin socket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from adaptd import tables
from adaptd.core.snapshot import Snapshot
from adaptd.tables import Table

__all__ = [
    "THROTTLE_BITS",
    "format_gpus",
    "format_host",
    "format_readings",
    "format_storage",
    "health",
    "render",
    "throttle_names",
    "to_dict",
]

#: NVML clocksEventReasons bits worth naming (nvml.h).
THROTTLE_BITS = {
    0x1: "idle",
    0x2: "app-clocks",
    0x4: "sw-power",
    0x8: "hw-slowdown",
    0x10: "sync-boost",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
    0x100: "display-clocks",
}


def to_dict(snapshot: Snapshot) -> dict[str, Any]:
    """``snapshot`` as plain dicts/lists/numbers (tuples become lists), for JSON and msgpack."""
    return dataclasses.asdict(snapshot, dict_factory=_plain)


def _plain(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in items}


def throttle_names(mask: int | None) -> str:
    """``0x44`` -> ``"sw-power,hw-thermal"``; ``0`` -> ``""``; ``None`` -> ``"-"``."""
    if mask is None:
        return "-"
    names = [n for bit, n in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    if rest:
        names.append(hex(rest))
    return ",".join(names)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**30:.1f}"


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}B/s"


def _num(x: float | int | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def health(gpu: Mapping[str, Any]) -> str:
    """One word or a list of problems: ``ok``, ``xid 79``, ``ecc 1 uncorr``, ``rows pending``."""
    problems = []
    if gpu.get("xid_events"):
        problems.append("xid " + ",".join(str(x) for x in gpu["xid_events"]))
    if gpu.get("ecc_uncorrected"):
        problems.append(f"ecc {gpu['ecc_uncorrected']} uncorr")
    if gpu.get("ecc_corrected"):
        problems.append(f"ecc {gpu['ecc_corrected']} corr")
    if gpu.get("remapped_rows_pending"):
        problems.append("rows pending")
    if gpu.get("retired_pages_pending"):
        problems.append("pages pending")
    if not problems and gpu.get("util_sm") is None and gpu.get("power_w") is None:
        return "no data"
    return "; ".join(problems) or "ok"


def gpu_table(gpus: Sequence[Mapping[str, Any]]) -> Table | None:
    """The GPU table from :func:`to_dict`'s ``"gpus"`` list; ``None`` when there are none."""
    if not gpus:
        return None
    rows = [
        (
            str(g["index"]),
            g.get("name") or "?",
            _pct(g.get("util_sm")),
            _pct(g.get("util_mem")),
            f"{_gib(g.get('mem_used_bytes'))}/{_gib(g.get('mem_total_bytes'))}",
            _num(g.get("power_w")),
            _num(g.get("temperature_c")),
            _num(g.get("sm_clock_mhz")),
            throttle_names(g.get("throttle_reasons")) or "none",
            health(g),
            ",".join(g.get("jobs") or ()) or "-",
        )
        for g in gpus
    ]
    header = ("GPU", "NAME", "SM", "MEM", "MEM_GIB", "W", "C", "MHZ", "THROTTLE", "HEALTH", "JOBS")
    return Table(header, rows, numeric=frozenset({0, 2, 3, 4, 5, 6, 7}))


def storage_table(storage: Sequence[Mapping[str, Any]]) -> Table | None:
    """The storage table from :func:`to_dict`'s ``"storage"`` list; ``None`` when empty."""
    if not storage:
        return None
    rows = [
        (
            s["target"],
            s.get("fstype") or "?",
            s.get("device") or "-",
            _rate(s.get("write_bytes_per_s")),
            _num(s.get("write_iops")),
            _pct(s.get("busy_fraction")),
            _num(
                None if s.get("write_latency_s") is None else s["write_latency_s"] * 1000,
                "{:.1f}ms",
            ),
            ",".join(s.get("jobs") or ()) or "-",
        )
        for s in storage
    ]
    header = ("TARGET", "FS", "DEVICE", "WRITE", "IOPS", "BUSY", "W_LAT", "JOBS")
    return Table(header, rows, numeric=frozenset({3, 4, 5, 6}))


def format_gpus(gpus: Sequence[Mapping[str, Any]]) -> str:
    """:func:`gpu_table` as plain text; ``""`` when there are no GPUs."""
    table = gpu_table(gpus)
    return table.plain() + "\n" if table is not None else ""


def format_storage(storage: Sequence[Mapping[str, Any]]) -> str:
    """:func:`storage_table` as plain text; ``""`` when there are no targets."""
    table = storage_table(storage)
    return table.plain() + "\n" if table is not None else ""


def format_host(host: Mapping[str, Any] | None) -> str:
    """One line: available/total memory and load per core."""
    if not host:
        return "host: no data\n"
    line = (
        f"host: memory {_gib(host.get('mem_available_bytes'))} of "
        f"{_gib(host.get('mem_total_bytes'))} GiB available, "
        f"load {_num(host.get('cpu_load'), '{:.2f}')} per core"
    )
    if host.get("draining"):
        line += ", draining"
    return line + "\n"


def format_readings(readings: Sequence[Mapping[str, Any]]) -> str:
    """One line per telemetry source without a table of its own (a
    :class:`~adaptd.core.snapshot.Reading`): its name and figures; ``""`` when none."""
    lines = []
    for r in readings:
        figures = ", ".join(
            f"{f['name']} {'-' if f.get('value') is None else format(f['value'], '.4g')}"
            for f in r.get("figures") or ()
        )
        lines.append(f"{r['source']}: {figures or 'no figures'}\n")
    return "".join(lines)


def parts(data: Mapping[str, Any], *, now: float | None = None) -> list[tables.Part]:
    """Host line, GPU table, storage table and a line per other source from
    :func:`to_dict` output, for :func:`adaptd.tables.emit`. ``now`` (same
    monotonic clock) adds the snapshot's age."""
    age = "" if now is None else f" ({max(0.0, now - data['time']):.1f}s old)"
    gpus = gpu_table(data.get("gpus") or ())
    storage = storage_table(data.get("storage") or ())
    out: list[tables.Part] = [
        f"telemetry{age}\n" + format_host(data.get("host")).rstrip("\n"),
        "",
        gpus if gpus is not None else "gpus: none seen (no NVIDIA driver, or no GPUs)",
        "",
        storage if storage is not None else "storage: no job has a local checkpoint dir yet",
    ]
    readings = format_readings(data.get("readings") or ())
    return [*out, "", readings.rstrip("\n")] if readings else out


def render(data: Mapping[str, Any], *, now: float | None = None) -> str:
    """:func:`parts` as plain text."""
    return tables.plain(parts(data, now=now))
