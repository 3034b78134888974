"""Write slots: the pure grant rule, then several members against one real etcd."""

from __future__ import annotations

import itertools
import json
import threading
import time
from urllib.parse import quote

import pytest
from fleet_helpers import Etcd, MemberProc, holders, settings

from adaptd.fleet.agent import FleetAgent
from adaptd.fleet.membership import (
    NUMBERED_SLOTS,
    PER_TARGET_GRANTS,
    Member,
    read_members,
    register,
)
from adaptd.fleet.session import EtcdSession, Guard, Put
from adaptd.fleet.slots import (
    PATIENCE_S,
    Claim,
    SlotTable,
    Want,
    may_take,
    place_in_line,
    queue_order,
    releases_needed,
    target_view,
)

T = "nfs://10.0.4.20/export/ckpt"


def claim(host, job, *, holding=False, risk=0.0, gpus=1, stamped=0.0, cap=2, rev=0):
    return Claim(host, T, job, holding, risk, gpus, stamped, cap, rev)


# ---------------------------------------------------------------------- the rule (pure)


def test_queue_serves_the_most_work_at_risk_first_then_the_first_to_ask():
    a = claim("h1", "a", risk=100, rev=5)
    b = claim("h2", "b", risk=900, rev=9)
    c = claim("h3", "c", risk=100, rev=3)
    assert [x.job for x in queue_order([a, b, c], wall=0)] == ["b", "c", "a"]


def test_work_at_risk_grows_with_the_gpus_while_waiting():
    small = claim("h1", "small", risk=1000, gpus=1, stamped=0)
    big = claim("h2", "big", risk=0, gpus=512, stamped=0)
    assert queue_order([small, big], wall=1)[0].job == "small"
    assert queue_order([small, big], wall=10)[0].job == "big"  # 5120 GPU-s at risk by now


@pytest.mark.parametrize(
    ("claims", "me", "ok", "why"),
    [
        ([], claim("h1", "a"), True, "slot 1 of 2"),
        ([claim("h2", "x", holding=True)], claim("h1", "a"), True, "slot 2 of 2"),
        (
            [claim("h2", "x", holding=True), claim("h3", "y", holding=True)],
            claim("h1", "a", risk=1e9),
            False,
            "all 2 slot(s)",
        ),
        # one free slot, a waiter with more at risk goes first
        (
            [claim("h2", "x", holding=True), claim("h3", "y", risk=50, rev=1)],
            claim("h1", "a", risk=10),
            False,
            "1 job(s) with more work at risk",
        ),
        # two free slots: the second in the queue need not wait for the first
        ([claim("h3", "y", risk=50, rev=1)], claim("h1", "a", risk=10), True, "slot 1 of 2"),
        # the smallest cap any claim carries wins
        ([claim("h2", "x", holding=True, cap=1)], claim("h1", "a"), False, "all 1 slot(s)"),
        ([claim("h1", "a", holding=True)], claim("h1", "a"), True, "already holds"),
    ],
)
def test_may_take(claims, me, ok, why):
    view = target_view(claims, T, 2, wall=0)
    got, reason = may_take(view, me, wall=0)
    assert got is ok
    assert why in reason


@pytest.mark.parametrize(
    ("claims", "me", "place", "needed"),
    [
        # two free slots, two waiters: both may take, the second after the first
        ([claim("h1", "a", risk=10), claim("h2", "b", risk=5)], claim("h2", "b", risk=5), 1, 1),
        ([claim("h1", "a", risk=10), claim("h2", "b", risk=5)], claim("h1", "a", risk=10), 0, 1),
        # one slot held, one free, third in line: two claims must go first
        (
            [claim("h0", "x", holding=True), claim("h1", "a", risk=10), claim("h2", "b", risk=5),
             claim("h3", "c", risk=1)],
            claim("h3", "c", risk=1), None, 2,
        ),
        # all held: the first waiter needs one release
        (
            [claim("h0", "x", holding=True), claim("h4", "y", holding=True),
             claim("h1", "a", risk=10)],
            claim("h1", "a", risk=10), None, 1,
        ),
        ([claim("h1", "a", holding=True)], claim("h1", "a", holding=True), None, 1),
    ],
)  # fmt: skip
def test_place_in_line_and_releases_needed(claims, me, place, needed):
    """Who takes a free slot in which turn, and how many claims must go before a waiter
    is worth waking (the storm of issue 35 wakes only those)."""
    view = target_view(claims, T, 2, wall=0)
    assert place_in_line(view, me, wall=0) == place
    assert releases_needed(view, me.owner) == needed


def test_a_claim_refuses_impossible_figures():
    with pytest.raises(ValueError, match="cap must be >= 1"):
        claim("h1", "a", cap=0)
    with pytest.raises(ValueError, match="at_risk_gpu_s"):
        claim("h1", "a", risk=-1)


# ---------------------------------------------------------------------- against etcd


def agent(etcd: Etcd, host: str, prefix: str, **kw) -> FleetAgent:
    return FleetAgent(settings(etcd.url, host, prefix, **kw), poll_s=0.2).start()


def test_slots_are_granted_up_to_the_cap_and_passed_on_at_release(etcd: Etcd, fleet_prefix):
    a, b, c = (agent(etcd, h, fleet_prefix) for h in ("host-a", "host-b", "host-c"))
    try:
        a.want("ja", T, cap=2, at_risk_gpu_s=300, gpus=8)
        a.wait_for(lambda v: "ja" in v.granted, 10)
        b.want("jb", T, cap=2, at_risk_gpu_s=200, gpus=8)
        b.wait_for(lambda v: "jb" in v.granted, 10)
        c.want("jc", T, cap=2, at_risk_gpu_s=100, gpus=8)
        view = c.wait_for(lambda v: "jc" in v.waiting, 10)
        assert [h.job for h in view.targets[T].holders] == ["ja", "jb"]
        assert holders(etcd, fleet_prefix) == [("host-a", T, "ja"), ("host-b", T, "jb")]
        a.release("ja")
        c.wait_for(lambda v: "jc" in v.granted, 10)
        a.wait_for(lambda v: not v.granted, 10)
        assert holders(etcd, fleet_prefix) == [("host-b", T, "jb"), ("host-c", T, "jc")]
        assert {h for h in c.view().hosts} == {"host-a", "host-b", "host-c"}
        roles = sorted(x.view().role for x in (a, b, c))
        assert roles == ["leader", "member", "member"]  # the first registered leads
    finally:
        for x in (a, b, c):
            x.stop()
    assert etcd.keys(fleet_prefix) == []  # a clean stop leaves nothing behind


def test_the_job_with_the_most_work_at_risk_goes_first(etcd: Etcd, fleet_prefix):
    holder, small, big = (agent(etcd, h, fleet_prefix) for h in ("h0", "h1", "h2"))
    try:
        holder.want("j0", T, cap=1, at_risk_gpu_s=0, gpus=1)
        holder.wait_for(lambda v: "j0" in v.granted, 10)
        small.want("j-small", T, cap=1, at_risk_gpu_s=10, gpus=1)  # asked first
        small.wait_for(lambda v: "j-small" in v.waiting, 10)
        big.want("j-big", T, cap=1, at_risk_gpu_s=1e6, gpus=64)
        big.wait_for(lambda v: "j-big" in v.waiting, 10)
        holder.release("j0")
        big.wait_for(lambda v: "j-big" in v.granted, 10)
        assert "j-small" in small.wait_for(lambda v: v.last_ok is not None, 1).waiting
        big.release("j-big")
        small.wait_for(lambda v: "j-small" in v.granted, 10)
    finally:
        for x in (holder, small, big):
            x.stop()


@pytest.mark.slow
def test_a_cap_of_one_holds_across_member_processes(etcd: Etcd, fleet_prefix):
    """Three processes each take the one slot three times; etcd never shows two holders
    and no two processes' holds overlap."""
    procs = [MemberProc(etcd.url, fleet_prefix, f"host-{i}") for i in range(3)]
    most = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal most
        while not stop.is_set():
            most = max(most, len(holders(etcd, fleet_prefix)))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    spans: list[tuple[float, float, str]] = []
    lock = threading.Lock()

    def cycle(p: MemberProc) -> None:
        for n in range(3):
            job = f"{p.host}-save{n}"
            p.send(f"want {job} {T} 1 {100 * (n + 1)} 8")
            got = p.wait(lambda v, j=job: j in v["granted"], 60)["t"]
            time.sleep(0.2)  # the save "writes" for a while
            released = time.monotonic()
            p.send(f"release {job}")
            p.wait(lambda v, j=job: j not in v["granted"], 30)
            with lock:
                spans.append((got, released, p.host))

    workers = [threading.Thread(target=cycle, args=(p,)) for p in procs]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert not any(w.is_alive() for w in workers), "a member never got its slot"
    finally:
        stop.set()
        sampler.join(5)
        for p in procs:
            p.close()
    assert len(spans) == 9
    assert most == 1
    spans.sort()
    for (_, end, h1), (start, _, h2) in itertools.pairwise(spans):
        assert start >= end, f"{h1} and {h2} held the one slot at once"


@pytest.mark.slow
def test_a_killed_holder_frees_its_slot_within_the_lease_ttl(etcd: Etcd, fleet_prefix):
    ttl = 3
    holder = MemberProc(etcd.url, fleet_prefix, "doomed", ttl=ttl)
    waiter = agent(etcd, "survivor", fleet_prefix)
    try:
        holder.send(f"want j-doomed {T} 1 100 8")
        holder.wait(lambda v: "j-doomed" in v["granted"], 20)
        waiter.want("j-next", T, cap=1, at_risk_gpu_s=50, gpus=8)
        waiter.wait_for(lambda v: "j-next" in v.waiting, 10)
        killed = holder.kill()
        waiter.wait_for(lambda v: "j-next" in v.granted, ttl + 5)
        freed_after = time.monotonic() - killed
        assert freed_after <= ttl + 1.5, f"slot freed {freed_after:.1f}s after the kill"
        assert "doomed" not in waiter.view().hosts
    finally:
        holder.close()
        waiter.stop()


def test_two_daemons_deciding_from_the_same_state_cannot_both_take_the_last_slot(
    etcd: Etcd, fleet_prefix
):
    """The race the grant transaction exists for, made deterministic: both read an
    empty target with one slot, both may take it; the second write must lose."""
    ta, tb = (SlotTable(EtcdSession(settings(etcd.url, h, fleet_prefix)).open()) for h in "ab")
    me_a = Claim("a", T, "ja", cap=1)
    me_b = Claim("b", T, "jb", cap=1)
    claims_a, seen_a = ta.read()
    claims_b, seen_b = tb.read()
    assert ta.try_take(me_a, claims_a, seen_a, wall=0) is True
    assert tb.try_take(me_b, claims_b, seen_b, wall=0) is None  # lost: re-read
    claims_b, seen_b = tb.read()
    assert tb.try_take(me_b, claims_b, seen_b, wall=0) is False  # its turn has not come
    assert holders(etcd, fleet_prefix) == [("a", T, "ja")]
    ta.session.close()
    tb.session.close()


def _member_tables(
    etcd: Etcd, prefix: str, hosts: str, grants: str = NUMBERED_SLOTS, clock=time.monotonic
):
    """One table per host, registered as a member whose record says ``grants``; each
    table knows the members as the agent would tell it (issue 35's rules). The members'
    records say what this code takes by, but the tables are this code: ``per-target``
    makes them take as a fleet with a member of the previous version up does. ``clock``:
    the sessions' (the clock of the ``wall`` their syncs are given)."""
    tables = []
    for h in hosts:
        s = EtcdSession(settings(etcd.url, h, prefix), clock=clock).open()
        register(s, Member(h, 1, 0.0, "test", grants=grants))
        tables.append(SlotTable(s, marked=s.keys.members))
    members = read_members(tables[-1].session)
    for t in tables:
        t.per_target_through = members.newest if members.grant_per_target else None
        t.numbered_through = members.newest if members.grant_numbered else None
    return tables


def _queue(tables, cap: int) -> None:
    """Each table's host puts a waiter's claim for job ``j{host}`` on ``T``, in order."""
    for t in tables:
        c = Claim(t.host, T, f"j{t.host}", cap=cap)
        t.session.put(t.keys.claim(t.host, T, c.job), c.record(), leased=True)


@pytest.mark.parametrize(("rule", "second"), [(NUMBERED_SLOTS, True), (PER_TARGET_GRANTS, None)])
def test_takers_of_two_free_slots_from_one_state_both_win_with_numbered_slots(
    etcd: Etcd, fleet_prefix, rule, second
):
    """Issue 35: with one grant key per target, rewritten by every grant, the takers of
    one target's free slots from the same read all lost but one (0.5 conflicts per grant
    in a storm of 200 hosts). Numbered slots: the first in line takes slot 0, the second
    slot 1, and both transactions go through; the cap still stops the third."""
    ta, tb, tc = _member_tables(etcd, fleet_prefix, "abc", grants=rule)
    _queue((ta, tb, tc), cap=2)
    (ca, sa), (cb, sb), (cc, sc) = (t.read(now=0.0) for t in (ta, tb, tc))
    assert ta.numbered is (rule == NUMBERED_SLOTS)
    assert ta.try_take(next(c for c in ca if c.host == "a"), ca, sa, wall=0) is True
    assert tb.try_take(next(c for c in cb if c.host == "b"), cb, sb, wall=0) is second
    assert tc.try_take(next(c for c in cc if c.host == "c"), cc, sc, wall=0) is False
    slot_keys = [k for k in etcd.keys(fleet_prefix + "grants/") if ta.keys.slot_parts(k)]
    taken = {"a", "b"} if second else {"a"}
    assert sorted(holders(etcd, fleet_prefix)) == [(h, T, f"j{h}") for h in sorted(taken)]
    assert len(slot_keys) == len(taken)  # one numbered key per holder
    for t in (ta, tb, tc):
        t.session.close()


def test_a_release_frees_the_slot_key_with_the_claim_and_a_stale_one_frees_nothing(
    etcd: Etcd, fleet_prefix
):
    """A release deletes the holder's claim and its slot key in one transaction (a key
    left behind would hold the slot while its daemon lives). A release acting on a claim
    that went with its lease must not delete the key of the host that took the slot
    since."""
    ta, tb = _member_tables(etcd, fleet_prefix, "ab")
    want = {"ja": Want(T, 1, 0.0, 1, 0.0)}
    assert ta.sync(want, wall=0.0).granted == {"ja"}
    slot0 = fleet_prefix + "grants/" + quote(T, safe="") + "/0"
    assert etcd.keys(fleet_prefix + "grants/") == [slot0]
    assert ta.sync({}, wall=1.0).granted == frozenset()
    assert etcd.keys(fleet_prefix + "grants/") == []
    assert tb.sync({"jb": Want(T, 1, 0.0, 1, 0.0)}, wall=1.0).granted == {"jb"}
    # a's old claim, as a read before its lease expired would have shown it
    stale = Claim("a", T, "ja", holding=True, cap=1, create_revision=2, slot=0)
    ta._drop(stale)
    assert etcd.keys(fleet_prefix + "grants/") == [slot0]
    assert holders(etcd, fleet_prefix) == [("b", T, "jb")]
    for t in (ta, tb):
        t.session.close()


def test_with_a_member_of_the_previous_version_up_a_grant_rewrites_the_target_grant_key(
    etcd: Etcd, fleet_prefix
):
    """A rolling upgrade from per-target grants: that daemon's take compares the target's
    grant key as it read it. While one is up, this code rewrites that key with every
    grant (and takes a numbered slot too), so the older daemon's take from before it
    loses; once every member takes numbered slots, the grant key is left alone."""
    ta, tb = _member_tables(etcd, fleet_prefix, "ab", grants=PER_TARGET_GRANTS)
    grant_key = fleet_prefix + "grants/" + quote(T, safe="")
    before = tb.session.get_prefix(grant_key)  # what the older daemon compares: absent
    assert before == []
    claims, seen = ta.read(now=0.0)
    assert ta.per_target and not ta.numbered
    assert ta.try_take(Claim("a", T, "ja", cap=2), claims, seen, wall=0) is True
    assert grant_key in etcd.keys(fleet_prefix + "grants/")
    older_take = tb.session.put_all_if(
        [Put(tb.keys.claim("b", T, "jb"), b"{}", leased=True)], [Guard.key_at(grant_key, 0)]
    )
    assert older_take is False
    for t in (ta, tb):
        t.session.close()


def test_a_grant_on_one_target_is_not_retried_for_claims_and_grants_on_another(
    etcd: Etcd, fleet_prefix
):
    """Issue 35: a grant compared the whole claims range, so a claim on target B made a
    grant on target A retry (a storm on one target starved every other). Now a grant
    compares A's grant key alone; a take on A by another host still makes it lose."""
    ta, tb, tc = _member_tables(etcd, fleet_prefix, "abc")
    other = "nfs://10.0.4.21/export/other"
    claims_a, seen_a = ta.read()
    assert ta.per_target
    tb.sync({"jb": Want(other, 1, 10.0, 1, 0.0)}, wall=0)  # a claim and a grant on B
    assert ta.try_take(Claim("a", T, "ja", cap=1), claims_a, seen_a, wall=0) is True
    claims_c, seen_c = tc.read()  # A's last slot is taken by now: c waits
    assert tc.try_take(Claim("c", T, "jc", cap=1), claims_c, seen_c, wall=0) is False
    assert sorted(holders(etcd, fleet_prefix)) == [("a", T, "ja"), ("b", other, "jb")]
    for t in (ta, tb, tc):
        t.session.close()


@pytest.mark.parametrize("rule", [NUMBERED_SLOTS, PER_TARGET_GRANTS])
def test_two_per_target_grants_from_the_same_state_cannot_both_take_the_last_slot(
    etcd: Etcd, fleet_prefix, rule
):
    ta, tb = _member_tables(etcd, fleet_prefix, "ab", grants=rule)
    claims_a, seen_a = ta.read()
    claims_b, seen_b = tb.read()
    assert ta.per_target and tb.per_target
    assert ta.try_take(Claim("a", T, "ja", cap=1), claims_a, seen_a, wall=0) is True
    assert tb.try_take(Claim("b", T, "jb", cap=1), claims_b, seen_b, wall=0) is None
    assert holders(etcd, fleet_prefix) == [("a", T, "ja")]
    for t in (ta, tb):
        t.session.close()


def test_a_daemon_from_before_per_target_grants_makes_every_grant_compare_every_claim(
    etcd: Etcd, fleet_prefix
):
    """A rolling upgrade: an old daemon takes by the whole-range compare and writes no
    grant key. While one is up the others compare the whole range too; one that joins
    after a per-target daemon read the members makes that daemon's grant lose."""
    ta, tb = _member_tables(etcd, fleet_prefix, "ab")
    claims_a, seen_a = ta.read()
    assert ta.per_target
    old = EtcdSession(settings(etcd.url, "old", fleet_prefix)).open()
    old.put(old.keys.member("old"), b'{"host": "old", "pid": 1, "started": 0, "version": "0"}',
            leased=True)  # fmt: skip
    # the old daemon joined after a's read: a's per-target grant must not go through
    assert ta.try_take(Claim("a", T, "ja", cap=1), claims_a, seen_a, wall=0) is None
    members = read_members(ta.session)
    assert not members.grant_per_target
    ta.per_target_through = tb.per_target_through = None  # what the agents learn
    ta.numbered_through = tb.numbered_through = None
    claims_a, seen_a = ta.read()
    assert not ta.per_target and not ta.numbered
    other = "nfs://10.0.4.21/export/other"
    tb.sync({"jb": Want(other, 1, 10.0, 1, 0.0)}, wall=0)
    assert ta.try_take(Claim("a", T, "ja", cap=1), claims_a, seen_a, wall=0) is None
    for s in (ta.session, tb.session, old):
        s.close()


def test_agents_take_numbered_slots_once_every_member_does(etcd: Etcd, fleet_prefix):
    a = agent(etcd, "pa", fleet_prefix)
    b = agent(etcd, "pb", fleet_prefix)
    try:
        a.want("j", T, cap=1, at_risk_gpu_s=1, gpus=1)
        a.wait_for(lambda v: "j" in v.granted and len(v.hosts) == 2, 10)
        b.want("j", T, cap=1, at_risk_gpu_s=1, gpus=1)
        b.wait_for(lambda v: "j" in v.waiting, 10)
        assert a._table is not None and a._table.numbered
        grant_key = fleet_prefix + "grants/" + quote(T, safe="")
        session = a._table.session

        def grant_key_revision() -> int:
            # a's take may have written it: the members changed (b joined) under it
            return next((e.mod_revision for e in session.get_prefix(grant_key)
                         if e.key == grant_key), 0)  # fmt: skip

        before = grant_key_revision()
        a.release("j")
        b.wait_for(lambda v: "j" in v.granted, 10)
        # slot 0 is b's now, and b's grant left the per-target grant key alone
        slots = [e for e in session.get_prefix(grant_key + "/")]
        assert [(e.key, json.loads(e.value)["host"]) for e in slots] == [(grant_key + "/0", "pb")]
        assert grant_key_revision() == before
    finally:
        a.stop()
        b.stop()


def test_a_waiter_in_line_that_does_not_take_a_free_slot_is_passed_over(etcd: Etcd, fleet_prefix):
    """Daemons order a queue by when each first saw a claim, so two can each put the
    other ahead while a slot stays free (issue 35: grants 17 s late in a storm on 4
    targets). A waiter seen in line for PATIENCE_S without taking is passed over."""
    ta, tb = _member_tables(etcd, fleet_prefix, "ab")
    stuck = Claim("b", T, "jb", at_risk_gpu_s=100.0, cap=1)  # first in line; never takes
    tb.session.put(tb.keys.claim("b", T, "jb"), stuck.record(), leased=True)
    want = {"ja": Want(T, 1, 0.0, 1, 0.0)}
    assert ta.sync(want, wall=0.0).waiting == {"ja"}
    assert ta.sync(want, wall=PATIENCE_S / 2).waiting == {"ja"}  # b may still take
    assert ta.sync(want, wall=PATIENCE_S + 0.1).granted == {"ja"}
    assert sorted(holders(etcd, fleet_prefix)) == [("a", T, "ja")]
    for t in (ta, tb):
        t.session.close()


def test_a_claim_is_dated_by_its_revision_not_by_when_a_daemon_first_read_it(
    etcd: Etcd, fleet_prefix
):
    """Issue 35: a waiter reads the queue at its turn and every QUEUE_EVERY_S, so it may
    first read another host's claim long after the claim was made. Dated by that read,
    a 64-GPU job that had waited 30 s looked new, and a 1-GPU job with more work at risk
    when it asked took the slot the big one had earned by waiting. Dated by its create
    revision, the big claim is as old to the late reader as to everyone."""
    now = [0.0]
    th, tb, ts = _member_tables(etcd, fleet_prefix, "hbs", clock=lambda: now[0])
    assert th.sync({"j0": Want(T, 1, 0.0, 1, 0.0)}, wall=0.0).granted == {"j0"}
    big = {"j-big": Want(T, 1, 0.0, 64, 0.0)}
    assert tb.sync(big, wall=0.0).waiting == {"j-big"}
    now[0] = 1.0
    ts.session.mark(ts.keys.members)  # any call: the small host's daemon polls etcd
    now[0] = 31.0  # 64 GPUs × 30 s waited: 1,920 GPU-seconds at risk, against 1,000
    small = {"j-small": Want(T, 1, 1000.0, 1, 31.0)}
    assert ts.sync(small, wall=31.0).waiting == {"j-small"}  # its first read of the queue
    stamped = {c.job: c.stamped for c in ts.read(now=31.0)[0]}
    assert stamped["j-big"] == 1.0  # known by its first call after the claim
    assert th.sync({}, wall=31.0).granted == frozenset()  # the release
    assert ts.sync(small, wall=31.5).waiting == {"j-small"}  # the big job's turn
    assert tb.sync(big, wall=31.5).granted == {"j-big"}
    assert holders(etcd, fleet_prefix) == [("b", T, "j-big")]
    for t in (th, tb, ts):
        t.session.close()


def count_claim_reads(*members: FleetAgent) -> dict[str, int]:
    """Reads of the claims (``SlotTable.read``) by each of ``members``' hosts from now
    on, counted in the dict returned (each member's session must be open)."""
    reads = {m.settings.host: 0 for m in members}
    for member in members:
        table = member._table
        assert table is not None
        host, read = member.settings.host, table.read

        def counted(*a, host=host, read=read, **kw):
            reads[host] += 1
            return read(*a, **kw)

        table.read = counted  # type: ignore[method-assign]
    return reads


def test_the_queue_is_read_at_a_waiters_turn_not_at_each_periodic_round(etcd: Etcd, fleet_prefix):
    """Issue 35: every member re-read every claim at each periodic round (10 s), N²/10
    claims a second from etcd in a storm of N hosts on one target (the waiters, and
    those done with their save). Now a waiter not next in line reads the claims when
    enough releases came for its turn, a member with nothing to take not at all (both
    every QUEUE_EVERY_S): here neither reads in 3 s of rounds every 0.3 s, and the slot
    still reaches the waiter at the release."""
    holder = agent(etcd, "h0", fleet_prefix)
    waiter, idle = (
        FleetAgent(settings(etcd.url, h, fleet_prefix), poll_s=0.2, failures_every_s=0.3).start()
        for h in ("h1", "h2")
    )
    try:
        holder.want("j0", T, cap=1, at_risk_gpu_s=0, gpus=1)
        holder.wait_for(lambda v: "j0" in v.granted, 10)
        waiter.want("j1", T, cap=1, at_risk_gpu_s=10, gpus=1)
        waiter.wait_for(lambda v: "j1" in v.waiting, 10)
        idle.wait_for(lambda v: v.up, 10)
        reads = count_claim_reads(waiter, idle)
        rounds = (waiter.view().last_ok, idle.view().last_ok)
        ends = time.monotonic() + 3.0
        while time.monotonic() < ends:  # the wait is the test
            time.sleep(0.1)
        assert waiter.view().last_ok != rounds[0] and idle.view().last_ok != rounds[1]
        assert reads == {"h1": 0, "h2": 0}
        holder.release("j0")
        waiter.wait_for(lambda v: "j1" in v.granted, 10)
        assert reads["h1"] > 0  # at its turn
    finally:
        for x in (holder, waiter, idle):
            x.stop()


def _fleet_of_150(etcd: Etcd, prefix: str, hosts: str):
    """A fleet of 150 hosts up: ``hosts`` (one letter each, named ``h0``, ``h1``…) are
    agents on a made-up clock, each polled once, the rest registered members of a
    session under a 60 s lease. Returns that session, its settings, the clock (a list:
    ``now[0]``) and the agents."""
    sets = settings(etcd.url, "others", prefix, lease_ttl_s=60)
    fleet = EtcdSession(sets).open()
    for i in range(150 - len(hosts)):
        register(fleet, Member(f"m{i:03d}", 1, 0.0, "test"))
    now = [0.0]
    agents = [
        FleetAgent(
            settings(etcd.url, f"h{i}", prefix, lease_ttl_s=60),
            poll_s=0.2,
            failures_every_s=1e9,
            clock=lambda: now[0],
        )
        for i in range(len(hosts))
    ]
    for member in agents:
        member.poll_once()
    return fleet, sets, now, agents


def test_in_a_large_fleet_a_host_with_nothing_waiting_reads_the_claims_less_often(
    etcd: Etcd, fleet_prefix
):
    """Issue 35: every host read every claim every QUEUE_EVERY_S, N²/30 claims a second
    in a long storm of N hosts on one target, most of them done with their save. Now a
    host with nothing waiting reads them every 30 s × (hosts up / 50): with 150 hosts up,
    every 90 s; a host whose job waits still every 30 s (the read that passes over a
    waiter ahead that did not take its slot). Rounds driven on a made-up clock."""
    fleet, _, now, (holder, other) = _fleet_of_150(etcd, fleet_prefix, "ab")
    try:
        reads = count_claim_reads(holder, other)
        holder.want("j0", T, cap=1, at_risk_gpu_s=0, gpus=1)
        now[0] = 1.0
        assert "j0" in holder._poll(sync=True).granted
        holder.release("j0")
        now[0] = 2.0
        assert len(holder._poll(sync=True).hosts) == 150  # the release: nothing of h0 waits
        other.want("j1", T, cap=1, at_risk_gpu_s=10, gpus=1)
        assert "j1" in other._poll(sync=True).granted
        other.want("j2", T, cap=1, at_risk_gpu_s=10, gpus=1)
        assert "j2" in other._poll(sync=True).waiting  # h1's second job waits
        reads.update(h0=0, h1=0)
        seen = {}
        for t in (25.0, 33.0, 61.0, 64.0, 91.0, 95.0):
            now[0] = t
            for member in (holder, other):
                member._poll(sync=False)
            seen[t] = dict(reads)
        # h1's last read was at 2 s: it reads at 33 (30 s on), 64 and 95; h0, with
        # nothing waiting since its release's read at 2 s, only at 95 (90 s on)
        assert seen[25.0] == {"h0": 0, "h1": 0}, seen
        assert seen[61.0] == {"h0": 0, "h1": 1}, seen
        assert seen[91.0] == {"h0": 0, "h1": 2}, seen
        assert seen[95.0] == {"h0": 1, "h1": 3}, seen
        view = holder.view()
        assert view.targets_at == 95.0 and T in view.targets
    finally:
        for x in (holder, other):
            x.stop()
        fleet.close()


def _ahead(fleet: EtcdSession, keys, n: int, risk: float) -> list[str]:
    """``n`` waiting claims of other hosts on ``T`` (1 GPU, ``risk`` GPU-s at risk,
    under ``fleet``'s lease, never taking): the queue ahead of a waiter. Their keys."""
    out = []
    for i in range(n):
        key = keys.claim(f"q{i:02d}", T, f"jq{i}")
        fleet.put(key, Claim(f"q{i:02d}", T, f"jq{i}", at_risk_gpu_s=risk, cap=1).record(),
                  leased=True)  # fmt: skip
        out.append(key)
    return out


def test_a_waiter_far_back_in_line_reads_the_claims_as_seldom_as_a_host_with_nothing_waiting(
    etcd: Etcd, fleet_prefix
):
    """Issue 35: every waiter read every claim every QUEUE_EVERY_S, N²/30 claims a second
    in a long storm of N hosts on one target. Now only a waiter within NEAR_RELEASES of
    its turn does (here h2, first in line); one further back (h1, 8 releases away)
    reads every 30 s × (hosts up / 50), like a host with nothing waiting: every 90 s
    with 150 hosts up. Rounds driven on a made-up clock."""
    fleet, sets, now, (holder, far, near) = _fleet_of_150(etcd, fleet_prefix, "abc")
    try:
        holder.want("j0", T, cap=1, at_risk_gpu_s=0, gpus=1)
        assert "j0" in holder._poll(sync=True).granted
        _ahead(fleet, sets.keys, 6, risk=100.0)
        now[0] = 1.0
        near.want("j2", T, cap=1, at_risk_gpu_s=1000, gpus=1)
        far.want("j1", T, cap=1, at_risk_gpu_s=0, gpus=1)
        reads = count_claim_reads(far, near)
        assert "j2" in near._poll(sync=True).waiting
        view = far._poll(sync=True)
        assert len(view.hosts) == 150 and "j1" in view.waiting
        assert [c.job for c in view.targets[T].waiters][-1] == "j1"  # 8 releases away
        reads.update(h1=0, h2=0)
        seen = {}
        for t in (25.0, 32.0, 62.0, 89.0, 92.0):
            now[0] = t
            for member in (far, near):
                member._poll(sync=False)
            seen[t] = dict(reads)
        assert seen[25.0] == {"h1": 0, "h2": 0}, seen
        assert seen[32.0] == {"h1": 0, "h2": 1}, seen  # the near waiter, 30 s on
        assert seen[89.0] == {"h1": 0, "h2": 2}, seen
        assert seen[92.0] == {"h1": 1, "h2": 3}, seen  # the far one, 90 s on
    finally:
        for x in (holder, far, near):
            x.stop()
        fleet.close()


def test_a_far_waiter_that_comes_near_its_turn_by_releases_reads_the_claims_every_30_s(
    etcd: Etcd, fleet_prefix
):
    """A waiter far back reads the claims seldom, but once the releases it counted on its
    watch bring it within NEAR_RELEASES of its turn it is due the QUEUE_EVERY_S read
    again (the read that passes over a stalled waiter ahead). Made-up clock; the watch
    itself is real."""
    fleet, sets, now, (holder, far) = _fleet_of_150(etcd, fleet_prefix, "ab")
    try:
        holder.want("j0", T, cap=1, at_risk_gpu_s=0, gpus=1)
        assert "j0" in holder._poll(sync=True).granted
        ahead = _ahead(fleet, sets.keys, 6, risk=100.0)
        now[0] = 1.0
        far.want("j1", T, cap=1, at_risk_gpu_s=0, gpus=1)
        view = far._poll(sync=True)
        assert "j1" in view.waiting  # 7 releases away: the 6 ahead and the holder
        for key in ahead[:2]:
            fleet.delete(key)  # two waiters ahead give up: 5 to go, still far
        now[0] = 31.5
        far._poll(sync=False)  # its lease's keepalive; no read of the claims (due at 91)
        assert far._watch_for_turn(far.view()) is False  # the watch saw both; no read due
        fleet.delete(ahead[2])  # 4 to go: near its turn
        now[0] = 32.0
        assert far._watch_for_turn(far.view()) is False  # saw it; its 30 s read is at 31
        reads = count_claim_reads(far)
        now[0] = 33.0  # the watch says the read is due; the round reads
        assert far._watch_for_turn(far.view()) is True
        far._poll(sync=True)
        assert reads == {"h1": 1}
    finally:
        for x in (holder, far):
            x.stop()
        fleet.close()


def test_a_waiter_that_overtakes_the_queue_by_its_gpus_takes_at_the_next_release(
    etcd: Etcd, fleet_prefix
):
    """A job's work at risk grows with its GPUs while it waits, so a 64-GPU job behind six
    1-GPU jobs comes first in about 1.6 s. It read the claims when it was 7 releases away
    (too far to read again for 30 s); it puts the queue in order again as time passes
    from the claims it read, so the holder's release wakes it and it takes the slot."""
    sets = settings(etcd.url, "others", fleet_prefix, lease_ttl_s=60)
    fleet = EtcdSession(sets).open()
    holder = agent(etcd, "h0", fleet_prefix)
    big = agent(etcd, "h1", fleet_prefix)
    try:
        holder.want("j0", T, cap=1, at_risk_gpu_s=0, gpus=1)
        holder.wait_for(lambda v: "j0" in v.granted, 10)
        _ahead(fleet, sets.keys, 6, risk=100.0)
        big.want("j-big", T, cap=1, at_risk_gpu_s=0, gpus=64)
        view = big.wait_for(lambda v: "j-big" in v.waiting, 10)
        assert view.targets[T].waiters[-1].job == "j-big"  # last when it read
        ends = time.monotonic() + 3.0
        while time.monotonic() < ends:  # the wait is the test: 64 × 3 s > 100 GPU-s
            time.sleep(0.1)
        released = time.monotonic()
        holder.release("j0")
        big.wait_for(lambda v: "j-big" in v.granted, 10)
        assert time.monotonic() - released < 10.0
        assert holders(etcd, fleet_prefix) == [("h1", T, "j-big")]
    finally:
        for x in (holder, big):
            x.stop()
        fleet.close()


def test_a_waiter_keeps_its_lease_and_place_under_the_shortest_ttl(etcd: Etcd, fleet_prefix):
    """A waiting member watches the claims between rounds; the watch ends when its lease
    is due, so a 2 s lease (the shortest allowed) lives through a wait of 3.5 TTLs."""
    holder = agent(etcd, "h0", fleet_prefix, lease_ttl_s=2)
    waiter = agent(etcd, "h1", fleet_prefix, lease_ttl_s=2)
    try:
        holder.want("j0", T, cap=1, at_risk_gpu_s=0, gpus=1)
        holder.wait_for(lambda v: "j0" in v.granted, 10)
        waiter.want("j1", T, cap=1, at_risk_gpu_s=10, gpus=1)
        waiter.wait_for(lambda v: "j1" in v.waiting, 10)
        ends = time.monotonic() + 7.0
        while time.monotonic() < ends:  # the wait itself is the test
            view = waiter.view()
            assert view.rejoins == 0 and view.up and "j1" in view.waiting, view
            time.sleep(0.2)
        holder.release("j0")
        assert waiter.wait_for(lambda v: "j1" in v.granted, 10).rejoins == 0
    finally:
        holder.stop()
        waiter.stop()


def test_a_released_slot_reaches_a_waiter_at_once_not_at_its_next_poll(etcd: Etcd, fleet_prefix):
    """A waiting member watches the claims: the holder's release wakes it, well before
    its poll interval (3 s here) would; and its own want interrupts that watch."""
    holder = agent(etcd, "h0", fleet_prefix)
    slow = FleetAgent(settings(etcd.url, "h1", fleet_prefix, lease_ttl_s=9), poll_s=3.0).start()
    try:
        holder.want("j0", T, cap=1, at_risk_gpu_s=0, gpus=1)
        holder.wait_for(lambda v: "j0" in v.granted, 10)
        slow.wait_for(lambda v: v.up, 10)
        slow.want("j1", T, cap=1, at_risk_gpu_s=10, gpus=1)
        slow.wait_for(lambda v: "j1" in v.waiting, 10)
        deadline = time.monotonic() + 10
        while not slow.watching:  # the thread is in its watch (no event to wait on)
            assert time.monotonic() < deadline, "the waiting member never watched"
            time.sleep(0.01)
        t0 = time.monotonic()
        slow.want("j2", T, cap=1, at_risk_gpu_s=5, gpus=1)  # interrupts the watch
        slow.wait_for(lambda v: "j2" in v.waiting, 10)
        assert time.monotonic() - t0 < 1.0
        t0 = time.monotonic()
        holder.release("j0")
        slow.wait_for(lambda v: "j1" in v.granted, 10)
        assert time.monotonic() - t0 < 1.0
    finally:
        holder.stop()
        slow.stop()
