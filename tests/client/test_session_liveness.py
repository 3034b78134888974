"""The hook's session and its daemon's keep-alive: a live daemon never looks dead, and
its keep-alive Welcome is not answered (with a real DEALER against a real ROUTER).

Found under load by tests/faults/test_daemon_crash.py: with ``daemon_timeout=1`` the
job fell back to its embedded policy every few seconds while the daemon was alive
(the daemon re-sent a plan only to ranks it had not told anything for 2 s, so a
report could go unanswered for 2 s), said hello again, and so on.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from adaptd.client.agreement.authority import Solo
from adaptd.client.agreement.ranks import Identity
from adaptd.client.daemon.link import DaemonLink
from adaptd.client.daemon.policy import PolicyChoice
from adaptd.client.daemon.session import DaemonSession, HelloFacts
from adaptd.client.save.costs import StepClock
from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import parse
from adaptd.protocol import job as protocol

from .conftest import FakeDaemon, connected, welcome

JOB = "keepalive"


def _session(endpoint: str) -> DaemonSession:
    schedule = SaveSchedule()
    session = DaemonSession(
        DaemonLink(endpoint, timeout_s=5.0), schedule, Solo(schedule), Identity(JOB, 0, 1),
        Path("/tmp"), PolicyChoice(None, parse("fixed:steps=10"), "fixed:steps=10"),
        report_s=60.0, decide_s=60.0,
    )  # fmt: skip
    now = time.perf_counter()
    session.start(HelloFacts(0, 0, 0, ""), JobTracker(JOB), StepClock(0, now), now)
    return session


def _pump(session: DaemonSession, daemon: FakeDaemon, timeout: float = 5.0) -> None:
    """Let the session read what the fake daemon sent (a tick at most every 10 ms)."""
    deadline = time.monotonic() + timeout
    while not session.link.poll(0.01):
        assert time.monotonic() < deadline, "the session received nothing"
    session.tick(1, time.perf_counter(), False, (0.0, 0))


def _then_quiet(daemon: FakeDaemon) -> list[type]:
    """The kind of the next message the client sends (waited for up to 10 s, so a loaded
    machine cannot make it late), then the kinds of any more sent within 0.3 s of it."""
    return [type(daemon.recv(10.0)), *(type(m) for m in _quiet(daemon))]


def _quiet(daemon: FakeDaemon, seconds: float = 0.3) -> list[protocol.ClientMessage]:
    """What the client sent within ``seconds`` of quiet."""
    out = []
    while True:
        try:
            out.append(daemon.recv(seconds))
        except TimeoutError:
            return out


def test_the_job_plan_goes_again_only_to_a_welcome_that_answers_a_hello(
    fake_daemon: FakeDaemon,
) -> None:
    session = _session(fake_daemon.endpoint)
    try:
        connected(session, fake_daemon)
        assert {type(m) for m in _quiet(fake_daemon)} <= {protocol.Hello}  # start()'s, if sent
        session.job_plan = protocol.JobPlan(
            v=protocol.VERSION, job=JOB, rank=0, at_step=5, next_step=10, every_steps=10
        )
        # the answer to the hello: a restarted daemon hears the job's plan again
        fake_daemon.send(welcome(JOB))
        _pump(session, fake_daemon)
        assert _then_quiet(fake_daemon) == [protocol.JobPlan]
        # keep-alive Welcomes: nothing is sent back (else each would answer the other)
        for _ in range(3):
            fake_daemon.send(welcome(JOB))
            _pump(session, fake_daemon)
        assert _quiet(fake_daemon) == []
        assert session.daemon_mode
        # the daemon restarted: it refuses what it does not know, the session says hello,
        # and the Welcome that answers it gets the plan again
        fake_daemon.send(
            protocol.Error(v=protocol.VERSION, code="unknown_peer", message="who are you")
        )
        _pump(session, fake_daemon)
        assert _then_quiet(fake_daemon) == [protocol.Hello]
        fake_daemon.send(welcome(JOB))
        _pump(session, fake_daemon)
        assert _then_quiet(fake_daemon) == [protocol.JobPlan]
    finally:
        session.link.close()


tf = pytest.importorskip("tensorflow")


@pytest.mark.slow
@pytest.mark.tf
def test_a_short_daemon_timeout_never_falls_back_while_the_daemon_is_alive(
    short_dir: Path,
) -> None:
    from adaptd.client import AdaptiveCheckpointer
    from adaptd.daemon.assembly import build
    from adaptd.daemon.options import DaemonOptions

    # The daemon's plan never changes (its first save is far away), so only its
    # keep-alive answers the job's reports; the job allows 1 s of silence after a send.
    sock = short_dir / "adaptd.sock"
    with build(DaemonOptions(socket=sock, default_policy="fixed:steps=1000000")).start() as daemon:
        ckptr = AdaptiveCheckpointer(
            short_dir / "ck", job="short-timeout", socket=f"ipc://{sock}", daemon_timeout=1.0,
            handle_sigterm=False, v=tf.Variable(1.0),
        )  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            ckptr.restore_or_initialize()
            modes = {ckptr.mode}
            end = time.monotonic() + 6.0  # three times what the old 2 s resend needed
            while time.monotonic() < end:
                time.sleep(0.005)  # the step's work
                ckptr.step()
                modes.add(ckptr.mode)
            ckptr.close()
        hellos = daemon.by_kind["hello"]
        reports = daemon.by_kind["steps"]
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert fallbacks == [] and modes == {"daemon"}, (fallbacks, modes)
    assert hellos == 1, "the job said hello again: it had taken the daemon for dead"
    assert reports >= 4  # it did report, and every report was answered in time
