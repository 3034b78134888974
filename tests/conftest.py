"""Fixtures every test folder shares, and the Hypothesis profile of the whole suite."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, settings

#: Hypothesis runs the same examples every time (CI, make test) unless
#: ADAPTD_HYPOTHESIS_PROFILE=explore asks for new random ones (and remembers failures
#: in .hypothesis/). Tests set only their own max_examples on top.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,  # a loaded 2-core box makes single examples slow, not wrong
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("ADAPTD_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="session")
def _state_home_of_the_suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test reads or writes its user's state (``~/.local/state/adaptd``): a daemon
    started without ``--state-dir`` (and every child process) keeps it under the
    session's own ``$XDG_STATE_HOME``. A developer's newer database there made two
    lifecycle tests fail on the schema version instead of what they check."""
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
    if old is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = old


@pytest.fixture(scope="session")
def zygote(
    tmp_path_factory: pytest.TempPathFactory, _state_home_of_the_suite: None
) -> Iterator[Any]:
    """One process with TensorFlow imported; the training jobs and multi-worker jobs of
    the whole session are forked from it (tests/faults/zygote.py), so a job's process
    costs a fork, not a TensorFlow import (about 3.5 s of CPU each on the 2-core CI box)."""
    if importlib.util.find_spec("tensorflow") is None:  # not imported here: seconds
        pytest.skip("needs TensorFlow (pip install 'adaptd[tensorflow]')")
    from faults.zygote import Zygote

    z = Zygote(tmp_path_factory.mktemp("zygote"))
    yield z
    z.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory under /tmp, removed afterwards: ipc socket paths are limited to
    107 bytes, and pytest's tmp_path is often longer."""
    d = Path(tempfile.mkdtemp(prefix="adaptd-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


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
