"""adaptd.service in-process: what it restores from the state database at start,
what it writes back, and how it treats records it cannot use (real SQLite, real
ZeroMQ sockets; the sampler has no sources so nothing probes the host)."""

from __future__ import annotations

import contextlib
import logging
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from adaptd.config import loader as config
from adaptd.core.estimators import LEARNED_VERSION, FailureRate, JobTracker
from adaptd.core.snapshot import StorageSample
from adaptd.daemon.sdnotify import Notifier
from adaptd.daemon.service import (
    FAILURE_RATE_KEY,
    LEARNED_KEY,
    Service,
    ServiceError,
    storage_limits,
)
from adaptd.protocol import admin
from adaptd.protocol import job as p
from adaptd.protocol.job import VERSION, Hello
from adaptd.state.store import GLOBAL, Store, job_scope
from adaptd.telemetry.sampler import Sampler
from adaptd.telemetry.storage import Storage


def make(short_dir: Path, **daemon: object) -> Service:
    body = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in daemon.items())
    cfg = config.loads(
        f'[daemon]\nsocket = "{short_dir}/a.sock"\nstate_dir = "{short_dir}/st"\n{body}'
        '[policy]\ngpu_mtbf_hours = 1000\n[metrics]\nlisten = "off"\n'
    )
    return Service(cfg, notifier=Notifier(env={}), sampler=Sampler())


@contextlib.contextmanager
def serving(svc: Service) -> Iterator[Callable[[], zmq.Socket]]:
    """Open ``svc``, run its daemon loop on a thread, and hand out DEALER sockets
    connected to its job socket; all of it is closed again at the end."""
    svc.open()
    ctx = zmq.Context()
    try:
        svc.daemon.start()

        def connect() -> zmq.Socket:
            peer = ctx.socket(zmq.DEALER)
            peer.connect(svc.daemon.endpoint)
            return peer

        yield connect
    finally:
        ctx.destroy(linger=0)
        svc.daemon.stop()
        svc.close()


def test_restores_failure_rate_with_the_configured_prior_and_job_costs(short_dir: Path) -> None:
    old = FailureRate(prior_gpu_mtbf_s=5e6, failures=2.0, gpu_seconds=7200.0)
    learned = JobTracker("j").learned() | {"save_costs_s": [0.4, 0.6], "saves": 9}
    (short_dir / "st").mkdir()
    with Store.open(short_dir / "st" / "adaptd.sqlite3") as db:
        db.set_param(GLOBAL, FAILURE_RATE_KEY, old.to_dict())
        db.set_param(job_scope("j"), LEARNED_KEY, learned)
        db.flush()
    svc = make(short_dir)
    svc.open()
    try:
        rate = svc.failure_rate
        assert (rate.failures, rate.gpu_seconds) == (2.0, 7200.0)  # observations carried over
        assert rate.prior_gpu_mtbf_s == pytest.approx(1000 * 3600)  # the config's prior
        t = svc.daemon.registry.tracker_factory(Hello(v=VERSION, job="j", gpus=2))
        assert t.failure_rate is rate  # one posterior for the host's jobs
        assert t.saves == 9 and t.save_cost_s is not None
        fresh = svc.daemon.registry.tracker_factory(Hello(v=VERSION, job="new"))
        assert fresh.saves == 0 and fresh.save_cost_s is None
    finally:
        svc.close()
    with Store.open(short_dir / "st" / "adaptd.sqlite3", readonly=True) as db:
        assert db.param(GLOBAL, FAILURE_RATE_KEY)["prior_gpu_mtbf_s"] == pytest.approx(3.6e6)


def test_a_record_of_another_version_is_discarded_with_a_warning(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (short_dir / "st").mkdir()
    with Store.open(short_dir / "st" / "adaptd.sqlite3") as db:
        db.set_param(GLOBAL, FAILURE_RATE_KEY, {"version": LEARNED_VERSION + 1})
        db.set_param(job_scope("j"), LEARNED_KEY, {"version": LEARNED_VERSION + 1, "saves": 5})
        db.flush()
    svc = make(short_dir)
    with caplog.at_level(logging.WARNING, logger="adaptd.service"):
        svc.open()
        try:
            assert svc.failure_rate.gpu_seconds == 0.0
            t = svc.daemon.registry.tracker_factory(Hello(v=VERSION, job="j"))
            assert t.saves == 0
        finally:
            svc.close()
    warned = [r.getMessage() for r in caplog.records if "learned_discarded" in r.getMessage()]
    assert len(warned) == 2 and any("job=j" in w for w in warned)


def test_socket_modes_are_applied_and_a_missing_group_is_a_startup_error(
    short_dir: Path,
) -> None:
    svc = make(short_dir, socket_mode="0600", admin_socket_mode="0640")
    svc.open()
    try:
        assert stat.S_IMODE((short_dir / "a.sock").stat().st_mode) == 0o600
        assert stat.S_IMODE((short_dir / "a.admin.sock").stat().st_mode) == 0o640
    finally:
        svc.close()
    bad = make(short_dir, socket_group="no-such-group-adaptd")
    with pytest.raises(ServiceError, match=r"socket_group: no group 'no-such-group-adaptd'"):
        bad.open()
    assert not (short_dir / "a.sock").exists()  # closed again: the next start is not blocked


def test_an_unusable_database_is_a_startup_error_naming_the_setting(short_dir: Path) -> None:
    (short_dir / "st").mkdir()
    (short_dir / "st" / "adaptd.sqlite3").write_bytes(b"not sqlite at all, " * 100)
    with pytest.raises(ServiceError, match=r"daemon\.db_path"):
        make(short_dir).open()
    assert not (short_dir / "a.sock").exists()


def test_a_save_in_flight_marks_the_jobs_storage_target_as_writing(short_dir: Path) -> None:
    """Only the daemon knows a save is in flight (from the ranks' step reports); the
    snapshot policies and metrics see carries it on the job's storage target."""
    ckpt = short_dir / "ckpt"
    ckpt.mkdir()
    svc = Service(
        make(short_dir).cfg, notifier=Notifier(env={}), sampler=Sampler(storage=Storage())
    )
    with serving(svc) as connect:
        peer = connect()
        peer.send(p.encode(p.Hello(v=VERSION, job="j", checkpoint_dir=str(ckpt))))

        def target() -> StorageSample | None:
            return next((s for s in svc.snapshot().storage if "j" in s.jobs), None)

        def wait(cond, what: str) -> None:
            end = time.monotonic() + 10
            while not cond():
                assert time.monotonic() < end, f"{what} within 10 s"
                peer.poll(50)  # the daemon's next tick samples; wait on its socket

        wait(lambda: target() is not None, "the job's storage target sampled")
        assert target().writing_jobs == ()
        step = p.Steps(v=VERSION, job="j", rank=0, step=5, count=5, mean_s=0.1,
                       save_in_flight=True)  # fmt: skip
        peer.send(p.encode(step))
        wait(lambda: target().writing_jobs == ("j",), "writing_jobs to name the job")
        assert svc.daemon.status().telemetry["storage"][0]["writing_jobs"] == ["j"]
        peer.send(p.encode(p.SaveReport(v=VERSION, job="j", rank=0, step=5, blocking_s=0.1,
                                        durable_s=0.5, bytes=10)))  # fmt: skip
        wait(lambda: target().writing_jobs == (), "the durable report to clear it")


def test_glob_job_entries_apply_to_new_jobs_and_an_operator_resume_sticks(
    short_dir: Path,
) -> None:
    """``[jobs."PATTERN"]``: an exact id merges with the globs that match it, a job
    matched only by a glob gets the glob's settings when it first says hello, and an
    operator's resume is not undone by the hello of the job's next rank."""
    cfg = config.loads(
        f'[daemon]\nsocket = "{short_dir}/a.sock"\nstate_dir = "{short_dir}/st"\n'
        '[metrics]\nlisten = "off"\n'
        '[jobs."exact"]\npaused = true\n'
        '[jobs."ex*"]\npolicy = "fixed:steps=70"\n'
        '[jobs."batch-*"]\npolicy = "fixed:steps=40"\npaused = true\n'
    )
    svc = Service(cfg, notifier=Notifier(env={}), sampler=Sampler())

    def hello(job: str, rank: int = 0, world_size: int = 1) -> p.Plan:
        peer = connect()
        peer.send(p.encode(p.Hello(v=VERSION, job=job, rank=rank, world_size=world_size)))
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if peer.poll(100):
                msg = p.decode_daemon(peer.recv())
                if isinstance(msg, p.Plan):
                    return msg
        raise AssertionError(f"no plan for {job} rank {rank} within 10 s")

    with serving(svc) as connect:
        exact = hello("exact")
        assert exact.policy.startswith("fixed") and "paused" in exact.reason
        glob = hello("batch-7", world_size=2)
        assert glob.next_step is None and "paused by operator" in glob.reason
        assert "fixed" in glob.policy
        other = hello("unmatched")
        assert other.policy == "daly" and "paused" not in other.reason  # the default
        reply = admin.request(svc.daemon.socket_path, admin.PauseRequest(job="batch-7",
                                                                         paused=False))  # fmt: skip
        assert isinstance(reply, admin.PauseReply)
        rank1 = hello("batch-7", rank=1, world_size=2)
        assert "paused" not in rank1.reason and rank1.next_step == 40  # the glob's policy


def test_storage_limits_go_to_the_mount_each_configured_path_lives_on() -> None:
    def sample(mount: str) -> StorageSample:
        return StorageSample(target=f"t:{mount}", mountpoint=mount)

    samples = [sample("/"), sample("/mnt/nfs"), sample("/mnt/nfs/scratch")]
    targets = [
        config.StorageTarget("nfs", Path("/mnt/nfs/ckpts"), max_concurrent_saves=3),
        config.StorageTarget("nfs2", Path("/mnt/nfs/other"), max_concurrent_saves=2),
        config.StorageTarget("deep", Path("/mnt/nfs/scratch/x"), max_concurrent_saves=1),
        config.StorageTarget("free", Path("/data"), max_concurrent_saves=None),
    ]
    limits = storage_limits(samples, targets)
    assert limits == {"t:/mnt/nfs": 2, "t:/mnt/nfs/scratch": 1}  # the smallest per mount
    assert storage_limits([sample("/mnt/other")], targets) == {}


def test_configured_storage_limit_reaches_the_snapshot_policies_read(short_dir: Path) -> None:
    """``[storage."NAME"] max_concurrent_saves`` for the checkpoint directory's mount is
    the sampled target's ``max_writers`` (what io_aware staggers by)."""
    ckpt = short_dir / "ckpt"
    ckpt.mkdir()
    cfg = config.loads(
        f'[daemon]\nsocket = "{short_dir}/a.sock"\nstate_dir = "{short_dir}/st"\n'
        f'[metrics]\nlisten = "off"\n[storage.scratch]\npath = "{ckpt}"\n'
        "max_concurrent_saves = 2\n"
    )
    svc = Service(cfg, notifier=Notifier(env={}), sampler=Sampler(storage=Storage()))
    with serving(svc) as connect:
        peer = connect()
        peer.send(p.encode(p.Hello(v=VERSION, job="j", checkpoint_dir=str(ckpt))))
        end = time.monotonic() + 10
        while not any("j" in s.jobs for s in svc.snapshot().storage):
            assert time.monotonic() < end, "the job's storage target sampled within 10 s"
            peer.poll(50)
        target = next(s for s in svc.snapshot().storage if "j" in s.jobs)
        assert target.max_writers == 2
        assert svc.daemon.status().telemetry["storage"][0]["max_writers"] == 2
