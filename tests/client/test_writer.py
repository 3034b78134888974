"""The writer's priority: the rule (a table), and real TensorFlow saves whose writer
thread is niced while the write is a small share of the interval and brought back to
normal priority, on a new thread, once it is not, in the embedded and daemon modes."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

import pytest

from adaptd.client.save.writer import Choice, WriterPriority
from adaptd.core.snapshot import Decision, JobState, Snapshot

RULE = WriterPriority()


@pytest.mark.parametrize(
    ("interval_s", "latency_s", "newest_s", "current", "since_fallback", "nice"),
    [
        (None, 0.5, None, 0, None, 0),  # no interval planned: unchanged
        (300.0, None, None, 0, None, 0),  # no save measured yet (the first save): unchanged
        (300.0, None, None, 19, None, 19),
        (300.0, 0.9, 0.9, 0, None, 19),  # 0.3 % of the interval: background
        (4.0, 1.0, 1.0, 0, None, 19),  # 25 %: still background
        (4.0, 1.5, 1.0, 0, None, 0),  # 37 %: between the thresholds, unchanged
        (4.0, 1.5, 1.5, 19, None, 19),
        (4.0, 2.1, 1.0, 19, None, 0),  # over half the interval: normal priority
        (4.0, 1.0, 2.1, 19, None, 0),  # one starved write is enough
        (4.0, 0.5, 0.5, 0, 3, 0),  # 3 saves after a fall-back: not yet
        (4.0, 0.5, 0.5, 0, 10, 19),  # 10: the background again
        (0.0, 1.0, 1.0, 19, None, 19),  # a nonsense interval is no interval
    ],
)
def test_rule(interval_s, latency_s, newest_s, current, since_fallback, nice) -> None:
    for load in (None, 0.4, 1.5):  # a host the training job has to itself: L decides
        choice = RULE.choose(
            interval_s=interval_s,
            latency_s=latency_s,
            newest_s=newest_s,
            current=current,
            since_fallback=since_fallback,
            load_per_core=load,
        )
        assert choice.nice == nice and choice.reason


@pytest.mark.parametrize("current", [0, 19])
def test_an_overloaded_host_gets_a_normal_priority_writer(current) -> None:
    choice = RULE.choose(
        interval_s=300.0, latency_s=0.5, newest_s=0.5, current=current, load_per_core=3.2
    )
    assert choice == Choice(
        0, "host load 3.2 per core: other work would starve a background writer"
    )


def test_reasons_say_why() -> None:
    assert RULE.choose(interval_s=4.0, latency_s=2.1, current=19) == Choice(
        0,
        "durable in 2.1s, 52% of the 4s interval: a background write would run into the next save",
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"background_nice": 0}, "background_nice must be 1..19, got 0"),
        ({"background_nice": 20}, "background_nice must be 1..19, got 20"),
        ({"background_up_to": 0.6}, "0 < background_up_to < normal_above <= 1"),
        ({"normal_above": 1.5}, "got 0.25 and 1.5"),
        ({"retry_after": -1}, "retry_after must be >= 0 saves, got -1"),
        ({"max_load_per_core": 0}, "max_load_per_core must be > 0, got 0"),
    ],
)
def test_settings_are_validated(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        WriterPriority(**kwargs)


# ------------------------------------------------------------------ real TensorFlow


@dataclass
class Interval:
    """A policy object (run in the hook, embedded) whose plan states ``seconds``; the
    test makes the saves itself."""

    seconds: float

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        return Decision(next_step=job.step + 10**9, interval_s=self.seconds, policy="interval")


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.tf
def test_auto_nices_the_writer_then_restores_normal_priority_on_a_new_thread(tmp_path) -> None:
    tf = pytest.importorskip("tensorflow")
    from adaptd.client import AdaptiveCheckpointer

    main = nice_of(0)
    v = tf.Variable(tf.zeros([1 << 16]))
    policy = Interval(3600.0)
    # the default rule, except that this shared test machine's load is not looked at
    rule = WriterPriority(max_load_per_core=1e9)
    ckptr = AdaptiveCheckpointer(
        tmp_path / "ck", job="writer", policy=policy, socket=f"ipc://{tmp_path}/none",
        handle_sigterm=False, decide_interval=0.01, poll_interval=0.001, writer_nice=rule, v=v,
    )  # fmt: skip
    ckptr.restore_or_initialize()
    saved: dict[int, float] = {}

    def save_once() -> None:
        """One step, a save of it, and steps until its report is in (the plan is new)."""
        n = len(ckptr.history)
        v.assign_add(tf.ones_like(v))
        ckptr.step()
        ckptr.save("test")
        saved[ckptr.step_count] = float(v[0])
        deadline = time.monotonic() + 30
        while len(ckptr.history) == n:
            assert time.monotonic() < deadline, "no save report within 30 s"
            v.assign_add(tf.ones_like(v))
            ckptr.step()

    def replan(seconds: float) -> None:
        policy.seconds = seconds
        deadline = time.monotonic() + 30
        while ckptr._schedule.decision.interval_s != seconds:  # re-decided every 10 ms
            assert time.monotonic() < deadline, "the hook did not re-decide within 30 s"
            ckptr.step()

    def writer():
        return ckptr.checkpoint._async_checkpointer_impl._async_save_thread

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no daemon: the fallback warning
        save_once()  # the first save: no latency measured yet, normal priority
        first = writer()
        assert nice_of(first.native_id) == main and ckptr.writer_nice is None
        save_once()  # durable in well under 900 s (a quarter of the hour): background
        assert nice_of(first.native_id) == 19 and ckptr.writer_nice == 19
        assert writer() is first
        replan(1e-4)  # now every write is longer than half the interval
        save_once()  # the L measured so far is short: the median needs two long ones
        save_once()
        save_once()
        second = writer()
        assert second is not first and not first.is_alive()  # TF's thread, restarted
        assert nice_of(second.native_id) == main and ckptr.writer_nice is None
        assert nice_of(0) == main  # the training thread is untouched
        save_once()  # the new thread writes; the queue is consistent
    assert all(r.ok for r in ckptr.history), [r.error for r in ckptr.history]
    saved[ckptr.step_count] = float(v[0])  # close() saves the last step (save_on_close)
    ckptr.close()
    latest = ckptr.manager.latest_checkpoint
    w = tf.Variable(tf.zeros([1 << 16]))
    tf.train.Checkpoint(v=w).restore(latest).expect_partial()
    # the last save, written by the new thread, is whole
    assert float(w[0]) == saved[ckptr.history[-1].step]


@pytest.mark.tf
def test_the_daemons_plan_interval_drives_it_too(tmp_path, fake_daemon) -> None:
    tf = pytest.importorskip("tensorflow")
    from adaptd.client import AdaptiveCheckpointer
    from adaptd.protocol import job as protocol

    from .conftest import plan, welcome

    v = tf.Variable(tf.zeros([1 << 12]))
    ckptr = AdaptiveCheckpointer(
        tmp_path / "ck", job="wd", socket=fake_daemon.endpoint, handle_sigterm=False,
        poll_interval=0.001, daemon_timeout=120,  # the test daemon sends no more
        writer_nice=WriterPriority(max_load_per_core=1e9), v=v,
    )  # fmt: skip
    fake_daemon.wait_connected()
    ckptr.restore_or_initialize()
    deadline = time.monotonic() + 60
    while not any(isinstance(m, protocol.Hello) for m in fake_daemon.received):
        # a Hello sent while the connection was still being made is dropped and
        # resent from a later step boundary: step until one arrives
        assert time.monotonic() < deadline, "no Hello within 60 s"
        ckptr.step()
        if fake_daemon.sock.poll(10):
            fake_daemon.recv()
    fake_daemon.send(welcome("wd"))
    fake_daemon.send(plan("wd", seq=1, next_step=1, every=1, interval_s=3600.0))
    while len(ckptr.history) < 3:
        assert time.monotonic() < deadline, "three saves within 60 s"
        v.assign_add(tf.ones_like(v))
        ckptr.step()
    assert ckptr.mode == "daemon" and ckptr.writer_nice == 19
    ckptr.close()
