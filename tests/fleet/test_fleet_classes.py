"""Failure classes shared by the fleet (adaptd/fleet/classes.py): real daemons against a
real etcd, ranks played by raw DEALER sockets saying hello as a job's ranks would.

- a process failure learned on one host reaches another host's view of the same job,
  and only of that job (the process prior is per job);
- a job that last ran on host A and comes back on host B restored from durable storage
  is one host failure, counted once for the fleet: not per rank, not again when B's
  daemon restarts;
- without etcd a daemon keeps its own figures;
- records of a daemon before the classes are still read.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from fleet_helpers import Etcd
from fleet_hosts import Host
from local_etcd import _b64

from adaptd.core.failure_rates import PRIOR_PROCESS_MTBF_S, FailureClasses
from adaptd.fleet.classes import ClassTotals, FleetClasses
from adaptd.fleet.failures import FailureRecord
from adaptd.fleet.keys import KeySpace, range_end
from adaptd.fleet.part import FLEET_HISTORY_KEY
from adaptd.state.store import GLOBAL, Store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
from daemon_helpers import Peer  # the daemon tests' raw rank

WAIT_S = 30.0


def hosts_of(root: Path, etcd_url: str, prefix: str, *names: str) -> list[Host]:
    ckpt = root / "ckpt"
    ckpt.mkdir(exist_ok=True)
    extra = f"prefix = {json.dumps(prefix)}\n"
    return [Host(root, n, etcd_url, ckpt, fleet=extra, job=False) for n in names]


@pytest.fixture
def peers(zctx: zmq.Context) -> Iterator[Callable[[Host], Peer]]:
    made: list[Peer] = []

    def peer(host: Host) -> Peer:
        made.append(Peer(zctx, f"ipc://{host.socket}"))
        return made[-1]

    yield peer
    for one in made:
        one.close()


def published(server: Etcd, prefix: str) -> dict[str, ClassTotals]:
    """Each host's classes as etcd holds them (its newest record that has them)."""
    keys = KeySpace(prefix)
    out = server.call(
        "kv/range", {"key": _b64(keys.failures), "range_end": _b64(range_end(keys.failures))}
    )
    best: dict[str, tuple[float, ClassTotals]] = {}
    for kv in out.get("kvs", ()):
        host, model = keys.failure_parts(base64.b64decode(kv["key"]).decode())
        rec = FailureRecord.from_json(host, model, base64.b64decode(kv["value"]))
        if rec.classes is not None and rec.updated >= best.get(host, (-1.0, None))[0]:
            best[host] = (rec.updated, ClassTotals.from_dict(rec.classes))
    return {h: t for h, (_, t) in best.items()}


def wait_etcd(server: Etcd, prefix: str, pred: Callable[[dict[str, ClassTotals]], bool]):
    end = time.monotonic() + WAIT_S
    while not pred(got := published(server, prefix)):
        assert time.monotonic() < end, f"etcd never showed the expected classes: {got}"
        time.sleep(0.1)  # polling etcd (no event to wait on from here)
    return got


def wait_kept(host: Host, pred: Callable[[dict], bool]) -> dict:
    """The failure classes ``host``'s daemon kept in its state database, once ``pred``."""
    end = time.monotonic() + WAIT_S
    while True:
        with Store.open(host.dir / "adaptd.sqlite3", readonly=True) as db:
            kept = (db.param(GLOBAL, FLEET_HISTORY_KEY) or {}).get("classes")
        if kept is not None and pred(kept):
            return kept
        assert time.monotonic() < end, f"{host.name} never kept the expected classes: {kept}"
        time.sleep(0.1)  # polling the database (no event to wait on from here)


def process_failure(peer_a: Peer, peer_b: Peer, job: str) -> None:
    """``job`` runs, then its rank 0 comes back as a new process that found its local
    tier intact on the same host: a process failure."""
    peer_a.hello(job, pid=1001, gpus=1, local_tier="disk")
    peer_a.steps(job, 20)
    peer_b.hello(job, pid=1002, gpus=1, local_tier="disk", resumed_from=20,
                 resumed_tier="local", local_intact=True)  # fmt: skip


@pytest.mark.slow
def test_a_process_failure_on_one_host_teaches_the_others_for_that_job_only(
    etcd: Etcd, fleet_prefix: str, hosts_root: Path, peers
):
    a, b = hosts_of(hosts_root, etcd.url, fleet_prefix, "host-a", "host-b")
    try:
        process_failure(peers(a), peers(a), "j")
        # host-a may publish its totals before it has counted j's failure (no "j" yet)
        wait_etcd(
            etcd,
            fleet_prefix,
            lambda g: "host-a" in g and g["host-a"].process.get("j", (0,))[0] == 1,
        )
        peers(b).hello("j", pid=2001, gpus=1, local_tier="disk")  # j's next run, on B
        peers(b).hello("k", pid=2002, gpus=1, local_tier="disk")  # another job on B
        f = b.wait_fleet(lambda f: f["classes"]["process"].get("j", {}).get("fleet_failures"))
        c = f["classes"]
        assert c["process"]["j"]["failures"] == 0  # B saw none itself
        assert c["process"]["j"]["fleet_failures"] == 1  # A's, for the same job
        assert c["process"]["j"]["mtbf_s"] < 0.6 * PRIOR_PROCESS_MTBF_S
        assert c["process"]["k"]["fleet_failures"] == 0  # per job: k learns nothing of j
        assert c["process"]["k"]["mtbf_s"] == pytest.approx(PRIOR_PROCESS_MTBF_S)
        assert c["fleet_host_failures"] == 0 and c["moves"] == 0  # a process failure
    finally:
        for h in (a, b):
            h.discard()


@pytest.mark.slow
def test_a_job_that_moves_hosts_is_one_host_failure_for_the_fleet(
    etcd: Etcd, fleet_prefix: str, hosts_root: Path, peers
):
    a, b = hosts_of(hosts_root, etcd.url, fleet_prefix, "host-a", "host-b")
    try:
        for rank in (1, 0):
            peers(a).hello("m", rank=rank, world_size=2, pid=3000 + rank, gpus=1,
                           local_tier="disk")  # fmt: skip
        wait_etcd(etcd, fleet_prefix, lambda g: "m" in g.get("host-a", ClassTotals()).seen)
        a.kill()  # the host is lost: daemon, job and local tier
        back = dict(world_size=2, gpus=1, local_tier="disk", resumed_from=50)  # from durable
        ranks = [peers(b) for _ in range(2)]
        for rank in (1, 0):  # rank 1 first: the job is new to B at a rank other than 0
            ranks[rank].hello("m", rank=rank, pid=4000 + rank, **back)
        f = b.wait_fleet(lambda f: f["classes"]["moves_pending"] == 0 and f["classes"]["moves"])
        assert f["classes"]["moves"] == 1 and f["classes"]["host_failures"] == 1
        got = wait_etcd(etcd, fleet_prefix, lambda g: g["host-b"].host_failures == 1)
        assert sum(t.host_failures for t in got.values()) == 1  # the fleet's figure

        wait_kept(b, lambda kept: kept["moves"] == 1)  # in B's store: a kill keeps it
        b.daemon.kill()  # B's daemon dies and restarts; the job's ranks say hello again
        b.daemon.wait()
        b.start_daemon()
        again = [peers(b) for _ in range(2)]
        for rank in (1, 0):
            again[rank].hello("m", rank=rank, pid=4000 + rank, **back)
        f = b.wait_fleet(lambda f: f["up"] and f["classes"]["moves_pending"] == 0)
        assert f["classes"]["moves"] == 1 and f["classes"]["host_failures"] == 1
        got = wait_etcd(etcd, fleet_prefix, lambda g: "m" in g["host-b"].seen)
        assert sum(t.host_failures for t in got.values()) == 1
    finally:
        for h in (a, b):
            h.discard()


@pytest.mark.slow
def test_without_etcd_a_daemon_keeps_its_own_figures(hosts_root: Path, peers):
    (a,) = hosts_of(hosts_root, "http://127.0.0.1:9", "/adaptd/", "host-a")  # nothing there
    try:
        process_failure(peers(a), peers(a), "j")
        f = a.wait_fleet(lambda f: f["classes"]["process"].get("j", {}).get("failures"))
        assert not f["up"]
        c = f["classes"]
        assert c["process"]["j"]["failures"] == c["process"]["j"]["fleet_failures"] == 1
        assert c["fleet_host_failures"] == c["host_failures"] == 0
    finally:
        a.discard()


def test_a_record_without_classes_is_read_and_counts_for_nothing():
    """A daemon before the classes publishes records without the key; a daemon with them
    reads those records as ever (the failure totals) and adds nothing to the classes."""
    old = json.dumps({"version": 1, "gpu_seconds": 5e6, "failures": 3.0, "lifetimes": [],
                      "survivals": [], "updated": 1.0}).encode()  # fmt: skip
    rec = FailureRecord.from_json("old-host", "H100", old)
    assert rec.failures == 3.0 and rec.classes is None
    mine = FleetClasses("new-host", time.monotonic)
    mine.refresh([rec], read_at=time.monotonic())
    assert mine.host_rate.others_failures == 0 == mine.host_rate.others_gpu_seconds
    new = FailureRecord(host="x", gpu_model="H100", classes=mine.totals().to_dict())
    assert set(json.loads(old)) <= set(json.loads(new.to_json()))  # what older daemons read


def test_host_failures_pool_fleet_wide_and_process_failures_per_job():
    now = time.monotonic()
    a = FleetClasses("host-a", time.monotonic)
    b = FleetClasses("host-b", time.monotonic)
    on_a = a.bind("j", FailureClasses())
    on_a.failure("process")
    on_a.failure("host")
    on_a.observe(100.0, gpus=8)
    rec = FailureRecord(host="host-a", gpu_model="m", updated=1.0, classes=a.totals().to_dict())
    b.refresh([rec], read_at=now)
    j, k = b.bind("j", FailureClasses()), b.bind("k", FailureClasses())
    assert j.host is k.host is b.host_rate  # one host class on the host
    assert b.host_rate.others_failures == 1 and b.host_rate.others_gpu_seconds == 800.0
    assert j.process.others_failures == 1 and j.process.others_gpu_seconds == 100.0
    assert k.process.others_failures == 0
    assert j.process.failures == 0  # B's own count: what B publishes
    assert b.totals().process["j"] == (0.0, 0.0)
