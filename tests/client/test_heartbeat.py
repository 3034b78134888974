"""The rank's heartbeat thread against a real ROUTER (the daemon side driven by the test):
it beats on through a daemon that has not heard the rank's hello (``unknown_peer``: the
daemon restarted, the hello comes from the training thread), and stops on any other
refusal (an older daemon that does not know the message)."""

from __future__ import annotations

import threading
import time

from adaptd.client.daemon.heartbeat import STALE_BEATS, Heartbeat, stale_after
from adaptd.core.stall import DEFAULT_FLOOR_S
from adaptd.protocol import job as protocol

DEADLINE = 10.0


def _heartbeat(endpoint: str) -> Heartbeat:
    return Heartbeat(endpoint, "hb-job", 1, position=lambda: 7, holding=lambda: "",
                     on_abort=lambda _m: None, interval_s=0.05)  # fmt: skip


def _refuse(daemon, code: str) -> None:
    daemon.send(protocol.Error(v=protocol.VERSION, code=code, message="refused by the test"))


def test_beats_go_on_while_the_daemon_has_not_heard_the_hello(fake_daemon) -> None:
    hb = _heartbeat(fake_daemon.endpoint).start()
    try:
        first = fake_daemon.wait_for(protocol.Beat, DEADLINE)
        assert (first.job, first.rank, first.step) == ("hb-job", 1, 7)
        _refuse(fake_daemon, "unknown_peer")
        for _ in range(3):  # beats keep coming after the refusal
            fake_daemon.wait_for(protocol.Beat, DEADLINE)
        assert hb._thread.is_alive()
    finally:
        hb.stop()


def test_any_other_refusal_stops_the_beats(fake_daemon) -> None:
    hb = _heartbeat(fake_daemon.endpoint).start()
    try:
        fake_daemon.wait_for(protocol.Beat, DEADLINE)
        _refuse(fake_daemon, "version")
        end = time.monotonic() + DEADLINE
        while hb._thread.is_alive():
            assert time.monotonic() < end, "the heartbeat went on after a version refusal"
            hb._thread.join(0.05)
    finally:
        hb.stop()


def test_a_rank_that_could_not_beat_hears_the_abort_before_it_goes_on(fake_daemon) -> None:
    """The thread held past :attr:`Heartbeat.stale_s` (as a SIGSTOPped process's is):
    :meth:`Heartbeat.stale` says so, and :meth:`Heartbeat.catch_up` waits for the answer
    to the first beat after the gap, here an Abort sent 0.3 s after that beat arrived
    (a loaded daemon): the training thread learns it before it writes anything."""
    held = threading.Event()
    aborts: list[protocol.Abort] = []
    hb = Heartbeat(fake_daemon.endpoint, "hb-job", 1, position=lambda: 7,
                   holding=lambda: held.wait(DEADLINE) and "", on_abort=aborts.append,
                   interval_s=0.05)  # fmt: skip
    held.set()
    hb.start()
    try:
        fake_daemon.wait_for(protocol.Beat, DEADLINE)
        assert not hb.stale()
        held.clear()  # the thread cannot beat (its next beat waits on this)
        end = time.monotonic() + DEADLINE
        while not hb.stale():
            assert time.monotonic() < end, "never stale while it could not beat"
            time.sleep(0.01)  # the clock passing is the event
        held.set()
        abort = protocol.Abort(v=protocol.VERSION, job="hb-job", reason="stalled by the test",
                               culprit=1, incarnation=1)  # fmt: skip

        def answer() -> None:
            fake_daemon.wait_for(protocol.Beat, DEADLINE)
            time.sleep(0.3)  # the daemon's delay is what is tested
            fake_daemon.send(abort)

        answering = threading.Thread(target=answer)
        answering.start()
        try:
            assert hb.catch_up() == abort
        finally:
            answering.join(DEADLINE)
        assert aborts == [abort]
    finally:
        held.set()
        hb.stop()


def test_catch_up_hands_over_the_abort_only_once_on_abort_has_run(fake_daemon) -> None:
    """The training thread coming back from a stop reads what :meth:`Heartbeat.catch_up`
    returns and the hook's own ``aborted``, which ``on_abort`` sets: an Abort returned
    while ``on_abort`` still runs (it aborts the collectives: slow) let a continued chief
    save over the survivors' just-in-time save (CI, test_hang's chief-before-a-save).
    Here ``on_abort`` is held until the training thread's ``catch_up`` has begun."""
    held = threading.Event()
    entered, release = threading.Event(), threading.Event()
    ran: list[protocol.Abort] = []

    def on_abort(msg: protocol.Abort) -> None:
        entered.set()
        release.wait(DEADLINE)
        ran.append(msg)

    hb = Heartbeat(fake_daemon.endpoint, "hb-job", 1, position=lambda: 7,
                   holding=lambda: held.wait(DEADLINE) and "", on_abort=on_abort,
                   interval_s=0.05)  # fmt: skip
    held.set()
    hb.start()
    try:
        fake_daemon.wait_for(protocol.Beat, DEADLINE)
        held.clear()  # a stop: no beat
        end = time.monotonic() + DEADLINE
        while not hb.stale():
            assert time.monotonic() < end, "never stale while it could not beat"
            time.sleep(0.01)  # the clock passing is the event
        held.set()  # continued: the first beat after the gap is answered with the Abort
        fake_daemon.wait_for(protocol.Beat, DEADLINE)
        abort = protocol.Abort(v=protocol.VERSION, job="hb-job", reason="stalled by the test",
                               culprit=1, incarnation=1)  # fmt: skip
        fake_daemon.send(abort)
        assert entered.wait(DEADLINE), "on_abort never ran"
        releasing = threading.Timer(0.2, release.set)  # on_abort ends during catch_up
        releasing.start()
        try:
            assert hb.catch_up() == abort
            assert ran == [abort], "catch_up returned the Abort before on_abort had run"
        finally:
            releasing.join(DEADLINE)
    finally:
        release.set()
        held.set()
        hb.stop()


def test_a_rank_stopped_for_the_daemons_floor_checks_before_it_saves() -> None:
    """The gap limit stays below the floor of the daemon's threshold: a rank the daemon
    gave up on was stopped for about the floor at least. Seen once in a suite run with
    the tests' floor of 2 s and the old limit of 3 intervals (3 s): the chief, stopped
    2.9 s, came back, saw no gap and wrote over the survivor's just-in-time save."""
    assert stale_after(1.0, 2.0) == 1.5 < 2.0  # the tests' floor: checked after 1.5 s
    assert stale_after(1.0, 3.0) == 1.5
    assert stale_after(1.0, 4.0) == 2.0
    assert stale_after(1.0, None) == STALE_BEATS * 1.0 < DEFAULT_FLOOR_S  # the default floor
    assert stale_after(1.0, 300.0) == 3.0
    assert stale_after(1.0, 0.5) == 1.5  # never below 1.5 intervals: a late beat is no stop
