"""The fleet fault matrix (issue 26): real ``adaptd serve`` daemons as hosts (each with a
stand-in job saving to one target every host shares, fleet-wide cap of one write) and
a real etcd, under each fault. Each cell checks and prints (run with ``-s``):

- ``writers``: the most saves in flight at once across the fleet (the cap is 1);
- ``unreported``: saves a live job finished that never reached its daemon's history;
- ``free_s`` / ``back_s``: when the slot was free again, when every daemon was back in
  the fleet (all hosts listed, up), from the fault's end.

docs/reliability.md has the table of outcomes; ``FLEET_BACK_S`` is the bound stated
there. Times on the 2-core VM, with other tests running.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import local_etcd
import pytest
from fleet_helpers import settings
from fleet_hosts import SHARED, TTL_S, Host, faketime, max_writers, unreported

from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.failures import FailureRecord

pytestmark = pytest.mark.slow

#: Every daemon is back in the fleet within this many seconds of the fault's end (etcd
#: answering again, a daemon restarted or resumed; for an etcd member lost, of the
#: loss: its election included): a failed round's retry (1 s), a new session and its
#: registration, a status poll; measured at most 11 s on the loaded 2-core VM (an
#: election that took two terms, and a lease of the tests' 3 s TTL lost meanwhile).
FLEET_BACK_S = 15.0
HOLDER = ["host-a/job-host-a"]


def report(cell: str, **figures: object) -> None:
    shown = " ".join(
        f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
    )
    print(f"\nMATRIX {cell}: {shown}")


@contextlib.contextmanager
def fleet(
    root: Path, etcd: str | Sequence[str], names=("host-a", "host-b"), **kw
) -> Iterator[list[Host]]:
    ckpt = root / "ckpt"
    ckpt.mkdir(exist_ok=True)
    hosts: list[Host] = []
    try:
        for n in names:  # every daemon starts at once, then every job
            hosts.append(Host(root, n, etcd, ckpt, wait=False, **kw.get(n, {})))
        for h in hosts:
            h.ready()
        # the jobs start once every daemon is in the fleet: a job's first save decided
        # before its daemon joined (or sampled the job's storage) is local (a limit
        # stated in docs/reliability.md), which is not what these cells look at
        for h in hosts:
            h.wait_fleet(lambda f: f["up"] and len(f["hosts"]) == len(names), 60)
        for h in hosts:
            if kw.get(h.name, {}).get("job", True):
                h.start_job()
        yield hosts
    finally:
        for h in hosts:
            h.begin_stop()
        for h in hosts:
            h.stop()


def back(hosts: list[Host], since: float, timeout_s: float = 30.0) -> float:
    """Seconds from ``since`` until every host shows every host, up."""
    for h in hosts:
        h.wait_fleet(lambda f: f["up"] and len(f["hosts"]) == len(hosts), timeout_s)
    return time.monotonic() - since


def holders(host: Host) -> list[str]:
    return host.fleet()["targets"].get(SHARED, {}).get("holders", [])


def test_the_holder_sigkilled_frees_the_slot_within_the_ttl(own_etcd, hosts_root) -> None:
    with fleet(hosts_root, own_etcd.url) as (a, b):
        b.wait_fleet(lambda f: f["targets"].get(SHARED, {}).get("holders") == HOLDER, 60)
        a.kill()  # the host dies: daemon and job
        t0 = time.monotonic()
        b.wait_fleet(lambda f: f["targets"].get(SHARED, {}).get("holders") != HOLDER, 15)
        free_s = time.monotonic() - t0
        b.next_saves(1, 30)
        a.daemon = a.start_daemon()  # the host comes back
        t1 = time.monotonic()
        a.start_job()
        back_s = back([a, b], t1)
        a.next_saves(1, 60)
        b.next_saves(1, 30)
        writers = max_writers(a.all_saves + b.all_saves)
        lost = unreported(b)
    report("holder-sigkill", writers=writers, unreported=len(lost), free_s=free_s, back_s=back_s)
    assert writers <= 1 and not lost
    assert free_s <= TTL_S + 1.5 and back_s <= FLEET_BACK_S


def test_the_holder_frozen_past_its_lease_does_not_write_on_it_after(own_etcd, hosts_root) -> None:
    """SIGSTOP the holder's host (daemon and job) for twice the lease TTL: the other host
    takes the slot; once resumed, the frozen host starts no save on the lease it lost."""
    with fleet(hosts_root, own_etcd.url) as (a, b):
        b.wait_fleet(lambda f: f["targets"].get(SHARED, {}).get("holders") == HOLDER, 60)
        a.signal(signal.SIGSTOP, job=True)
        frozen = time.monotonic()
        b.wait_fleet(lambda f: "host-a" not in f["hosts"], 3 * TTL_S)
        free_s = time.monotonic() - frozen
        b_during = b.next_saves(1, 30)
        while time.monotonic() - frozen < 2 * TTL_S:
            time.sleep(0.05)  # frozen for twice the TTL, by design
        a.signal(signal.SIGCONT, job=True)
        resumed = time.monotonic()
        back_s = back([a, b], resumed)
        a.next_saves(1, 60)
        b.next_saves(1, 30)
        saves = a.all_saves + b.all_saves
        # a save the job was told to take before it froze (the plan reached it, its
        # step had not come) starts as it resumes, before any new plan can reach it
        told = [p for p in a.plans if p["t"] < frozen][-1:]
        told_step = told[0]["plan"] if told else None
        new_a = [s for s in a.all_saves if s["start"] > resumed and s["save"] != told_step]
        fenced = max_writers([*new_a, *(s for s in b.all_saves if s["end"] > resumed)])
        told_saves = [s for s in a.all_saves if s["start"] > resumed and s["save"] == told_step]
        in_flight = [s for s in a.all_saves if s["start"] < frozen < s["end"]]
        writers = max_writers(saves)
        lost = unreported(a) | unreported(b)
    report("holder-sigstop", writers=writers, after_resume=fenced, frozen_writes=len(in_flight),
           told_before=len(told_saves),
           unreported=len(lost), free_s=free_s, back_s=back_s,
           b_saved_meanwhile=len(b_during))  # fmt: skip
    assert fenced <= 1 and not lost and back_s <= FLEET_BACK_S
    # a write already in flight when its host froze ends after it resumes, and a save it
    # was told to take before starts (nothing in adaptd can stop them; docs/reliability.md):
    # the only overlaps there may be
    assert writers <= 1 + len(in_flight) + len(told_saves)


def test_etcd_wiped_under_running_daemons(own_etcd, hosts_root) -> None:
    """etcd comes back empty (its data directory gone): no key, lease or revision of
    before. The daemons notice their leases are gone and register again."""
    with fleet(hosts_root, own_etcd.url) as (a, b):
        a.next_saves(1, 60)
        b.next_saves(1, 60)
        own_etcd.wipe()
        t0 = time.monotonic()
        back_s = back([a, b], t0)
        assert set(own_etcd.keys("/adaptd/members/")) == {
            "/adaptd/members/host-a",
            "/adaptd/members/host-b",
        }
        after = time.monotonic()
        a.next_saves(1, 60)
        b.next_saves(1, 60)
        rejoins = a.fleet()["rejoins"] + b.fleet()["rejoins"]
        writers_after = max_writers([s for s in a.all_saves + b.all_saves if s["start"] > after])
        writers = max_writers(a.all_saves + b.all_saves)
        lost = unreported(a) | unreported(b)
    report("etcd-wiped", writers=writers, writers_after=writers_after, unreported=len(lost),
           back_s=back_s, rejoins=rejoins)  # fmt: skip
    assert writers_after <= 1 and not lost and back_s <= FLEET_BACK_S and rejoins >= 2


def test_a_three_member_etcd_losing_one_member_then_a_second(hosts_root) -> None:
    """One member down: the daemons go on through the others (quorum holds). A second
    down: no quorum, etcd answers nothing; the daemons decide locally. The members come
    back: every daemon is back in the fleet."""
    try:
        ctx = local_etcd.cluster(hosts_root / "etcd")
        members = ctx.__enter__()
    except local_etcd.EtcdMissing as exc:
        pytest.skip(str(exc))
    try:
        urls = [m.url for m in members]
        with fleet(hosts_root, urls) as (a, b):
            a.next_saves(1, 60)
            logged = {h.name: h.log_size() for h in (a, b)}
            members[0].kill()
            one_down = time.monotonic()
            a.next_saves(2, 60)
            b.next_saves(2, 60)
            one = [s for s in a.all_saves + b.all_saves if s["start"] > one_down]
            # the member killed may have been the leader: an election (1-3 s on the
            # loaded VM) during which etcd answers nothing; then the daemons are there
            up_one = a.fleet()["up"] and b.fleet()["up"]
            back_one_s = back([a, b], one_down)
            local_one = [h.name for h in (a, b) if h.went_local(logged[h.name])]
            members[1].kill()
            two_down = time.monotonic()
            a.wait_fleet(lambda f: not f["up"], 15)
            local_s = time.monotonic() - two_down
            assert a.went_local(logged[a.name]), "the log says nothing of a known down"
            a.next_saves(1, 60)  # saves go on, decided locally
            b.next_saves(1, 60)
            members[0].start()
            members[1].start()
            t0 = time.monotonic()
            back_s = back([a, b], t0)
            after = time.monotonic()
            a.next_saves(1, 60)
            b.next_saves(1, 60)
            writers_one = max_writers(one)
            writers_after = max_writers(
                [s for s in a.all_saves + b.all_saves if s["start"] > after]
            )
            writers = max_writers(a.all_saves + b.all_saves)
            lost = unreported(a) | unreported(b)
    finally:
        ctx.__exit__(None, None, None)
    report("etcd-3-members", writers_one_down=writers_one, up_at_once=up_one,
           back_one_s=back_one_s, local_one_down=",".join(local_one) or "none",
           local_s=local_s, writers=writers, writers_after=writers_after,
           unreported=len(lost), back_s=back_s)  # fmt: skip
    # one member down: quorum holds and the cap with it, unless a daemon's view went down
    # meanwhile (the killed member led, and an election, or calls past the test's 0.5 s
    # call_timeout_s on a loaded box, outlasted the view's 3 s): then it decided locally,
    # as docs/fleet.md says (seen once in a two-process suite run: down 8.8 s, 2 writers)
    assert writers_one <= 1 or local_one, "more writers than the cap, every view up"
    assert back_one_s <= FLEET_BACK_S
    assert local_s <= 5.0 + 1.0  # the documented fall-back bound (plus a status poll)
    assert writers_after <= 1 and not lost and back_s <= FLEET_BACK_S


def test_two_hosts_whose_clocks_are_30_s_apart(own_etcd, hosts_root) -> None:
    """host-b's wall clock runs 30 s ahead (libfaketime; its monotonic clock is its
    own). Claims stamp wall-clock times and the queue is ordered by work at risk at
    a moment; both hosts must still agree on who is next, and keep their leases."""
    skew = {"host-b": {"env": faketime("+30s")}}
    with fleet(hosts_root, own_etcd.url, **skew) as (a, b):
        start = time.monotonic()
        a.next_saves(2, 90)
        b.next_saves(1, 90)
        took = time.monotonic() - start
        writers = max_writers(a.all_saves + b.all_saves)
        lost = unreported(a) | unreported(b)
        grants = a.fleet()["grants"] + b.fleet()["grants"]
    report("clocks-30s-apart", writers=writers, unreported=len(lost), seconds_for_3=took,
           grants=grants)  # fmt: skip
    assert writers <= 1 and not lost and grants >= 3


def test_a_free_slot_goes_at_once_whatever_the_hosts_clocks(own_etcd) -> None:
    """The queue for a slot is ordered by work at risk, which grows while a job waits.
    Measured on each owner's wall clock, hosts 30 s apart each put the other first
    when their jobs' GPU counts differ, and both waited while the slot was free (26 s
    here before the fix). host-b's wall clock is injected 30 s ahead."""
    url = own_etcd.url
    target = "nfs://10.0.4.20/export/ckpt"
    c = FleetAgent(settings(url, "host-c"), poll_s=0.2).start()
    a = FleetAgent(settings(url, "host-a"), poll_s=0.2).start()
    b = FleetAgent(settings(url, "host-b"), poll_s=0.2, wall=lambda: time.time() + 30).start()
    try:
        c.want("jc", target, cap=1, at_risk_gpu_s=1e6, gpus=8)
        c.wait_for(lambda v: "jc" in v.granted, 10)
        a.want("ja", target, cap=1, at_risk_gpu_s=100, gpus=8)
        b.want("jb", target, cap=1, at_risk_gpu_s=300, gpus=1)
        a.wait_for(lambda v: "ja" in v.waiting, 10)
        b.wait_for(lambda v: "jb" in v.waiting, 10)
        c.release("jc")
        t0 = time.monotonic()
        b.wait_for(lambda v: "jb" in v.granted, 20)  # more at risk: first, and at once
        granted_s = time.monotonic() - t0
        assert "ja" in a.view().waiting
    finally:
        for agent in (a, b, c):
            agent.stop()
    report("clocks-30s-apart-queue", granted_s=granted_s)
    assert granted_s < 2.0  # a watch's wake-up, not the clocks' offset


def test_a_daemon_joins_over_tls_and_one_without_a_client_certificate_is_told_why(
    hosts_root,
) -> None:
    """etcd serves https with a CA of the test's and asks clients for a certificate of
    it. A daemon with ``ca_file``, ``cert_file`` and ``key_file`` joins and its job
    saves through the fleet; one without a client certificate stays local and its
    status says what to set. ``$REQUESTS_CA_BUNDLE`` names another bundle, as it does
    on many hosts (it used to override ``ca_file``: every call failed)."""
    try:
        tls = local_etcd.make_tls(hosts_root / "pki", client_cert_auth=True)
        ctx = local_etcd.running(hosts_root / "etcd", tls=tls)
        etcd = ctx.__enter__()
    except local_etcd.EtcdMissing as exc:
        pytest.skip(str(exc))
    env = {"REQUESTS_CA_BUNDLE": str(tls.client_cert), "CURL_CA_BUNDLE": str(tls.client_cert)}
    good = (
        f"ca_file = {json.dumps(str(tls.ca_file))}\n"
        f"cert_file = {json.dumps(str(tls.client_cert))}\n"
        f"key_file = {json.dumps(str(tls.client_key))}\n"
    )
    no_cert = f"ca_file = {json.dumps(str(tls.ca_file))}\n"
    try:
        ckpt = hosts_root / "ckpt"
        ckpt.mkdir()
        a = Host(hosts_root, "host-a", etcd.url, ckpt, fleet=good, env=env)
        c = Host(hosts_root, "host-c", etcd.url, ckpt, fleet=no_cert, env=env, job=False)
        try:
            t0 = time.monotonic()
            joined = a.wait_fleet(lambda f: f["up"] and f["hosts"] == ["host-a"], 30)
            join_s = time.monotonic() - t0
            a.next_saves(2, 60)
            down = c.wait_fleet(lambda f: not f["up"] and "TLS" in f["reason"], 30)
        finally:
            a.stop()
            c.stop()
    finally:
        ctx.__exit__(None, None, None)
    report("etcd-over-tls", join_s=join_s, grants=joined["grants"], refused=down["reason"][-90:])
    assert joined["endpoints"][0].startswith("https://")
    assert "cert_file and key_file" in down["reason"]


HOSTS_17 = 17
CAP_17 = 6
MODELS = {"h100_8gpu": "NVIDIA H100 80GB HBM3", "a100_8gpu_ecc": "NVIDIA A100-SXM4-80GB"}


def test_17_hosts_of_two_gpu_models_share_slots_members_and_failures(own_etcd, hosts_root) -> None:
    """More hosts than the 16 measured before, of two GPU models (NVML fixtures): every
    daemon lists all 17; their jobs' saves never exceed the fleet-wide cap of 6 and
    every host saves; each daemon learns the failures other hosts published for its
    own GPU model only (H100: 40 in 5e8 GPU-s, A100: 4 in 5e8 GPU-s)."""
    publisher = FleetAgent(settings(own_etcd.url, "host-old"), poll_s=0.5)
    for fixture, failures in (("h100_8gpu", 40), ("a100_8gpu_ecc", 4)):
        publisher.publish(FailureRecord("host-old", MODELS[fixture], gpu_seconds=5e8,
                                        failures=failures))  # fmt: skip
    assert publisher.poll_once().up
    publisher.stop()
    names = [f"h{i:02d}" for i in range(HOSTS_17)]
    # io_aware's bound on a deferral (max_defer x the interval) lets a save go without a
    # slot once it is reached: by design, so that the fleet never holds a save back for
    # ever. 17 hosts queue longer than the 20 s bound of the other cells: 50 s here.
    policy = "io_aware:inner=fixed:steps=250,max_defer=10"
    kinds = {n: {"nvml": "h100_8gpu" if i % 2 == 0 else "a100_8gpu_ecc", "cap": CAP_17,
                 "policy": policy} for i, n in enumerate(names)}  # fmt: skip
    t0 = time.monotonic()
    with fleet(hosts_root, own_etcd.url, names=names, **kinds) as hosts:
        members_s = time.monotonic() - t0
        for h in hosts:
            h.next_saves(1, 120)
        # every daemon lists all 17: waited for, not read once. 34 processes on CI's 2
        # cores have let a daemon's keepalive miss the tests' 3 s TTL (a snapshot saw 15
        # of 17); its lease goes, it rejoins (counted in ``rejoins``) within FLEET_BACK_S
        views = {
            h.name: h.wait_fleet(lambda f: f["up"] and len(f["hosts"]) == HOSTS_17, FLEET_BACK_S)
            for h in hosts
        }
        writers = max_writers([s for h in hosts for s in h.all_saves])
        lost = set().union(*(unreported(h) for h in hosts))
    for name, view in views.items():
        model = MODELS[kinds[name]["nvml"]]
        assert len(view["hosts"]) == HOSTS_17 + 0 and view["gpu_model"] == model, view
        expected = 40 if "H100" in model else 4
        assert view["fleet_failures"] == pytest.approx(expected), (name, view["fleet_failures"])
    starts = sorted(s["start"] for h in hosts for s in h.all_saves)
    report("17-hosts-2-models", writers=writers, unreported=len(lost), members_s=members_s,
           all_saved_s=starts[-1] - starts[0], saves=len(starts),
           rejoins=sum(v["rejoins"] for v in views.values()))  # fmt: skip
    assert writers <= CAP_17 and not lost
