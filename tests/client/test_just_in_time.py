"""Just-in-time saves in one process: which errors are a peer's failure
(client/save/peer_failure.py), the counters put back (client/save/just_in_time.py), a
rank's data position rebuilt by replay (client/save/replay.py), the collective timeout
(client/save/collective_timeout.py). The real multi-worker job is in
tests/multiworker/test_just_in_time.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.checkpoints import rank_parts  # noqa: E402
from adaptd.client.save import replay  # noqa: E402
from adaptd.client.save.just_in_time import (  # noqa: E402
    Counters,
    counters_of,
    saved_by_another,
)
from adaptd.client.save.peer_failure import TYPES, peer_failure  # noqa: E402
from adaptd.client.save.rank_state import RankPart  # noqa: E402

pytestmark = pytest.mark.tf

#: What TF 2.21 raised on the survivor, measured (client/save/peer_failure.py).
KILLED = (
    "Graph execution error:\n\nDetected at node CollectiveReduceV2 defined at ...\n"
    "Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error "
    "information from remote target /job:worker/replica:0/task:1 ..."
)
STOPPED = (
    "Collective ops is aborted by: Error reported from /job:worker/task:1: The following "
    "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1"
)
TIMED_OUT = "Collective has timed out during execution.\n\t [[{{node CollectiveReduceV2}}]]"


def test_tensorflows_error_types_for_a_lost_peer_are_still_there() -> None:
    """Fails when TensorFlow renames or moves the types the hook catches."""
    names = {t.__name__ for t in TYPES}
    assert names == {
        "UnavailableError",
        "DeadlineExceededError",
        "CancelledError",
        "AbortedError",
        "InternalError",
    }
    assert all(issubclass(t, tf.errors.OpError) for t in TYPES)


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        (tf.errors.UnavailableError, KILLED, "UnavailableError: Collective ops is aborted"),
        (tf.errors.UnavailableError, STOPPED, "UnavailableError: Collective ops is aborted"),
        (tf.errors.DeadlineExceededError, TIMED_OUT, "DeadlineExceededError: Collective has"),
    ],
)
def test_a_lost_peer_and_a_timed_out_collective_are_peer_failures(kind, text, said) -> None:
    exc = kind(None, None, text)
    assert peer_failure(exc).startswith(said)
    try:  # a loop that wraps the error keeps it recognisable
        raise RuntimeError("step failed") from exc
    except RuntimeError as wrapped:
        assert peer_failure(wrapped) is not None


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("Collective ops is aborted"),  # the words, not TF's type
        tf.errors.InternalError(None, None, "Blas GEMM launch failed"),  # TF's type, not the words
        tf.errors.DeadlineExceededError(None, None, "key not found in 100ms"),  # a KV wait
        tf.errors.InvalidArgumentError(None, None, "Collective has timed out"),  # other type
        KeyboardInterrupt(),
        None,
    ],
)
def test_anything_else_is_not_a_peer_failure(exc) -> None:
    assert peer_failure(exc) is None


def test_counters_are_put_back_to_the_last_completed_step_and_refused_when_unproven() -> None:
    its = tf.Variable(0, dtype=tf.int64)
    counters = Counters({"opt.iterations": its})
    counters.observe(0)
    its.assign(2)  # one step and the failed one at 1 each, or one step at 2: unknown
    assert "no save in this run yet tells how far" in counters.put_back(1)
    its.assign(10)  # 5 steps at 2 (not moved), or 6 at 10/6 (moved): only one fits
    assert counters.put_back(5) == "" and int(its.numpy()) == 10
    counters.observe(5)
    its.assign(14)  # step 7 done, the failed step 8 did not move it
    assert counters.put_back(7) == "" and int(its.numpy()) == 14
    its.assign(16)  # the failed step 8 moved it: put back
    assert counters.put_back(7) == "" and int(its.numpy()) == 14
    its.assign(15)  # half a step: refused, and nothing changed
    why = counters.put_back(7)
    assert "reads 15; at step 7 it was 14 (or 16" in why and int(its.numpy()) == 15


def test_the_counters_found_are_optimizers_and_the_named_scalars() -> None:
    opt = tf.keras.optimizers.Adam()
    steps = tf.Variable(0, dtype=tf.int64)
    found = counters_of({"optimizer": opt, "steps": steps, "w": tf.Variable(1.0)}, ("steps",))
    assert set(found) == {"optimizer.iterations", "steps"}
    with pytest.raises(ValueError, match="step_counters names 'w'"):
        counters_of({"w": tf.Variable(1.0)}, ("w",))


def shuffled() -> tf.data.Dataset:
    return tf.data.Dataset.range(200).shuffle(64, seed=3).repeat().batch(4)


def take(it, n: int) -> list[list[int]]:
    return [next(it).numpy().tolist() for _ in range(n)]


@pytest.mark.parametrize("base", [5, 0])
def test_a_part_noted_for_replay_restores_the_position_of_its_step(tmp_path, base) -> None:
    """Rank 1's part of step 9 as a replay note from step ``base``: a fresh iterator
    restored from it hands out what the uninterrupted one hands out after 9 steps."""
    it = iter(shuffled())
    part = RankPart({"it": it}, rank=1, world_size=2, directory=tmp_path, keep=3)
    take(it, 5)
    part.start(5)
    error, nbytes = part.finish()
    assert error == "" and nbytes > 0
    take(it, 4)
    expected = take(it, 3)
    (tmp_path / rank_parts.replay_name(9, 1, 2, base)).touch()
    fresh = iter(shuffled())
    replay.restore(RankPart({"it": fresh}, rank=1, world_size=2, directory=tmp_path, keep=3), 9)
    assert take(fresh, 3) == expected
    (tmp_path / rank_parts.replay_name(9, 1, 2, base)).unlink()
    with pytest.raises(tf.errors.NotFoundError):  # neither written nor noted
        replay.restore(RankPart({"it": iter(shuffled())}, rank=1, world_size=2,
                                directory=tmp_path, keep=3), 9)  # fmt: skip


def test_only_iterators_can_be_replayed() -> None:
    assert replay.why_not({"it": iter(shuffled())}) == ""
    why = replay.why_not({"it": iter(shuffled()), "rng": tf.random.Generator.from_seed(1)})
    assert "'rng' (Generator) is not a data iterator" in why


def test_the_hooks_collective_bound_is_a_watchdog_unless_the_user_set_one() -> None:
    """On a (one-worker) MultiWorkerMirroredStrategy, in a process of its own (it
    configures the process's collectives): no timeout -> the hook's watchdog, and the
    strategy's options left alone (TensorFlow's timeout holds a thread per collective
    for the whole timeout: client/save/collective_timeout.py); the user's own -> kept,
    no watchdog; a strategy without collectives -> none."""
    code = """
import tensorflow as tf
from adaptd.client.save import collective_timeout as ct
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    v = tf.Variable(1.0)
assert ct.strategy_of({"v": v}) is strategy
assert ct.bound(strategy, 7.0) == 7.0
assert not strategy.extended._communication_options.timeout_seconds
assert not strategy.extended._host_cross_device_ops._options.timeout_seconds
assert ct.bound(strategy, None) is None
strategy.extended._communication_options.timeout_seconds = 9.0
assert ct.bound(strategy, 7.0) is None
assert ct.bound(tf.distribute.get_strategy(), 7.0) is None
print("ok")
"""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


#: A process with real collectives and the hook's watchdog (bound 1 s, a look every
#: 0.1 s): collectives of a group of one complete; of a group of two, with no second
#: member, never do (a peer that never joins).
WATCHDOG = """
import json, threading, time
import tensorflow as tf
from adaptd.client.save import collective_timeout as ct
from adaptd.client.save.peer_failure import peer_failure
ct.CHECK_S = 0.1

def reduce(x, size, key, timeout=0.0):
    return tf.raw_ops.CollectiveReduceV2(
        input=x, group_size=tf.constant(size), group_key=tf.constant(key),
        instance_key=tf.constant(1), ordering_token=[], merge_op="Add", final_op="Id",
        timeout_seconds=timeout)

@tf.function
def step(x):
    return reduce(x, 1, 1) + 1

@tf.function
def timed_step(x):  # TensorFlow's own timeout, as the hook set it before
    return reduce(x, 1, 1, 120.0) + 1

@tf.function
def stuck(x):
    return reduce(x, 2, 2) + 1

@tf.function
def slow(x):  # no collective: 2 s in one call
    return tf.py_function(lambda v: (time.sleep(2.0), v)[1], [x], tf.float32)

def threads():
    for line in open("/proc/self/status"):
        if line.startswith("Threads:"):
            return int(line.split()[1])

n, hold = 0, [False]
w = ct.Watchdog(1.0, position=lambda: n, holding=lambda: hold[0])
w.thread = threading.get_ident()
w.start()
x = tf.constant(1.0)
step(x); timed_step(x); slow(x)
out = {"threads": [threads()]}
for _ in range(200):
    step(x); n += 1
out["threads"].append(threads())
for _ in range(200):
    timed_step(x); n += 1
out["threads"].append(threads())
slow(x); n += 1
out["fired_slow"] = w.fired
hold[0] = True  # the hook holds the loop (a save, a round): its waits are not a peer's
threading.Timer(2.0, lambda: hold.__setitem__(0, False)).start()
t = time.monotonic()
try:
    stuck(x)
except tf.errors.DeadlineExceededError as exc:
    out["error"] = type(exc).__name__
    out["peer_failure"] = peer_failure(exc)
out["stuck_s"] = time.monotonic() - t
out["fired"] = w.fired
w.stop()
print(json.dumps(out))
"""


def test_the_watchdog_ends_a_collective_a_peer_never_joins_and_costs_no_thread_per_collective():
    """The hook's bound on a silent peer (client/save/collective_timeout.py), with real
    collectives: 200 collectives leave the thread count as it was (TensorFlow's own
    timeout adds about a thread each: the cause, shown beside it); a 2 s call without
    collectives is left alone; a call whose collective never completes raises what
    TensorFlow's timeout raised, a peer failure, within the bound once the hook stopped
    holding the loop (2 s held, then 1 s)."""
    import json

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", WATCHDOG], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    start, plain, timed = out["threads"]
    assert plain - start <= 20, out  # the watchdog: no thread per collective (TF pools aside)
    assert timed - plain >= 150, out  # TensorFlow's timeout: about one each (120 s)
    assert out["fired_slow"] is None, out
    assert out["error"] == "DeadlineExceededError", out
    assert (out["peer_failure"] or "").startswith("DeadlineExceededError: Collective"), out
    assert 2.9 < out["stuck_s"] < 6.0, out
    assert "stuck" in out["fired"] and "holds collectives" in out["fired"], out


def test_the_watchdogs_bound_grows_with_the_steps_time(monkeypatch) -> None:
    """Steps of 0.5 s: the bound is 10 × 0.5 = 5 s, not the 1 s asked (a job of long
    steps is not taken for hung); steps of 10 ms leave it at 1 s."""
    from adaptd.client.save import collective_timeout as ct

    now, n = [0.0], [0]
    w = ct.Watchdog(1.0, position=lambda: n[0], holding=lambda: False, clock=lambda: now[0])
    assert w.limit() == 1.0
    for _ in range(5):
        w.check()
        now[0] += 1.0
        n[0] += 2  # two steps a second
    assert w.limit() == pytest.approx(5.0)
    for _ in range(ct.STEP_HISTORY):
        w.check()
        now[0] += 1.0
        n[0] += 100
    assert w.limit() == 1.0
    with pytest.raises(ValueError, match="collective_timeout must be > 0"):
        ct.Watchdog(0.0, position=lambda: 0, holding=lambda: False)


def test_the_watchdogs_typical_step_is_per_step_not_per_look() -> None:
    """A short job seen by looks every 0.5 s: a first step of 1.5 s (its compile), one
    slow step of 2 s, then 30 steps of 20-100 ms. The typical step is a fast one, so the
    bound stays the 4 s asked; the median per look (1.5 and 2 s of four looks) made it
    8 s, past TensorFlow's heartbeat (seen in the stopped-peer test of
    tests/multiworker/test_just_in_time.py under load)."""
    from adaptd.client.save import collective_timeout as ct

    now, n = [0.0], [0]
    w = ct.Watchdog(4.0, position=lambda: n[0], holding=lambda: False, clock=lambda: now[0])
    for t, step in ((0.0, 0), (0.5, 0), (1.0, 0), (1.5, 1), (2.0, 1), (2.5, 1), (3.0, 1),
                    (3.5, 2), (4.0, 7), (4.5, 32)):  # fmt: skip
        now[0], n[0] = t, step
        w.check()
    assert w.limit() == 4.0
    # and long steps still raise it, once they are the job's (the looks it keeps)
    for _ in range(ct.STEP_HISTORY):
        now[0] += 1.0
        n[0] += 1
        w.check()
    assert w.limit() == pytest.approx(10.0)


def test_adaptd_verify_checks_the_part_a_replay_note_starts_from(tmp_path) -> None:
    """A just-in-time step (replicated part, one replay note per rank) verifies as
    whole, checking each rank's base part; without a base part its rank is missing."""
    from adaptd.client.restore import verify

    for rank in (0, 1):
        part = RankPart({"it": iter(shuffled())}, rank=rank, world_size=2, directory=tmp_path,
                        keep=3)  # fmt: skip
        part.start(5)
        assert part.finish()[0] == ""
        (tmp_path / rank_parts.replay_name(7, rank, 2, 5)).touch()
    tf.train.Checkpoint(v=tf.Variable(1.0)).write(str(tmp_path / "ckpt-7"))
    report = verify.verify(tmp_path / "ckpt-7")
    assert report.ok and report.parts == 2, report.problems
    assert any("rebuilt at restore from step 5" in n for n in report.notes)
    for name in list(tmp_path.iterdir()):
        if name.name.startswith(rank_parts.part_name(5, 1, 2)):
            name.unlink()
    report = verify.verify(tmp_path / "ckpt-7")
    assert not report.ok and "rank(s) 1 of 2 have no complete part" in str(report.problems)


def _bundle(prefix: str) -> set[str]:
    return {f"{prefix}.index", f"{prefix}.data-00000-of-00001"}


def test_a_step_another_survivor_completed_is_not_written_again() -> None:
    """The survivor that held the claim wrote step 15 and let the claim go before a
    slower survivor claimed it: the slower one, looking again, writes nothing (seen in
    the 3-worker job once its workers started faster). A step still incomplete, or only
    an older one complete, leaves the save to it."""
    world = 2
    older = _bundle("ckpt-10") | {
        x for r in range(world) for x in _bundle(rank_parts.part_name(10, r, world))
    }
    step15 = _bundle("ckpt-15") | _bundle(rank_parts.part_name(15, 1, world))
    noted = {rank_parts.replay_name(15, 0, world, 10)}  # the dead chief's part: a note
    assert rank_parts.status(step15 | noted | older, 15).complete
    why = saved_by_another(step15 | noted | older, 15)
    assert why == "step 15 is already complete (another survivor or a planned save wrote it)"
    assert saved_by_another(step15 | noted | older, 14) != ""  # a newer step is complete
    assert saved_by_another(step15 | older, 15) == ""  # rank 0's part missing: not complete
    assert saved_by_another(older, 15) == ""
