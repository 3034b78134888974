"""A telemetry source that only the tests have: Linux pressure stall information (PSI).

It is what adding a telemetry source takes, and nothing else: this one module, with
one ``collect`` method, and a registration line where a sampler is built
(``Sampler(sources={"pressure": Pressure(proc)})``). Its figures reach the snapshot
the daemon's policies decide on and ``adaptd status``'s telemetry report, without a
change anywhere else (tests/telemetry/test_sources.py shows it).

``/proc/pressure/{cpu,memory,io}`` hold lines such as
``some avg10=1.23 avg60=0.50 avg300=0.10 total=12345``: the share of the last 10 s in
which some (or all, ``full``) tasks waited for the resource, in percent.
"""

from __future__ import annotations

from pathlib import Path

from adaptd.core.snapshot import Figure, Reading, Snapshot
from adaptd.telemetry.source import Sampling

RESOURCES = ("cpu", "memory", "io")


class Pressure:
    """PSI under ``proc`` (a recorded tree in tests); raises when a file is missing."""

    def __init__(self, proc: str | Path = "/proc") -> None:
        self.root = Path(proc) / "pressure"

    def collect(self, snapshot: Snapshot, sampling: Sampling) -> Snapshot:
        figures = []
        for resource in RESOURCES:
            for line in (self.root / resource).read_text().splitlines():
                kind, *fields = line.split()
                avg10 = dict(f.split("=", 1) for f in fields)["avg10"]
                figures.append(
                    Figure(
                        f"{resource}_{kind}_avg10_ratio",
                        float(avg10) / 100,
                        help=f"Share of the last 10 s in which {kind} tasks waited for {resource}.",
                    )
                )
        return snapshot.with_reading(Reading("pressure", tuple(figures)))
