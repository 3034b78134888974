"""Bad input on the job socket of a real ``adaptd serve`` process, over real ZeroMQ.

Random bytes and random msgpack (hypothesis, seeded) at the decoders and over the
socket, a flood of 100,000 messages from a peer that never reads its replies,
connection churn and transport-level garbage. Throughout, the daemon stays up,
answers or drops-and-counts, keeps its memory bounded, and a well-behaved job on
the same daemon keeps getting its plans and save requests on time.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from adaptd.protocol import admin
from adaptd.protocol import job as p

from ._abuse import DEADLINE, GoodJob, Rank, Served, V, raw, wait_until
from ._schemas import CLIENT_KINDS, encode, messages

# ------------------------------------------------------------------ strategies

KINDS = ["hello", "steps", "save_report", "goodbye", "welcome", "plan", "save_now", "error"]
FIELDS = [
    "v", "job", "rank", "world_size", "pid", "checkpoint_dir", "step", "count", "mean_s",
    "max_s", "blocking_s", "durable_s", "bytes", "ok", "error", "path", "reason", "policy",
    "code", "message", "seq", "next_step", "every_steps", "kind", "op",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def message_like(draw: st.DrawFn) -> bytes:
    """A msgpack map shaped like a message: a kind (known or not), a version (mostly
    right), some real field names with values of any type, sometimes junk keys."""
    d: dict[object, object] = {}
    d["kind"] = draw(st.sampled_from(KINDS) | st.text(max_size=12) | scalars)
    d["v"] = draw(st.sampled_from([V, V, V, 0, 2, -1, 2**40]) | scalars)
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=8, unique=True)):
        d[name] = draw(values)
    if draw(st.booleans()):
        d[draw(st.text(max_size=8) | st.integers(-(2**63), 2**64 - 1))] = draw(values)
    return msgspec.msgpack.encode(d)


any_frame = st.one_of(
    st.binary(max_size=256),
    message_like(),
    values.map(msgspec.msgpack.encode),
    st.binary(min_size=p.MAX_MESSAGE_BYTES - 8, max_size=p.MAX_MESSAGE_BYTES + 64),
    # valid client messages too (built from the schemas), so the handlers behind the
    # decoder see random content, not only refusals
    st.sampled_from(CLIENT_KINDS).flatmap(messages).map(encode),
)


# ------------------------------------------------------------------ decoder level


@settings(max_examples=400)
@given(frame=st.one_of(st.binary(max_size=512), message_like(), values.map(msgspec.msgpack.encode)))
def test_decoders_accept_or_refuse_any_bytes(frame: bytes) -> None:
    """Every frame either decodes to a valid message that round-trips, or raises the
    one refusal type with a known code; nothing else escapes (no crash, no pickle)."""
    for decode, refusal in (
        (p.decode_client, p.ProtocolError),
        (p.decode_daemon, p.ProtocolError),
        (admin.decode_request, admin.AdminError),
    ):
        try:
            msg = decode(frame)
        except refusal as exc:
            assert exc.code in {"malformed", "invalid", "version", "too_large"}, exc.code
        else:
            again = admin.encode(msg) if decode is admin.decode_request else p.encode(msg)
            assert decode(again) == msg


def test_atheris_fuzzes_the_decoders(tmp_path: Path) -> None:
    """A bounded, seeded coverage-guided run of tests/faults/fuzz_decoder.py (30,000
    inputs, structure-aware from valid messages, so it reaches the checks behind
    msgspec's parser and what the daemon does with an accepted report); run it by hand
    with -max_total_time for longer. A finding exits non-zero and leaves a crash-* file."""
    pytest.importorskip("atheris")
    harness = Path(__file__).with_name("fuzz_decoder.py")
    res = subprocess.run(
        [sys.executable, str(harness), "-runs=30000", "-seed=1",
         f"-artifact_prefix={tmp_path}/", str(tmp_path / "corpus")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Done 30000 runs" in res.stderr, res.stderr[-2000:]
    assert not list(tmp_path.glob("crash-*"))
    # past the parser: the byte-level harness this replaced plateaued at 19 points
    cov = [int(m) for m in re.findall(r" cov: (\d+)", res.stderr)]
    assert cov and max(cov) >= 150, cov[-3:]


# ------------------------------------------------------------------ over the socket


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="adr-", dir="/tmp"))
    d = Served(where, daemon={"log_level": "warning"})
    yield d
    d.stop()
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def zctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@settings(
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frames=st.lists(any_frame, min_size=1, max_size=3))
# a valid heartbeat and a valid ask for a job's settings (each once found unanswered, or
# answered with what the test did not expect)
@example(frames=[b"\x85\xa4kind\xa4beat\xa1v\x02\xa3job\xa10\xa4rank\x00\xa4step\x00"])
@example(frames=[b"\x83\xa4kind\xaaask_config\xa1v\x02\xa3job\xa10"])
def test_every_random_message_gets_an_answer_and_the_daemon_serves_on(
    served: Served, zctx: zmq.Context, frames: list[bytes]
) -> None:
    """Whatever a peer sends (one to three frames of anything under ZeroMQ's hard cap),
    the daemon answers it: an Error for a refusal, Welcome for a valid hello, JobConfig
    for a valid ask for a job's settings, an ``unknown_peer`` Error for a valid report or
    heartbeat from a stranger. The one one-way message is a valid heartbeat of a rank
    that said hello here (a process beats on a connection of its own, unanswered unless
    its job was aborted): after it a probe that is never valid must be answered, so the
    beat was judged and the daemon serves on. So each message was seen, judged and
    answered, and the daemon is alive to do it."""
    peer = Rank(zctx, served.endpoint, "fuzz")
    try:
        peer.sock.send_multipart(frames)
        if _is_beat(frames):
            peer.sock.send_multipart([b"\xc1\xc1\xc1"])  # never valid: answered malformed
            reply = peer.recv(DEADLINE)
            while not (isinstance(reply, p.Error) and reply.code == "malformed"):
                assert isinstance(reply, p.Abort) or (
                    isinstance(reply, p.Error) and reply.code in {"unknown_peer", "wrong_job"}
                ), reply
                reply = peer.recv(DEADLINE)
        else:
            reply = peer.recv(DEADLINE)
            assert isinstance(reply, p.Error | p.Welcome | p.JobConfig), reply
            if isinstance(reply, p.JobConfig):  # a valid ask for a job's configured settings
                assert any(b"ask_config" in f for f in frames), (reply, frames)
            if isinstance(reply, p.Error):
                assert reply.code in {
                    "malformed", "invalid", "version", "too_large", "unknown_peer",
                    "bad_policy", "wrong_job", "rank_taken",
                }, reply  # fmt: skip
    finally:
        peer.close()
    assert served.alive()


def test_a_heartbeat_from_a_stranger_is_answered_unknown_peer(
    served: Served, zctx: zmq.Context
) -> None:
    """A beat for a job and rank that never said hello here (the daemon restarted, or a
    stranger) is answered like a report from one, so the rank's heartbeat knows its
    hello must come first."""
    peer = Rank(zctx, served.endpoint, "never-said-hello")
    try:
        peer.sock.send(p.encode(p.Beat(v=V, job="never-said-hello", rank=3, step=5)))
        reply = peer.recv(DEADLINE)
        assert isinstance(reply, p.Error) and reply.code == "unknown_peer", reply
    finally:
        peer.close()


def _is_beat(frames: list[bytes]) -> bool:
    """One frame that decodes as a valid heartbeat."""
    if len(frames) != 1:
        return False
    try:
        return isinstance(p.decode_client(frames[0]), p.Beat)
    except Exception:
        return False


def test_random_input_left_the_daemon_serving(served: Served, zctx: zmq.Context) -> None:
    """After the random messages above (same module daemon): counters moved, and a
    well-behaved job still gets its plan."""
    info = served.status().daemon
    assert served.alive() and info.messages > 0
    r = Rank(zctx, served.endpoint, "after-fuzz")
    assert r.hello(policy="fixed:steps=7").next_step == 7
    r.close()


#: Seconds of silence after which the hook gives up on the daemon (its default).
HOOK_TIMEOUT_S = 5.0


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20, method="inclusive")[-1]


FLOOD = 100_000
#: What the flood is made of: a cycle of refusals of every kind and valid reports.
FLOOD_MIX = [
    ("malformed", [b"\xc1\xc1\xc1"]),
    ("invalid", [raw(kind="steps", v=V, job="flood", rank=0, step="x", count=1, mean_s=0.1)]),
    ("invalid", [raw(kind="launch_missiles", v=V)]),
    ("version", [raw(kind="steps", v=99, job="flood", rank=0, step=1, count=1, mean_s=0.1)]),
    ("too_large", [b"\x00" * (p.MAX_MESSAGE_BYTES + 1)]),
    ("multipart", [b"a", b"b"]),
    (
        "steps",
        [p.encode(p.Steps(v=V, job="flood", rank=0, step=1, count=1, mean_s=0.01))],
    ),
]


#: The refusals that only the flood's peer causes (the good job sends none of them).
FLOOD_ONLY = ("malformed", "version", "too_large", "multipart")


def flood_handled(served: Served, before: admin.DaemonInfo, n: int, sent: dict[str, int]) -> bool:
    """Whether the daemon handled ``n`` messages since ``before`` and refused at least
    what the flood ``sent`` of each kind only it sends (the exact counts are asserted
    afterwards)."""
    now = served.status().daemon
    return now.messages - before.messages >= n and all(
        now.rejected.get(c, 0) - before.rejected.get(c, 0) >= sent.get(c, 0) for c in FLOOD_ONLY
    )


def test_flood_of_100k_messages_from_a_peer_that_never_reads(
    served: Served, zctx: zmq.Context
) -> None:
    """100,000 messages (every kind of refusal, and valid step reports) from one
    connection that never reads a reply, while a well-behaved job on the same daemon
    measures its round trips. ZeroMQ's high-water marks hold the flood back (the
    sender blocks; nothing is lost inbound), replies beyond the marks are dropped and
    counted, RSS stays flat and the good job keeps being served."""
    flooder = Rank(zctx, served.endpoint, "flood")
    flooder.hello(policy="fixed:steps=1000")
    flooder.sock.setsockopt(zmq.RCVHWM, 10)  # a slow reader: replies pile up daemon-side
    flooder.sock.setsockopt(zmq.SNDTIMEO, int(DEADLINE * 1000))
    good = GoodJob(served, zctx)
    before = served.status().daemon
    rss = [served.rss()]
    good.start()
    sent: dict[str, int] = {}
    t0 = time.perf_counter()
    for half in (1, 2):  # two halves: memory must plateau, not grow with the count
        for i in range(FLOOD // 2):
            code, frames = FLOOD_MIX[i % len(FLOOD_MIX)]
            flooder.sock.send_multipart(frames)  # blocks at the high-water mark
            sent[code] = sent.get(code, 0) + 1
        # handled once the daemon has taken it all in: its message counter also counts the
        # good job's messages, so it alone can pass n with the flood's tail still queued;
        # the refusals only the flood sends (its last message, a multipart, among them)
        # say the flood's own messages were handled, in order
        wait_until(
            lambda n=half * FLOOD // 2, s=dict(sent): flood_handled(served, before, n, s),
            "the daemon handled the flood",
            timeout=120,
        )
        rss.append(served.rss())
    flood_s = time.perf_counter() - t0
    lat = good.stop()
    after = served.status().daemon
    assert served.alive()
    for code in ("malformed", "version", "too_large", "multipart"):
        assert after.rejected.get(code, 0) - before.rejected.get(code, 0) == sent[code], code
    assert after.rejected["invalid"] - before.rejected.get("invalid", 0) == sent["invalid"]
    assert after.by_kind["steps"] - before.by_kind.get("steps", 0) >= sent["steps"]
    # replies to the reader that stopped reading were dropped and counted, not queued
    assert after.send_dropped - before.send_dropped > FLOOD // 2
    mib = [x / 2**20 for x in rss]
    print(
        f"\nflood: {FLOOD} messages in {flood_s:.1f}s; daemon RSS "
        f"{' -> '.join(f'{x:.1f}' for x in mib)} MiB (start, half, end); "
        f"replies dropped {after.send_dropped - before.send_dropped}; "
        f"good job hello {lat.summary(lat.hello)}, save-now {lat.summary(lat.save_now)}, "
        f"errors {len(lat.errors)}"
    )
    assert mib[2] - mib[0] < 32, f"the daemon grew by {mib[2] - mib[0]:.1f} MiB in the flood"
    assert mib[2] - mib[1] < 4, f"the second 50,000 messages grew it by {mib[2] - mib[1]:.1f} MiB"
    assert not lat.errors, lat.errors[:3]
    assert len(lat.hello) >= 5 and len(lat.save_now) >= 5, "the good job was starved"
    # on time, by percentiles (a loaded 2-core box may stall any single round trip): 95%
    # under a second, and not one near the 5 s of silence after which the hook would
    # give up on the daemon
    for name, xs in (("hello", lat.hello), ("save-now", lat.save_now)):
        assert p95(xs) < 1.0 and max(xs) < HOOK_TIMEOUT_S, (name, lat.summary(xs))
    flooder.close()


def test_connection_churn_leaves_no_state(served: Served, zctx: zmq.Context) -> None:
    """2,000 connections that each send one bad frame or one report without hello and
    hang up: every one is answered, none is remembered (peers only after a valid
    hello), and the daemon's open files return to where they were."""
    before = served.status().daemon
    fds0 = served.fds()
    for i in range(2000):
        peer = Rank(zctx, served.endpoint, "churn")
        if i % 2:
            peer.sock.send(b"\xc1")
        else:
            peer.steps(i)
        assert isinstance(peer.recv(), p.Error)
        peer.close()
    after = served.status().daemon
    assert after.peers == before.peers
    assert after.rejected["unknown_peer"] - before.rejected.get("unknown_peer", 0) == 1000
    wait_until(lambda: served.fds() <= fds0 + 2, "closed connections released their fds")


def test_transport_garbage_and_stalled_handshakes(served: Served, zctx: zmq.Context) -> None:
    """Raw unix-socket clients that are not ZeroMQ at all: 100 send garbage, 100 send
    half a ZMTP greeting and stall. ZeroMQ drops the first at once and the second at
    its handshake timeout; meanwhile a job is served normally, and once they hang up
    the daemon's fds are back where they were."""
    fds0 = served.fds()
    raws = []
    for i in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(served.socket))
        s.sendall(os.urandom(64) if i % 2 else b"\xff\x00\x00\x00\x00\x00\x00\x00\x01")
        raws.append(s)
    r = Rank(zctx, served.endpoint, "beside-garbage")
    hellos = []
    for _ in range(9):  # a median, not one round trip: the box may stall any one
        t0 = time.perf_counter()
        assert r.hello(policy="fixed:steps=9").next_step == 9
        hellos.append(time.perf_counter() - t0)
    assert statistics.median(hellos) < 1.0 and max(hellos) < HOOK_TIMEOUT_S, hellos
    r.close()
    for s in raws:
        s.close()
    assert served.alive()
    wait_until(lambda: served.fds() <= fds0 + 2, "raw connections released their fds")
