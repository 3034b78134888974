"""Fuzzing that reaches the validators: frames built from the message schemas.

Random bytes rarely get past msgspec's parser (test_protocol_abuse.py); here the
frames are built from the structs themselves (tests/faults/_schemas.py), so most are
valid and exercise the round trip, and the rest differ from a valid message in one
field set to an edge value whose verdict the contract fixes. Accepted client reports
are then fed to what the daemon runs on them (registry, tracker, default policy,
store), which must take any of them.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptd.core.policy import parse
from adaptd.core.snapshot import Snapshot
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.stall_watch import StallWatch
from adaptd.protocol import job as p
from adaptd.state.store import Store

from ._schemas import (
    CLIENT_KINDS,
    CODES,
    KINDS,
    Kind,
    edges,
    encode,
    fields,
    message_edges,
    messages,
    minimal,
)


def decoded(kind: Kind, frame: bytes) -> object | None:
    """The decoded message, or ``None`` when refused (with a known code)."""
    try:
        msg = kind.decode(frame)
    except kind.refusal as exc:
        assert exc.code in CODES, exc.code
        return None
    assert type(msg) is kind.cls, (kind.cls, msg)
    return msg


def round_trips(kind: Kind, msg: object) -> bool:
    return kind.decode(kind.encode(msg)) == msg


def verdict(kind: Kind, frame: bytes) -> object | None:
    """:func:`decoded`, and an accepted message must survive encoding and decoding."""
    msg = decoded(kind, frame)
    assert msg is None or round_trips(kind, msg), f"{msg!r} does not round-trip"
    return msg


def test_every_field_takes_or_refuses_its_edge_values_as_the_contract_says() -> None:
    """Each field of each message, set to each of its edge values (NaN, ±inf, negative,
    beyond the bounds, empty, too long, wrong types, None) in an otherwise valid
    message, plus unknown and missing fields and wrong versions."""
    wrong: list[str] = []
    checked = 0
    for kind in KINDS:
        base = minimal(kind)
        assert verdict(kind, encode(base)) is not None, f"{kind.cls.__name__}: {base}"
        cases = [
            (f"{name} {e.label}", {**base, name: e.value}, e.accept)
            for name, t, _ in fields(kind)
            for e in edges(kind, name, t)
        ]
        for label, msg, accept in [*cases, *message_edges(kind, base)]:
            checked += 1
            got = decoded(kind, encode(msg))
            if (got is not None) != accept:
                said = "accepted" if got is not None else "refused"
                wrong.append(f"{kind.cls.__name__}: {label} was {said}")
            elif got is not None and not round_trips(kind, got):
                wrong.append(f"{kind.cls.__name__}: {label} does not round-trip")
    assert not wrong, "\n".join(wrong)
    assert checked > 600  # every kind, every field: the table did not go empty


def test_generated_frames_are_mostly_valid_and_round_trip() -> None:
    """Messages drawn from the schemas, one in four with one field set to an edge value:
    the decoders agree with the contract on every frame, and most frames are accepted
    (the share is printed; run with -s)."""
    seen: Counter[str] = Counter()

    @settings(max_examples=800)
    @given(kind=st.sampled_from(KINDS), data=st.data())
    def one(kind: Kind, data: st.DataObject) -> None:
        msg = data.draw(messages(kind))
        accept = True
        names = list(fields(kind))
        if names and data.draw(st.integers(0, 3)) == 3:
            name, t, _ = data.draw(st.sampled_from(names))
            edge = data.draw(st.sampled_from(edges(kind, name, t)))
            msg, accept = {**msg, name: edge.value}, edge.accept
        got = verdict(kind, encode(msg))
        assert (got is not None) == accept, (kind.cls.__name__, msg)
        seen["accepted" if got is not None else "refused"] += 1
        if got is not None:  # the decoder kept every value it was given
            for name, value in msg.items():
                if name in {"kind", "op"}:
                    continue
                kept = getattr(got, name)
                assert kept == value or (isinstance(value, float) and math.isnan(value)), name

    one()
    total = sum(seen.values())
    share = seen["accepted"] / total
    print(f"\nschema fuzz: {seen['accepted']} of {total} frames accepted ({share:.0%})")
    assert share > 0.6 and seen["refused"] > 0.05 * total, seen


@st.composite
def job_session(draw: st.DrawFn) -> tuple[bytes, list[tuple[Kind, bytes]]]:
    """A hello, then reports of the same job and rank with values anywhere in the
    schema's valid domain (extremes included), as frames."""
    hello_kind = next(k for k in CLIENT_KINDS if k.cls is p.Hello)
    hello = draw(messages(hello_kind))
    reports = []
    # the reports the registry takes (the agreement's messages go to other parts)
    others = [k for k in CLIENT_KINDS if k.cls in (p.Steps, p.SaveReport, p.Goodbye, p.Beat)]
    for kind in draw(st.lists(st.sampled_from(others), min_size=1, max_size=8)):
        msg = {**draw(messages(kind)), "job": hello["job"], "rank": hello.get("rank", 0)}
        reports.append((kind, encode(msg)))
    return encode(hello), reports


@settings(max_examples=150)
@given(session=job_session())
def test_accepted_reports_leave_the_daemon_sane(session) -> None:
    """Whatever the decoder accepts, the daemon's registry, tracker, default policy,
    hang detection and store take: no exception, finite estimates, every row written.
    (Before the bounds on durations and counts: an ``inf`` save cost raised in the
    tracker, and a step of 2^64 − 1 made every later write of the store fail.)"""
    hello_frame, reports = session
    with tempfile.TemporaryDirectory() as where:
        store = Store.open(Path(where) / "state.db")
        reg = Registry(emit=store.on_event)
        sent: list[p.Message] = []
        watch = StallWatch(reg.table, send=lambda who, m: sent.append(m) or True,
                           emit=store.on_event, process=lambda pid: None)  # fmt: skip
        now = 1.0
        job, rank, _ = reg.hello(b"peer", p.decode_client(hello_frame), now)
        for kind, frame in reports:
            msg = verdict(kind, frame)
            assert msg is not None, kind.cls.__name__  # drawn from the valid domain
            now += 1.0
            if isinstance(msg, p.Steps):
                reg.steps(job, rank, msg, now)
                watch.steps(job, msg, now)
            elif isinstance(msg, p.Beat):
                watch.beat(job, rank, b"beat", msg, now)
            elif isinstance(msg, p.SaveReport):
                reg.save_report(job, rank, msg, now)
            else:
                reg.goodbye(job, rank, msg, now)
                break
        job.decides, job.world_size = True, max(2, job.world_size)
        watch.tick(now + 1e6)  # a silence far past any cap: judged, never an exception
        judged = watch.verdict(job.id)
        if judged is not None and judged[0].threshold_s is not None:
            assert math.isfinite(judged[0].threshold_s) and judged[0].threshold_s > 0
        assert all(isinstance(m, p.Abort) for m in sent)
        t = job.tracker
        state = t.state(time=now)
        decision = parse("default").decide(Snapshot(time=now), state)
        assert decision.next_step is None or decision.next_step >= 0
        for figure in (t.step_time_s, t.save_cost_s, t.save_latency_s, t.mtbf_s):
            assert figure is None or (math.isfinite(figure) and figure >= 0), figure
        store.flush()
        assert store.write_errors == 0 and store.pending == 0, store.last_error
        store.close()


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.cls.__name__)
def test_the_contract_knows_every_field(kind: Kind) -> None:
    """A field added to a message must get edge values here: edges() raises for a type
    it does not know, and every field has at least one value it must refuse."""
    for name, t, _ in fields(kind):
        assert any(not e.accept for e in edges(kind, name, t)), name
