"""Starting under a daemon: the plan is in force when ``restore_or_initialize()`` returns.

Issue 11: ``ckptr.mode`` read ``embedded`` right after ``restore_or_initialize()``
with a daemon running (its Welcome and Plan were read only at the first poll), and
the no-daemon warning named the package default's policy ``'Default'`` (its class),
not its spec. A real daemon in a thread, real TensorFlow.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client import AdaptiveCheckpointer  # noqa: E402
from adaptd.daemon.assembly import build  # noqa: E402
from adaptd.daemon.options import DaemonOptions  # noqa: E402

pytestmark = pytest.mark.tf


def test_the_daemons_plan_is_in_force_when_restore_returns(short_dir: Path) -> None:
    sock = short_dir / "adaptd.sock"
    with build(DaemonOptions(socket=sock, default_policy="fixed:steps=50")).start():
        ckptr = AdaptiveCheckpointer(
            short_dir / "ck", job="starts", socket=f"ipc://{sock}", handle_sigterm=False,
            v=tf.Variable(1.0),
        )  # fmt: skip
        t0 = time.perf_counter()
        ckptr.restore_or_initialize()
        waited = time.perf_counter() - t0
        try:
            assert ckptr.mode == "daemon"
            due = ckptr.next_save
            assert due is not None and due.step == 50 and due.source == "daemon"
            assert waited < 1.0  # a live daemon answers at once
        finally:
            ckptr.close()


def test_without_a_daemon_there_is_no_wait_and_the_warning_names_the_spec(
    short_dir: Path, caplog
) -> None:
    ckptr = AdaptiveCheckpointer(
        short_dir / "ck", job="alone", socket=f"ipc://{short_dir}/none.sock", daemon_timeout=0.2,
        handle_sigterm=False, v=tf.Variable(1.0),
    )  # fmt: skip
    t0 = time.perf_counter()
    ckptr.restore_or_initialize()
    assert time.perf_counter() - t0 < 0.5 and ckptr.mode == "embedded"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        deadline = time.monotonic() + 10
        while not caught:
            assert time.monotonic() < deadline, "no fallback warning within 10 s"
            ckptr.step()
    text = str(caught[0].message)
    assert "deciding in-process with policy 'default'" in text, text
    ckptr.close()
