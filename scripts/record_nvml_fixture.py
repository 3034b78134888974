#!/usr/bin/env python3
"""Record an NVML fixture from a real GPU host, for the fake NVML's tests and demos.

Asks every NVML call adaptd's sampler makes (errors included, as NVML error
codes), then ``--frames`` more times ``--interval`` seconds apart, keeping the
answers that changed and the XID events that arrived. The output is the format
the tests' fake NVML (``tests/nvml_fixture.py``, :class:`FixtureNvml`) replays::

    python scripts/record_nvml_fixture.py --frames 5 -o tests/fixtures/nvml/myhost.json

Needs nvidia-ml-py (``pynvml``, a dependency of adaptd); on a host without a driver
it records that (``"init": {"nvml_error": ...}``), which is itself a valid
degraded-mode fixture. Process ids and GPU UUIDs of the host end up in the file:
review before sharing. tests/fixtures/nvml/README.md says how to record the shipped
fixtures' counterparts on a GPU host.

``--replay FIXTURE`` records from the fake NVML replaying a fixture instead (one
frame per ``--interval``), to try the recorder on a machine without a GPU; the
output then says ``"synthetic": true``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the fixture format lives with the fake NVML


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", metavar="PATH", help="write here (default: stdout)")
    parser.add_argument(
        "--frames", type=int, default=3, help="later samples to record (default: 3)"
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between frames (default: 1)"
    )
    parser.add_argument("--note", default="", help="free text stored under 'recorded'")
    parser.add_argument(
        "--replay",
        metavar="FIXTURE",
        help="record from the fake NVML replaying this fixture (a name or path), not a GPU",
    )
    args = parser.parse_args(argv)
    if args.frames < 0 or args.interval <= 0:
        parser.error(
            f"--frames must be >= 0 and --interval > 0 (got {args.frames}, {args.interval})"
        )

    from nvml_fixture import FixtureNvml, record

    from adaptd.telemetry import nvml

    if args.replay:
        try:
            fake = FixtureNvml(args.replay, clock=None)
        except ValueError as exc:  # not found, unreadable or not a fixture
            parser.error(f"--replay: {exc}")

        def sleep(seconds: float) -> None:  # each interval brings the fixture's next frame
            time.sleep(seconds)
            fake.step()

        data = record(fake, frames=args.frames, interval=args.interval, note=args.note, sleep=sleep)
        data["recorded"].update(
            synthetic=True, source=f"replay of fixture {args.replay!r} by the fake NVML, no GPU"
        )
    else:
        try:
            lib = nvml.load_library()
        except nvml.NvmlUnavailable as exc:
            print(f"record_nvml_fixture: {exc}", file=sys.stderr)
            return 1
        data = record(lib, frames=args.frames, interval=args.interval, note=args.note)
    text = json.dumps(data, indent=1) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        gpus = len(data["devices"])
        init = data["init"]
        print(
            f"recorded {gpus} GPU(s), {len(data.get('frames', []))} frame(s) to {args.output}"
            + (f" (NVML did not start: {init.get('name', init)})" if init else ""),
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
