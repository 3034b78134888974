"""A telemetry source is one module and a registration line (issue 22, item 6).

``psi_source.py`` beside this file is such a module, and nothing else was added for
it: registered on the sampler of a real ``adaptd serve`` (the service, its sockets and
its admin command), its figures are in the snapshot every policy decision gets (the
daemon's snapshot source) and in ``adaptd status``'s telemetry report, text and JSON.
The built-in sources are registered the same way, and a source that fails is counted
and leaves the others' figures alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from adaptd.cli import main as cli_main
from adaptd.config import loader as config
from adaptd.core.snapshot import Decision, JobState, Snapshot
from adaptd.daemon.sdnotify import Notifier
from adaptd.daemon.service import Service
from adaptd.telemetry.host import Host
from adaptd.telemetry.sampler import Sampler
from adaptd.telemetry.source import Sampling, Sources
from adaptd.telemetry.storage import Storage

from .psi_source import Pressure

PSI = {
    "cpu": "some avg10=0.50 avg60=0.20 avg300=0.10 total=1000\n",
    "memory": "some avg10=12.34 avg60=5.00 avg300=1.00 total=2000\n"
    "full avg10=3.00 avg60=1.00 avg300=0.20 total=900\n",
    "io": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
}


def recorded_proc(root: Path) -> Path:
    (root / "pressure").mkdir(parents=True)
    for name, text in PSI.items():
        (root / "pressure" / name).write_text(text)
    return root


@dataclass(frozen=True)
class CalmMemory:
    """A policy of the test's: no save while memory pressure is above ``limit``."""

    limit: float = 0.1

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        stalled = snapshot.figure("pressure", "memory_some_avg10_ratio")
        if stalled is not None and stalled > self.limit:
            return Decision(next_step=None, reason=f"memory pressure {stalled:.2%}")
        return Decision(next_step=job.step + 1, reason="calm")


def test_a_source_module_reaches_the_policies_and_adaptd_status(short_dir, tmp_path, capsys):
    sock = short_dir / "a.sock"
    cfg = config.loads(
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{short_dir}/st"\n[metrics]\nlisten = "off"\n'
    )
    sampler = Sampler(host=Host(), sources={"pressure": Pressure(recorded_proc(tmp_path / "p"))})
    svc = Service(cfg, notifier=Notifier(env={}), sampler=sampler)
    svc.open()  # samples once before it is ready
    try:
        snap = svc.snapshot()  # the daemon's snapshot source: what every decision gets
        assert snap.figure("pressure", "memory_some_avg10_ratio") == pytest.approx(0.1234)
        assert snap.figure("pressure", "memory_full_avg10_ratio") == pytest.approx(0.03)
        assert snap.host is not None and snap.host.mem_total_bytes  # the built-in's too
        decision = CalmMemory().decide(snap, JobState("j", step=10))
        assert (decision.next_step, decision.reason) == (None, "memory pressure 12.34%")
        svc.daemon.start()
        assert cli_main(["status", "--socket", str(sock)]) == 0
        text = capsys.readouterr().out
        assert (
            "pressure: cpu_some_avg10_ratio 0.005, memory_some_avg10_ratio 0.1234, "
            "memory_full_avg10_ratio 0.03, io_some_avg10_ratio 0, io_full_avg10_ratio 0"
        ) in text, text
        assert cli_main(["status", "--socket", str(sock), "--json"]) == 0
        (reading,) = json.loads(capsys.readouterr().out)["telemetry"]["readings"]
        assert reading["source"] == "pressure" and reading["figures"][1] == {
            "name": "memory_some_avg10_ratio",
            "value": pytest.approx(0.1234),
            "help": "Share of the last 10 s in which some tasks waited for memory.",
        }
    finally:
        svc.daemon.stop()
        svc.close()


def test_a_failing_source_is_counted_and_the_others_go_on(tmp_path, caplog) -> None:
    s = Sampler(host=Host(), sources={"pressure": Pressure(tmp_path / "no-psi-here")})
    with caplog.at_level(logging.WARNING, logger="adaptd.telemetry.sampler"):
        snaps = [s.sample(float(t)) for t in range(3)]
    assert s.failures == {"pressure": 3}
    assert all(x.readings == () and x.host is not None for x in snaps)
    assert sum("pressure source failed" in r.message for r in caplog.records) == 1


def test_the_built_in_sources_are_registered_like_any_other(tmp_path) -> None:
    class NoGpu:
        def sample(self) -> tuple:
            return ()

        def close(self) -> None:
            pass

    s = Sampler(nvml=NoGpu(), storage=Storage(), host=Host(), sources={"pressure": Pressure()})
    assert s.sources.names == ("gpu", "gpu_jobs", "storage", "host", "pressure")
    sources = Sources()
    sources.register("pressure", Pressure(recorded_proc(tmp_path)))
    with pytest.raises(ValueError, match="registered as 'pressure' already"):
        sources.register("pressure", Pressure())
    with pytest.raises(TypeError, match="has no collect"):
        sources.register("bare", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identifier"):
        sources.register("no spaces", Pressure())
    (name, source), *_ = sources
    snap = source.collect(Snapshot(time=1.0), Sampling(now=1.0, jobs={}))
    assert name == "pressure" and snap.reading("pressure") is not None
    assert snap.with_reading(snap.readings[0]).readings == snap.readings  # replaced, not added
