"""Fixtures every test folder shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq


@pytest.fixture
def zctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context of the test's own, destroyed (sockets and all) at its end."""
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


class FakeClock:
    """Time that passes only when the code under test sleeps: pacing arithmetic
    (token buckets, throttles) tested without waiting. Call it for the time; pass
    ``.sleep`` as the sleep function; ``.slept`` lists each sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()
