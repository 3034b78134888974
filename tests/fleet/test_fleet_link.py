"""The daemon's side of the fleet against a real etcd: facts into snapshots, wishes out,
slots released by the daemon's events, failure knowledge pooled; and the [fleet] config."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_helpers import Etcd, holders, settings

from adaptd import events as ev
from adaptd.config import loader as config
from adaptd.config import schema as config_schema
from adaptd.config.fleet import parse_fleet
from adaptd.config.schema import FLEET_SETTINGS
from adaptd.core.estimators import FailureRate
from adaptd.core.snapshot import GpuSample, Snapshot, StorageSample
from adaptd.fleet.config import FleetConfig, endpoints_from
from adaptd.fleet.link import FleetLink, JobFacts
from adaptd.protocol.job import VERSION, SaveReport
from adaptd.telemetry.storage import parse_mountinfo

MOUNTS = Path(__file__).parents[1] / "fixtures" / "proc" / "fleet" / "host-a.mountinfo"
NFS = "nfs://10.0.4.20/export/ckpt"


def mounts():
    return parse_mountinfo(MOUNTS.read_text())


def snap(jobs=("ja",), time=100.0) -> Snapshot:
    return Snapshot(
        time=time,
        gpus=(GpuSample(index=0, uuid="g0", name="NVIDIA H100 80GB HBM3"),),
        storage=(
            StorageSample(target="/mnt/nfs/ckpt", mountpoint="/mnt/nfs/ckpt", jobs=jobs),
            StorageSample(target="/scratch", mountpoint="/scratch", jobs=("jlocal",)),
        ),
    )


def link(etcd: Etcd, host: str, prefix: str, **kw) -> FleetLink:
    cfg = FleetConfig(settings=settings(etcd.url, host, prefix), **kw)
    out = FleetLink(cfg, failure_rate=FailureRate(), mounts=mounts, resolve_paths=False)
    out.agent.poll_s = 0.2
    return out


def report(job: str, step: int) -> ev.SaveReported:
    r = SaveReport(v=VERSION, job=job, rank=0, step=step, blocking_s=0.1, durable_s=1.0, bytes=1)
    return ev.SaveReported(time=0.0, wall=0.0, job=job, report=r, counted=True)


def facts(job: str, tags=("deferred", "fleet-wait"), target="/mnt/nfs/ckpt") -> JobFacts:
    return JobFacts(job=job, target=target, tags=tags, gpus=8, at_risk_gpu_s=800.0, age_s=100.0)


def test_no_fleet_facts_until_etcd_answers(etcd: Etcd, fleet_prefix):
    lk = link(etcd, "host-a", fleet_prefix)  # not started: no view yet
    s = snap()
    assert lk.decorate(s) is s
    lk.agent.stop()


def test_a_job_waits_is_granted_saves_and_gives_its_slot_back(etcd: Etcd, fleet_prefix):
    lk = link(etcd, "host-a", fleet_prefix).start()
    try:
        lk.agent.wait_for(lambda v: v.up, 10)
        s = lk.decorate(snap(), caps={"/mnt/nfs/ckpt": 1})
        nfs, local = s.storage
        assert (nfs.fleet_slots, nfs.fleet_holding) == (1, ())
        assert local.fleet_slots is None  # a local disk is never coordinated
        assert s.fleet is not None and s.fleet.hosts == 1
        lk.wishes(100.0, [facts("ja")])  # io_aware said: due, waiting for a slot
        lk.agent.wait_for(lambda v: "ja" in v.granted, 10)
        assert lk.decorate(snap()).storage[0].fleet_holding == ("ja",)
        lk.wishes(101.0, [facts("ja", tags=())])  # granted: the plan says "save now"
        assert holders(etcd, fleet_prefix) == [("host-a", NFS, "ja")]  # kept while saving
        lk.on_event(ev.SaveInFlight(time=102.0, job="ja", writing=True))
        lk.on_event(report("ja", 500))  # durable
        lk.agent.wait_for(lambda v: not v.granted, 10)
        assert holders(etcd, fleet_prefix) == []
    finally:
        lk.stop()


def test_a_grant_no_save_uses_is_given_back(etcd: Etcd, fleet_prefix):
    lk = link(etcd, "host-a", fleet_prefix, grant_timeout_s=5.0).start()
    try:
        lk.agent.wait_for(lambda v: v.up, 10)
        lk.decorate(snap())
        lk.wishes(100.0, [facts("ja")])
        lk.agent.wait_for(lambda v: "ja" in v.granted, 10)
        lk.wishes(101.0, [facts("ja", tags=())])  # granted at 101
        lk.wishes(105.0, [facts("ja", tags=())])  # 4 s later: kept
        assert "ja" in lk.agent.wanted()
        lk.wishes(106.5, [facts("ja", tags=())])  # no save started within 5 s: back
        lk.agent.wait_for(lambda v: not v.granted, 10)
    finally:
        lk.stop()


def test_a_wait_that_ends_without_a_grant_is_withdrawn(etcd: Etcd, fleet_prefix):
    lk = link(etcd, "host-a", fleet_prefix).start()
    other = link(etcd, "host-b", fleet_prefix).start()
    try:
        for x in (lk, other):
            x.agent.wait_for(lambda v: v.up, 10)
            x.decorate(snap(jobs=("ja", "jb")), caps={"/mnt/nfs/ckpt": 1})
        other.wishes(100.0, [facts("jb")])
        other.agent.wait_for(lambda v: "jb" in v.granted, 10)
        lk.wishes(100.0, [facts("ja")])
        lk.agent.wait_for(lambda v: "ja" in v.waiting, 10)
        # the deferral bound passed: io_aware saves without a slot, the wish goes
        lk.wishes(200.0, [facts("ja", tags=())])
        lk.agent.wait_for(lambda v: not v.waiting, 10)
        # and a job that disappears from the daemon gives its slot back too
        other.wishes(201.0, [])
        other.agent.wait_for(lambda v: not v.granted, 10)
        assert holders(etcd, fleet_prefix) == []
    finally:
        lk.stop()
        other.stop()


def test_the_failure_rate_pools_the_other_hosts_and_keeps_its_own(etcd: Etcd, fleet_prefix):
    a = link(etcd, "host-a", fleet_prefix)
    a.failure_rate.failures, a.failure_rate.gpu_seconds = 30.0, 1.5e9
    a.decorate(snap())  # learns its GPU model from the snapshot
    a.agent.publish(a.knowledge.record())
    assert a.agent.poll_once().up
    a.agent.stop()
    b = link(etcd, "host-b", fleet_prefix)
    b.decorate(snap())
    b.failure_rate.failures, b.failure_rate.gpu_seconds = 2.0, 1e8
    assert b.agent.poll_once().up
    b.knowledge.refresh(b.agent.view())
    rate = b.failure_rate
    assert (rate.others_failures, rate.others_gpu_seconds) == (30.0, 1.5e9)
    prior = FailureRate()
    assert rate.gpu_mtbf_s == pytest.approx(
        (prior.prior_gpu_mtbf_s + 1.5e9 + 1e8) / (prior.prior_failures + 32)
    )
    assert rate.local().to_dict() == FailureRate(failures=2.0, gpu_seconds=1e8).to_dict()
    b.agent.stop()


def test_lifetimes_come_from_the_daemons_events():
    lk = FleetLink(
        FleetConfig(settings=settings("http://127.0.0.1:9", "h", "/x/")),
        failure_rate=FailureRate(),
        mounts=mounts,
    )
    lk.wishes(0.0, [JobFacts("j1", None, (), 8, 0.0, age_s=100.0)])
    lk.on_event(ev.JobLost(1.0, 0.0, "j1", 10, 5, 1.0, "silent", 8, 1))
    lk.on_event(ev.JobResumed(2.0, 0.0, "j1", 1.0, 10, 5, 1.0))  # failed: counted
    lk.wishes(3.0, [JobFacts("j2", None, (), 4, 0.0, age_s=50.0)])
    lk.on_event(ev.JobFinished(4.0, 0.0, "j2", 99, "done"))  # survived: censored
    rec = lk.knowledge.record()
    assert rec.lifetimes == (800.0,) and rec.survivals == (200.0,)
    lk.agent.stop()


# ---------------------------------------------------------------------- [fleet] config


def test_no_fleet_without_endpoints():
    assert parse_fleet(None) is None
    assert parse_fleet({}) is None


def test_endpoints_from_flags_or_environment():
    assert endpoints_from({"ADAPTD_ETCD": "http://a:2379, http://b:2379"}, None) == (
        "http://a:2379",
        "http://b:2379",
    )
    assert endpoints_from({"ADAPTD_ETCD": "http://a:2379"}, ["http://c:2379"]) == ("http://c:2379",)
    cfg = parse_fleet({"prefix": "/x/"}, endpoints=["http://c:2379"], hostname="h1")
    assert cfg is not None and cfg.settings.endpoints == ("http://c:2379",)
    assert (cfg.settings.host, cfg.settings.prefix, cfg.slots) == ("h1", "/x/", 2)


def test_a_full_fleet_section(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    cfg = parse_fleet(
        {
            "etcd": ["https://e1:2379", "https://e2:2379"],
            "host": "gpu-17",
            "user": "gpu-17",
            "password_file": str(pw),
            "lease_ttl_s": 15,
            "slots": 3,
            "shared": {"/scratch": "gcs://b"},
        },
        mounts=mounts(),  # /scratch is a mount point there (tests/fleet/test_shared_mounts.py)
    )
    assert cfg is not None
    assert cfg.settings.password == "s3cret" and cfg.settings.lease_ttl_s == 15
    assert cfg.slots == 3 and dict(cfg.shared) == {"/scratch": "gcs://b"}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"etcd": ["http://e:2379"], "slot": 2}, "fleet.slot: unknown setting"),
        ({"prefix": "/x/"}, "fleet.etcd: give the etcd endpoints"),
        ({"etcd": "e:2379"}, "fleet.etcd"),
        ({"etcd": ["http://e:2379"], "slots": 0}, "fleet.slots"),
        ({"etcd": ["http://e:2379"], "lease_ttl_s": "10"}, "fleet.lease_ttl_s"),
        ({"etcd": ["http://e:2379"], "user": "u"}, "fleet.user: user and password"),
        ({"etcd": ["http://e:2379"], "ca_file": "/nonexistent"}, "fleet.ca_file"),
        ({"etcd": ["http://e:2379"], "shared": {"rel": "x"}}, "fleet.shared"),
        (
            {"etcd": ["http://e:2379"], "password": "a", "password_file": "/x"},
            "password or password_file",
        ),
    ],
)
def test_a_bad_fleet_section_names_the_key(table, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_fleet(table)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"prefix": "adaptd"}, "fleet.prefix"),  # was named by the whole message
        ({"host": "a/b"}, "fleet.host"),
        ({"cert_file": "/etc/hostname"}, "fleet.cert_file"),
        ({"lease_ttl_s": 3601}, "fleet.lease_ttl_s"),
    ],
)
def test_the_fleets_own_checks_name_the_key(change, key):
    """The fleet settings' checks (prefix, host name, pairs, ranges) name the key at fault,
    as every other section's do."""
    with pytest.raises(config.ConfigError) as info:
        parse_fleet({"etcd": ["http://e:2379"], **change})
    assert info.value.key == key and str(info.value).startswith(f"{key}: "), str(info.value)


def test_the_fleet_section_is_the_schemas_and_reads_back_the_same(tmp_path, monkeypatch):
    """[fleet] is declared, written back and read again like every section: each of its
    keys is in the schema's docs table, ``--check-config`` writes them all (the password
    as the file it came from, not a copy of the secret), and that reads back the same."""
    monkeypatch.delenv("ADAPTD_ETCD", raising=False)
    assert all(f"`fleet.{s.key}`" in config_schema.docs_table() for s in FLEET_SETTINGS)
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    cfg = config.loads(
        f'[fleet]\netcd = "http://e:2379"\nhost = "h1"\nuser = "u"\npassword_file = "{pw}"\n'
        "slots = 3\n"
    )
    shown = cfg.as_dict()["fleet"]
    assert set(shown) == {s.key for s in FLEET_SETTINGS}
    assert (shown["password"], shown["password_file"], shown["slots"]) == (None, str(pw), 3)
    again = config.loads(cfg.to_toml())
    assert again.as_dict() == cfg.as_dict() and again.fleet == cfg.fleet
    assert again.fleet is not None and again.fleet.settings.password == "s3cret"


def test_an_upload_to_a_shared_destination_waits_for_a_slot(etcd: Etcd, fleet_prefix):
    """The replicator's gate: an upload to the NFS export another host's job is writing
    to waits until that save is durable, then holds the slot until it ends."""
    import threading

    from adaptd.config.loader import Destination

    def destination(name: str, url: str) -> Destination:
        return Destination(name=name, url=url, bandwidth_mib_s=None, max_concurrent=1,
                           keep_last=3, keep_every_hours=None, storage_options={})  # fmt: skip

    dest = destination("nfs", "/mnt/nfs/ckpt/replicas")
    uploader = link(etcd, "host-a", fleet_prefix).start()
    writer = link(etcd, "host-b", fleet_prefix).start()
    try:
        for x in (uploader, writer):
            x.agent.wait_for(lambda v: v.up, 10)
            x.decorate(snap(jobs=("ja", "jb")), caps={"/mnt/nfs/ckpt": 1})
        assert uploader.destination_name(dest.job_url("ja"), {}) == NFS
        writer.wishes(100.0, [facts("jb")])
        writer.agent.wait_for(lambda v: "jb" in v.granted, 10)
        entered = threading.Event()
        done = threading.Event()

        def upload() -> None:
            with uploader.upload_slot(dest, "ja", done.is_set):
                entered.set()
                done.wait(10)

        t = threading.Thread(target=upload)
        t.start()
        uploader.agent.wait_for(lambda v: "upload:nfs:ja" in v.waiting, 10)
        assert not entered.is_set()
        writer.on_event(report("jb", 10))  # the job's save is durable: slot back
        assert entered.wait(10)
        assert holders(etcd, fleet_prefix) == [("host-a", NFS, "upload:nfs:ja")]
        done.set()
        t.join(10)
        uploader.agent.wait_for(lambda v: not v.granted, 10)
        # a destination nobody shares never waits
        local = destination("local", "/scratch/replicas")
        with uploader.upload_slot(local, "ja", lambda: False):
            assert "upload:local:ja" not in uploader.agent.wanted()
    finally:
        uploader.stop()
        writer.stop()


def test_job_facts_come_from_the_registry_jobs():
    """The daemon's jobs as the tick sees them: a real JobTracker fed as the registry
    feeds it, the latest decision's tags, the sampled target holding the job."""
    from types import SimpleNamespace

    from adaptd.core.estimators import JobTracker
    from adaptd.core.snapshot import Decision
    from adaptd.fleet.link import job_facts

    t = JobTracker("ja", gpus=8)
    t.on_resume(0.0, 0)
    t.on_steps(10.0, 100, 100, 0.5)
    t.on_save_requested(10.0, 100)
    t.on_save_report(12.0, 100, blocking_s=0.1, durable_s=2.0)
    t.on_steps(20.0, 160, 60, 0.5)
    wait = Decision(next_step=400, tags=("deferred", "fleet-wait"))
    jobs = [
        SimpleNamespace(id="ja", state="active", tracker=t, latest=wait),
        SimpleNamespace(id="gone", state="lost", tracker=t, latest=None),
    ]
    (f,) = job_facts(jobs, snap(), now=20.0)
    assert (f.job, f.target, f.tags, f.gpus) == ("ja", "/mnt/nfs/ckpt", wait.tags, 8)
    assert f.at_risk_gpu_s == pytest.approx(60 * 0.5 * 8)  # 60 steps since the durable save
    assert f.age_s == pytest.approx(20.0)


def test_the_fleet_in_metrics_and_status(etcd: Etcd, fleet_prefix):
    """The collector's series (promtool-clean) and the status section, from a link
    holding a slot, then with etcd's answers stale."""
    import shutil
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest

    from adaptd.fleet.metrics import FleetCollector
    from adaptd.fleet.report import render

    lk = link(etcd, "host-a", fleet_prefix).start()
    try:
        lk.agent.wait_for(lambda v: v.up, 10)
        lk.decorate(snap(), caps={"/mnt/nfs/ckpt": 2})
        lk.wishes(100.0, [facts("ja")])
        lk.agent.wait_for(lambda v: "ja" in v.granted, 10)
        registry = CollectorRegistry()
        registry.register(FleetCollector(lk))
        text = generate_latest(registry).decode()
        for line in (
            "adaptd_fleet_up 1.0",
            "adaptd_fleet_hosts 1.0",
            "adaptd_fleet_slot_holding 1.0",
            f'adaptd_fleet_slot_cap{{target="{NFS}"}} 2.0',
            f'adaptd_fleet_slot_holders{{target="{NFS}"}} 1.0',
            "adaptd_fleet_slot_grants_total",
            "adaptd_fleet_errors_total 0.0",
            "adaptd_fleet_slot_view_age_seconds ",
        ):
            assert line in text, line
        promtool = shutil.which("promtool")
        if promtool:
            checked = subprocess.run(
                [promtool, "check", "metrics"], input=text, capture_output=True, text=True
            )
            assert checked.returncode == 0, checked.stdout + checked.stderr
        status = lk.status()
        assert status["up"] and status["role"] == "leader" and status["holding"] == ["ja"]
        shown = render(status)
        assert "FLEET up" in shown and f"{NFS}: 1/2 slot(s) held by host-a/ja" in shown
        assert 0 <= status["targets_age_s"] < 10 and "as of the claims read" in shown
        # a view older than stale_after_s reads as etcd away: local decisions, said so
        late = lk.clock() + lk.cfg.stale_after_s + 5
        assert lk.usable(late) is None
        assert "DOWN" in render(lk.status(late))
    finally:
        lk.stop()
