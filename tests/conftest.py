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
