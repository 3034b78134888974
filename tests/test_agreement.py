"""The agreement rules (adaptd.core.agreement) and their records: tables of input -> outcome."""

from __future__ import annotations

import pytest

from adaptd.core import agreement as rules
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as p

V = p.VERSION


def propose(at_step: int = 100, round: int = 3, proposer: int = 0) -> p.Propose:
    return rules.save_proposal("j", round, at_step, proposer, "test")


def ack(rank: int, step: int, ok: bool, round: int = 3) -> p.Ack:
    return p.Ack(v=V, job="j", rank=rank, round=round, step=step, ok=ok)


def offer(rank: int, local=(), pullable=(), host: str = "", **parts) -> p.RestoreOffer:
    return p.RestoreOffer(
        v=V, job="j", rank=rank, local=list(local), pullable=list(pullable), host=host, **parts
    )


# ---------------------------------------------------------------------- timing


@pytest.mark.parametrize(
    ("step_time", "lead_time", "expected"),
    [
        (None, 0.25, rules.MIN_LEAD_STEPS),  # unknown: the minimum
        (0.0, 0.25, rules.MIN_LEAD_STEPS),
        (float("inf"), 0.25, rules.MIN_LEAD_STEPS),
        (0.001, 0.25, 250),  # 0.25 s of 1 ms steps
        (0.1, 0.25, 3),  # rounded up
        (10.0, 0.25, rules.MIN_LEAD_STEPS),  # slow steps: the minimum
        (1e-9, 0.25, rules.MAX_LEAD_STEPS),  # capped
    ],
)
def test_lead_steps(step_time, lead_time, expected) -> None:
    assert rules.lead_steps(step_time, lead_time) == expected


def test_retry_step_moves_past_the_furthest_rank_and_doubles_the_lead() -> None:
    aborted = rules.abort(propose(100), "late", retry_from=140)
    assert rules.retry_step(90, 5, None, 0) == 95
    assert rules.retry_step(90, 5, aborted, 1) == 140 + 10
    assert rules.retry_step(150, 5, aborted, 2) == 150 + 20
    assert rules.retry_step(0, 1, None, 50) == 64  # doubling capped at 64x


# ---------------------------------------------------------------------- one round


@pytest.mark.parametrize(("step", "ok"), [(0, True), (99, True), (100, False), (101, False)])
def test_a_rank_acknowledges_only_below_the_proposed_step(step, ok) -> None:
    a = rules.acknowledge(propose(100), 2, step)
    assert (a.ok, a.rank, a.round, a.step) == (ok, 2, 3, step)


def test_decide_commits_only_when_every_rank_acknowledged() -> None:
    prop = propose(100)
    d = rules.decide(prop, {0: ack(0, 90, True), 1: ack(1, 91, True)}, 2)
    assert d.commit and d.round == 3 and d.retry_from is None


@pytest.mark.parametrize(
    ("acks", "reason", "retry_from"),
    [
        ({0: (90, True)}, "no acknowledgement from rank(s) 1", None),
        ({0: (90, True), 1: (104, False)}, "rank 1 at step 104: past step 100", 104),
        (
            {0: (101, False), 1: (104, False), 2: (50, True)},
            "rank 0 at step 101, rank 1 at step 104: past step 100",
            104,
        ),
        ({}, "no acknowledgement from rank(s) 0, 1", None),
    ],
)
def test_decide_aborts_with_the_reason(acks, reason, retry_from) -> None:
    world = max(2, len(acks))
    d = rules.decide(propose(100), {r: ack(r, s, ok) for r, (s, ok) in acks.items()}, world)
    assert not d.commit
    assert reason in d.reason
    assert d.retry_from == retry_from


def test_acknowledgements_of_ranks_outside_the_world_do_not_count() -> None:
    d = rules.decide(propose(100), {0: ack(0, 1, True), 5: ack(5, 200, False)}, 2)
    assert not d.commit and "rank(s) 1" in d.reason


# ---------------------------------------------------------------------- proposals


def test_a_plan_travels_in_a_proposal_unchanged() -> None:
    d = Decision(
        next_step=200, every_steps=50, reason="young", policy="young", interval_s=12.5, waste=0.01
    )
    prop = rules.plan_proposal("j", 7, 150, 0, d, decided_by="hostA", source="daemon")
    assert (prop.action, prop.at_step, prop.decided_by, prop.source) == (
        "plan",
        150,
        "hostA",
        "daemon",
    )
    assert rules.decision_of(prop) == d
    with pytest.raises(ValueError, match="urgent"):
        rules.plan_proposal("j", 7, 150, 0, Decision(next_step=None, urgent=True))
    with pytest.raises(ValueError, match="carries no plan"):
        rules.decision_of(propose())


@pytest.mark.parametrize(
    ("action", "at", "wish", "since", "ok"),
    [
        ("save", 100, "save", 90, True),
        ("save", 100, "save", 100, True),
        ("save", 100, "save", 101, False),  # a save before the wish does not count
        ("stop", 100, "save", 90, True),
        ("save", 100, "stop", 90, False),  # a stop wish needs a stop
        ("stop", 100, "stop", 90, True),
        ("plan", 100, "save", 90, False),
    ],
)
def test_which_committed_round_fulfils_a_wish(action, at, wish, since, ok) -> None:
    prop = p.Propose(v=V, job="j", round=1, action=action, at_step=at, proposer=1)
    assert rules.satisfies(prop, wish, since) is ok


# ---------------------------------------------------------------------- restore


def test_restore_nothing_anywhere_is_a_fresh_start() -> None:
    choice = rules.choose_restore({0: offer(0), 1: offer(1)}, 2)
    assert choice.step is None and not choice.error


def test_restore_the_newest_step_every_rank_has() -> None:
    choice = rules.choose_restore({0: offer(0, [30, 20, 10]), 1: offer(1, [20, 10])}, 2)
    assert choice.step == 20
    assert choice.source == {0: "local", 1: "local"}
    assert choice.newer == {0: (30,), 1: ()}


def test_restore_pulls_what_a_rank_lacks_when_its_destination_has_it() -> None:
    offers = {0: offer(0, [30, 20]), 1: offer(1, [], pullable=[30, 20, 10])}
    choice = rules.choose_restore(offers, 2)
    assert choice.step == 30 and choice.source == {0: "local", 1: "pull"}


def test_restore_without_a_common_step_is_an_error_naming_the_ranks() -> None:
    offers = {0: offer(0, [30, 20], host="a"), 1: offer(1, [], host="b"), 2: offer(2, [30])}
    choice = rules.choose_restore(offers, 3)
    assert choice.step is None
    assert "rank(s) 1 cannot get step 30" in choice.error
    assert "rank 1 (b): nothing" in choice.error and "restore_from" in choice.error


def test_restore_refuses_a_newer_step_of_another_world_size_naming_both() -> None:
    old = {"other_world": [40], "other_world_size": 2, "directory": "/ck"}
    offers = {r: offer(r, [30, 20], **old) for r in range(3)}
    choice = rules.choose_restore(offers, 3)
    assert choice.step is None
    assert "ckpt-40 in /ck was written by 2 worker(s); this job has 3 worker(s)" in choice.error
    # nothing of this size either: still the refusal, not a fresh start
    assert "2 worker(s)" in rules.choose_restore({0: offer(0, **old), 1: offer(1)}, 2).error


def test_restore_ignores_an_older_step_of_another_world_size() -> None:
    offers = {r: offer(r, [30], other_world=[20], other_world_size=2) for r in range(3)}
    choice = rules.choose_restore(offers, 3)
    assert choice.step == 30 and not choice.error


def test_restore_refuses_a_step_whose_parts_are_spread_over_hosts() -> None:
    # no shared storage: the replicated part on rank 0's host, each part on its own
    offers = {
        0: offer(0, replicated=[20, 10], own=[20, 10]),
        1: offer(1, own=[20, 10]),
        2: offer(2, own=[10]),
    }
    choice = rules.choose_restore(offers, 3)
    assert choice.step is None
    assert "step 10 is whole across the job's ranks" in choice.error
    assert "rank(s) 0" in choice.error and "shared storage" in choice.error


def test_restore_of_steps_no_rank_holds_whole_is_a_fresh_start() -> None:
    # a first save cut short: the replicated part and rank 0's part, nothing else
    offers = {0: offer(0, replicated=[10], own=[10]), 1: offer(1)}
    choice = rules.choose_restore(offers, 2)
    assert choice.step is None and not choice.error


def test_restore_waits_for_every_offer() -> None:
    with pytest.raises(ValueError, match="rank\\(s\\) 1"):
        rules.choose_restore({0: offer(0, [10])}, 2)


# ---------------------------------------------------------------------- records


@pytest.mark.parametrize(
    "msg",
    [
        propose(),
        rules.plan_proposal("j", 1, 5, 0, Decision(10, 5, policy="fixed"), source="embedded"),
        ack(1, 5, True),
        rules.abort(propose(), "late", retry_from=7),
        offer(0, [3, 2], [4], host="h"),
        p.Restored(v=V, job="j", rank=1, step=3, ok=False, error="boom"),
        p.SaveCost(v=V, job="j", rank=1, step=3, blocking_s=0.2, extra_step_s=0.1),
        p.Request(v=V, job="j", rank=1, op="set_policy", spec="fixed:steps=5", origin="b"),
    ],
)
def test_rank_records_round_trip_as_json(msg) -> None:
    assert p.decode_rank(p.encode_json(msg)) == msg


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('{"kind":"ack","v":2,"job":"j","rank":0,"round":1,"step":-1,"ok":true}', "invalid"),
        ('{"kind":"ack","v":2,"job":"j","rank":0,"round":1,"step":1,"ok":true,"x":1}', "invalid"),
        ('{"kind":"hello","v":2,"job":"j"}', "invalid"),  # not a rank record
        (
            '{"kind":"propose","v":2,"job":"j","round":1,"action":"jump","at_step":1,"proposer":0}',
            "invalid",
        ),
        ('{"kind":"ack","v":1,"job":"j","rank":0,"round":1,"step":1,"ok":true}', "version"),
        ("not json", "malformed"),
        (
            '{"kind":"restore_offer","v":2,"job":"j","rank":0,"local":[' + "1," * 300 + "1]}",
            "invalid",
        ),
    ],
)
def test_bad_rank_records_are_refused(text, code) -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.decode_rank(text)
    assert err.value.code == code


def test_agreement_messages_cross_the_daemon_socket() -> None:
    prop = rules.plan_proposal("j", 1, 5, 3, Decision(10, 5))
    assert p.decode_daemon(p.encode(prop)) == prop
    decision = rules.abort(prop, "late")
    assert p.decode_daemon(p.encode(decision)) == decision
    a = rules.acknowledge(prop, 1, 2)
    assert p.decode_client(p.encode(a)) == a
    plan = p.JobPlan(v=V, job="j", rank=1, at_step=5, next_step=10, every_steps=5, decided_by="a")
    assert p.decode_client(p.encode(plan)) == plan
    relay = p.Relay(v=V, job="j", op="pause", origin="b")
    assert p.decode_daemon(p.encode(relay)) == relay


# ---------------------------------------------------------------------- every field


@pytest.mark.parametrize("stop", [False, True])
def test_a_save_proposal_carries_every_field_and_survives_the_wire(stop) -> None:
    kwargs = {"stop": True} if stop else {}
    prop = rules.save_proposal("job-1", 4, 250, 2, "r" * (p.MAX_TEXT + 10), **kwargs)
    assert (prop.v, prop.job, prop.round, prop.at_step, prop.proposer) == (V, "job-1", 4, 250, 2)
    assert prop.action == ("stop" if stop else "save")
    assert prop.reason == "r" * p.MAX_TEXT  # cut to what the wire carries
    assert p.decode_rank(p.encode_json(prop)) == prop


def test_a_plan_proposal_names_no_planner_unless_told() -> None:
    prop = rules.plan_proposal("j", 7, 150, 0, Decision(next_step=200, every_steps=50))
    assert (prop.decided_by, prop.source, prop.v) == ("", "", V)
    with pytest.raises(
        ValueError, match=r"^an urgent decision is proposed as a save, not as a plan$"
    ):
        rules.plan_proposal("j", 7, 150, 0, Decision(next_step=None, urgent=True))


def test_a_commit_is_a_valid_record_of_its_round() -> None:
    d = rules.decide(propose(100, round=9), {0: ack(0, 1, True, 9), 1: ack(1, 2, True, 9)}, 2)
    assert (d.v, d.job, d.round, d.commit, d.reason, d.retry_from) == (V, "j", 9, True, "", None)
    assert p.decode_rank(p.encode_json(d)) == d


def test_decide_over_a_set_of_ranks_counts_only_those() -> None:
    """A save group is not always 0..n−1: ranks {1, 3} decide alone."""
    acks = {1: ack(1, 5, True), 3: ack(3, 6, True)}
    assert rules.decide(propose(100), acks, [1, 3]).commit
    d = rules.decide(propose(100), {1: ack(1, 5, True), 0: ack(0, 200, False)}, (1, 3))
    assert not d.commit
    assert d.reason == "no acknowledgement from rank(s) 3" and d.retry_from is None


def test_an_abort_gives_every_reason_at_once() -> None:
    acks = {0: ack(0, 120, False), 2: ack(2, 90, True)}
    d = rules.decide(propose(100), acks, 4)
    assert d.reason == "rank 0 at step 120: past step 100; no acknowledgement from rank(s) 1, 3"
    assert d.retry_from == 120


def test_the_restore_error_tells_the_operator_where_each_rank_s_steps_are() -> None:
    """The whole message: which steps each rank holds (newest first, a long run
    abbreviated) and where, who lacks the newest, and the three ways out."""
    offers = {
        0: p.RestoreOffer(
            v=V, job="j", rank=0, local=[10, 20, 30, 40, 50, 60, 70], directory="/ckpt", host="a"
        ),
        1: p.RestoreOffer(v=V, job="j", rank=1, local=[], pullable=[5, 15], url="s3://b/j"),
        2: p.RestoreOffer(v=V, job="j", rank=2, local=[1, 2, 3, 4, 5, 6], pullable=[9]),
        3: p.RestoreOffer(v=V, job="j", rank=3, local=[], directory="/ckpt3", host="d"),
        4: offer(4),
    }
    choice = rules.choose_restore(offers, 5)
    assert choice.step is None
    assert choice.error == (
        "no checkpoint step is complete for the whole job ("
        "rank 0 (a): steps 70 .. 10 (7) in /ckpt; "
        "rank 1 (?): steps 15, 5 at s3://b/j; "
        "rank 2 (?): steps 6, 5, 4, 3, 2, 1 in its directory, steps 9 at its destination; "
        "rank 3 (d): nothing in /ckpt3; "
        "rank 4 (?): nothing in its directory); "
        "rank(s) 1, 2, 3, 4 cannot get step 70. Give every rank the same checkpoint directory "
        "(shared storage), or restore_from= the durable destination the checkpoints are "
        "replicated to (docs/multiworker.md), or remove the checkpoints to start afresh"
    )
