"""``adaptd serve`` whose telemetry reads an NVML fixture instead of the driver (a host
with GPUs of the fixture's model, for the fleet tests; tests/nvml_fixture.py).

    python serve_nvml.py FIXTURE --socket PATH --config FILE

Everything else is ``adaptd serve``'s: the config, the service, SIGTERM's drain.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: nvml_fixture

from nvml_fixture import FixtureNvml

from adaptd.config import loader as config
from adaptd.daemon.service import Service
from adaptd.telemetry.sampler import Sampler


def main() -> int:
    fixture, args = sys.argv[1], sys.argv[2:]
    socket = args[args.index("--socket") + 1]
    cfg = config.load(args[args.index("--config") + 1]).with_overrides(socket=socket)
    logging.basicConfig(stream=sys.stderr, level=cfg.log_level_number,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")  # fmt: skip
    sampler = Sampler.default(interval=cfg.sample_interval_s, nvml_library=FixtureNvml(fixture))
    service = Service(cfg, sampler=sampler)
    service.open()
    try:
        service.serve()
    finally:
        service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
