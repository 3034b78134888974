"""A request relayed to the job's chief is not lost when the chief's daemon dies or
restarts before the chief notices (issue 26).

The chief hands a request that another host relayed in-band (``Request``) to its own
daemon. A daemon that died is noticed only after the link's timeout; a daemon that
restarted refuses what it gets before the rank's new hello (``unknown_peer``). Either
way the request went nowhere, and before the fix nothing did it. A real DEALER (the
session's link) against a real ROUTER (``FakeDaemon``); times are passed in, so no
test waits for a timeout to pass.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from adaptd.client.agreement.authority import Solo
from adaptd.client.agreement.ranks import Identity
from adaptd.client.daemon.link import DaemonLink
from adaptd.client.daemon.policy import PolicyChoice
from adaptd.client.daemon.session import DaemonSession, HelloFacts
from adaptd.client.save.costs import StepClock
from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import parse
from adaptd.core.snapshot import Decision
from adaptd.protocol import job as protocol

from .conftest import FakeDaemon, connected, welcome

JOB = "relay"
TIMEOUT_S = 2.0


class Chief(Solo):
    """The chief's authority as the session sees it: hands over the requests the other
    ranks relayed (as ``Coordinated.outbox`` does) and records the saves it is asked for."""

    def __init__(self, schedule: SaveSchedule) -> None:
        super().__init__(schedule)
        self.mail: list[protocol.ClientMessage] = []
        self.saves: list[str] = []
        self.news: list[tuple[str, bool]] = []  # each embedded plan: its policy, new_policy

    def embedded_plan(self, decision: Decision, step: int, *, new_policy: bool = False) -> None:
        self.news.append((decision.policy, new_policy))

    def outbox(self) -> list[protocol.ClientMessage]:
        out, self.mail = self.mail, []
        return out

    def save_now(self, reason: str, at_step: int | None, step: int) -> None:
        self.saves.append(reason)


def request(op: str = "save_now", **kw: str) -> protocol.Request:
    return protocol.Request(v=protocol.VERSION, job=JOB, rank=0, op=op, origin="host-b", **kw)


def session_of(endpoint: str) -> tuple[DaemonSession, Chief]:
    schedule = SaveSchedule()
    chief = Chief(schedule)
    session = DaemonSession(
        DaemonLink(endpoint, timeout_s=TIMEOUT_S), schedule, chief, Identity(JOB, 0, 2),
        Path("/tmp"), PolicyChoice(None, parse("fixed:steps=10"), "fixed:steps=10"),
        report_s=1.0, decide_s=60.0,
    )  # fmt: skip
    now = time.perf_counter()
    session.start(HelloFacts(0, 0, 0, ""), JobTracker(JOB), StepClock(0, now), now)
    return session, chief


def welcomed(session: DaemonSession, daemon: FakeDaemon) -> float:
    """Say hello to ``daemon`` and read its Welcome; returns the session's time then."""
    connected(session, daemon)
    daemon.send(welcome(JOB))
    deadline = time.monotonic() + 10
    while not session.link.poll(0.01):
        assert time.monotonic() < deadline, "no Welcome came through"
    now = time.perf_counter()
    session.tick(1, now, False, (0.0, 0))
    assert session.daemon_mode
    return now


def test_a_request_relayed_to_a_daemon_that_just_died_is_done_by_the_embedded_policy(
    ipc_endpoint: str,
) -> None:
    daemon = FakeDaemon(ipc_endpoint)
    session, chief = session_of(ipc_endpoint)
    try:
        session.decide(0, time.perf_counter(), False)  # before the daemon answered
        t0 = welcomed(session, daemon)
        daemon.close()  # the chief's daemon dies; the chief does not know yet
        chief.mail.append(request(reason="op-b"))
        session.tick(5, t0 + 3.0, False, (0.0, 0))  # handed to the dead daemon
        assert session.daemon_mode and chief.saves == []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the fallback's warning
            session.tick(9, t0 + 3.0 + TIMEOUT_S + 0.5, False, (0.0, 0))
        assert not session.daemon_mode  # the loss is noticed...
        assert chief.saves == ["op-b"]  # ...and the request it swallowed is done
        session.decide(10, t0 + 3.0 + TIMEOUT_S + 0.6, False)
        assert chief.news == [("fixed", True), ("fixed", True)]  # in force again: news
    finally:
        session.link.close()
        daemon.close()


def test_a_request_relayed_to_a_restarted_daemon_goes_again_after_the_new_hello(
    ipc_endpoint: str,
) -> None:
    old = FakeDaemon(ipc_endpoint)
    session, chief = session_of(ipc_endpoint)
    new = None
    try:
        t0 = welcomed(session, old)
        old.close()
        new = FakeDaemon(ipc_endpoint)  # restarted on the same socket: knows no one
        connected(session, new)  # (a hello it has not answered yet)
        spec = "fixed:steps=7"
        chief.mail.append(request("set_policy", spec=spec))
        session.tick(5, t0 + 0.5, False, (0.0, 0))
        got = new.wait_for(protocol.Request)  # refused: the daemon does not know the rank
        assert got.spec == spec
        new.send(protocol.Error(v=protocol.VERSION, code="unknown_peer", message="who?"))
        deadline = time.monotonic() + 10
        while not session.link.poll(0.01):
            assert time.monotonic() < deadline
        session.tick(6, t0 + 0.6, False, (0.0, 0))
        new.wait_for(protocol.Hello)  # said again
        new.send(welcome(JOB))
        while not session.link.poll(0.01):
            assert time.monotonic() < deadline
        session.tick(7, t0 + 0.7, False, (0.0, 0))
        again = new.wait_for(protocol.Request, timeout=5)
        assert again.op == "set_policy" and again.spec == spec and again.origin == "host-b"
        assert session.daemon_mode and chief.saves == []
    finally:
        session.link.close()
        old.close()
        if new is not None:
            new.close()


def test_a_daemon_that_stays_alive_gets_each_request_once(fake_daemon: FakeDaemon) -> None:
    session, chief = session_of(fake_daemon.endpoint)
    try:
        t0 = welcomed(session, fake_daemon)
        chief.mail.append(request(reason="once"))
        session.tick(5, t0 + 0.1, False, (0.0, 0))
        assert fake_daemon.wait_for(protocol.Request).reason == "once"
        fake_daemon.send(welcome(JOB))  # the daemon's keep-alive: it lives
        deadline = time.monotonic() + 10
        while not session.link.poll(0.01):
            assert time.monotonic() < deadline
        session.tick(6, t0 + 0.2, False, (0.0, 0))
        assert session.daemon_mode and chief.saves == []
        try:
            extra = fake_daemon.wait_for(protocol.Request, timeout=0.3)
        except TimeoutError:
            extra = None
        assert extra is None, extra
    finally:
        session.link.close()


def test_the_embedded_policys_first_plan_and_a_relayed_set_policys_are_news(
    ipc_endpoint: str,
) -> None:
    """With no daemon, the embedded policy decides: its first plan, and the first after
    a relayed set-policy replaced it, go to the job exactly (a policy's re-fits within
    the re-plan tolerance are no round: tests/client/test_agreement_replan.py)."""

    session, chief = session_of(ipc_endpoint)  # nothing listens there: no daemon
    try:
        now = time.perf_counter()
        session.decide(1, now, False)
        session.decide(2, now + 1, False)
        session.embedded_request(request("set_policy", spec="young"), 3)
        session.decide(3, now + 2, False)
        session.decide(4, now + 3, False)
        assert [new for _, new in chief.news] == [True, False, True, False]
        assert chief.news[0][0] == "fixed" and chief.news[2][0] != "fixed"
    finally:
        session.link.close()
