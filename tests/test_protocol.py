"""Protocol validation: good messages round-trip, bad ones raise ProtocolError with a code."""

from __future__ import annotations

import msgspec
import pytest

from adaptd.protocol import job as p


@pytest.mark.parametrize(
    "msg",
    [
        p.Hello(v=p.VERSION, job="job-1", rank=3, world_size=8, pid=42, checkpoint_dir="/ck"),
        p.Steps(v=p.VERSION, job="job-1", rank=0, step=100, count=50, mean_s=0.02, max_s=0.1),
        p.Steps(
            v=p.VERSION,
            job="j",
            rank=0,
            step=1,
            count=1,
            mean_s=3.0,
            max_s=3.0,
            max_steps=1,
            warmup=True,
        ),
        p.Hello(v=p.VERSION, job="j", restore_fallback="ckpt-35: truncated"),
        p.SaveReport(
            v=p.VERSION, job="j", rank=0, step=100, blocking_s=0.1, durable_s=1.2, bytes=10
        ),
        p.Goodbye(v=p.VERSION, job="j", rank=0, step=100),
    ],
)
def test_client_messages_round_trip(msg) -> None:
    assert p.decode_client(p.encode(msg)) == msg


@pytest.mark.parametrize(
    "msg",
    [
        p.Welcome(v=p.VERSION, job="j", rank=0),
        p.Plan(v=p.VERSION, job="j", seq=1, next_step=100, every_steps=50, policy="fixed"),
        p.Plan(v=p.VERSION, job="j", seq=2, next_step=None),
        p.SaveNow(v=p.VERSION, job="j", reason="operator", at_step=7),
        p.Error(v=p.VERSION, code="invalid", message="x"),
    ],
)
def test_daemon_messages_round_trip(msg) -> None:
    assert p.decode_daemon(p.encode(msg)) == msg


def raw(**fields) -> bytes:
    return msgspec.msgpack.encode(fields)


def test_an_old_clients_steps_report_still_validates() -> None:
    """Fields added later (within a version) are optional: a report without them
    decodes to the defaults."""
    old = raw(kind="steps", v=p.VERSION, job="j", rank=0, step=5, count=5, mean_s=0.1)
    msg = p.decode_client(old)
    assert (msg.max_s, msg.max_steps, msg.warmup) == (0.0, 1, False)
    # and a new client's message that needs no new field is the one an old daemon knows
    assert set(msgspec.msgpack.decode(p.encode(msg))) == {"kind", "v", "job", "rank", "step",
                                                          "count", "mean_s"}  # fmt: skip


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"\xc1\xc1\xc1", "malformed"),
        (b"", "malformed"),
        (raw(kind="hello", v=1), "invalid"),  # job missing
        (raw(kind="hello", v=1, job=""), "invalid"),  # empty id
        (raw(kind="hello", v=1, job="../../etc"), "invalid"),  # id pattern
        (raw(kind="hello", v=1, job="j", rank=-1), "invalid"),
        (raw(kind="hello", v=1, job="j", rank="0"), "invalid"),  # wrong type
        (raw(kind="hello", v=1, job="j", bogus=1), "invalid"),  # unknown field
        (raw(kind="steps", v=1, job="j", rank=0, step=1, count=1, mean_s=-1.0), "invalid"),
        # durations are finite: an infinite or NaN time would poison the estimates
        (raw(kind="steps", v=1, job="j", rank=0, step=1, count=1, mean_s=float("inf")), "invalid"),
        (
            raw(
                kind="steps", v=1, job="j", rank=0, step=1, count=1, mean_s=0.1, max_s=float("nan")
            ),
            "invalid",
        ),
        (
            raw(kind="steps", v=1, job="j", rank=0, step=1, count=1, mean_s=0.1, max_s=-1.0),
            "invalid",
        ),
        (
            raw(kind="steps", v=1, job="j", rank=0, step=1, count=1, mean_s=0.1, max_steps=-1),
            "invalid",
        ),
        (
            raw(
                kind="save_report",
                v=1,
                job="j",
                rank=0,
                step=1,
                blocking_s=float("inf"),
                durable_s=1.0,
                bytes=1,
            ),
            "invalid",
        ),
        (raw(kind="launch_missiles", v=1), "invalid"),
        (
            raw(kind="plan", v=1, job="j", seq=1, next_step=1),
            "invalid",
        ),  # daemon kind from a client
        (raw(kind="hello", v=99, job="j"), "version"),
        (raw(kind="hello", v=1, job="j", hostname="x" * (p.MAX_TEXT + 1)), "invalid"),
        (b"\x00" * (p.MAX_MESSAGE_BYTES + 1), "too_large"),
        (msgspec.msgpack.encode([1, 2, 3]), "invalid"),
    ],
)
def test_bad_client_frames_are_rejected_with_a_code(frame: bytes, code: str) -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.decode_client(frame)
    assert info.value.code == code


def test_the_size_cap_is_inclusive_and_its_error_names_both_sizes() -> None:
    # a frame of exactly the cap is read (and refused for what it holds), one byte more is not
    with pytest.raises(p.ProtocolError) as err:
        p.decode_client(b"\xc1" * p.MAX_MESSAGE_BYTES)
    assert err.value.code == "malformed"
    with pytest.raises(p.ProtocolError) as err:
        p.decode_client(b"\xc1" * (p.MAX_MESSAGE_BYTES + 1))
    assert err.value.code == "too_large"
    assert str(err.value) == "frame of 65537 bytes exceeds the 65536-byte cap"


@pytest.mark.parametrize(
    ("frame", "code", "message"),
    [
        (b"\xc1", "malformed", "not a msgpack message: "),
        (raw(kind="hello", v=99, job="j"), "version", "protocol version 99 is not supported"),
        (
            raw(kind="steps", v=p.VERSION, job="j", rank=0, step=1, count=1, mean_s=-1.0),
            "invalid",
            "invalid message: Expected `float` >= 0.0 - at `$.mean_s`",
        ),
        (
            raw(kind="steps", v=p.VERSION, job="j", rank=0, step=1, count=1, mean_s=1e-12),
            "invalid",
            "invalid message: mean_s = 1e-12 s is below 1e-09 s (0 means unmeasured)"
            " - at `$.mean_s`",
        ),
        (
            raw(
                kind="steps", v=p.VERSION, job="j", rank=0, step=1, count=1, mean_s=1.0, max_s=5e-10
            ),
            "invalid",
            "invalid message: max_s = 5e-10 s is below 1e-09 s (0 means unmeasured) - at `$.max_s`",
        ),
    ],
)
def test_every_refusal_says_what_was_wrong_and_where(frame, code, message) -> None:
    """The text travels in the Error reply and the daemon's log: it must name the field."""
    with pytest.raises(p.ProtocolError) as err:
        p.decode_client(frame)
    assert err.value.code == code
    assert str(err.value).startswith(message)
    if code == "version":
        assert str(err.value).endswith(f"(this side speaks {p.VERSION})")
