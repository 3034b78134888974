"""The daemon budgets its jobs' memory tiers (issue 24 item 5) through a real
``adaptd serve``: ``daemon.memory_tier_share`` of the host's available memory (psutil)
is split evenly between the jobs whose hello says their local tier is in memory, each
learns its part on the plan (``memory_budget``), a job joining halves the first one's,
a job with a disk tier gets none; and a real hook given a budget too small for its saves
keeps at most that in memory and saves to local disk, saying why."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import psutil
import pytest
import zmq

from adaptd.protocol import job as p

from ._serve import NotifyListener, Peer, Serve

SHARE = 0.01


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.term()


def _serve(short_dir: Path, share: float) -> tuple[Serve, NotifyListener, Path]:
    state = short_dir / "state"
    conf = short_dir / "adaptd.toml"
    # no metrics port: a config file makes a busy one fatal, and the suite's other
    # process may run a daemon on the default port (a two-process run lost this test so)
    conf.write_text(
        f'[daemon]\nstate_dir = "{state}"\nmemory_tier_share = {share!r}\n'
        '[metrics]\nlisten = "off"\n'
    )
    sock = short_dir / "a.sock"
    notify = NotifyListener(short_dir / "notify")
    return Serve(["--config", str(conf), "--socket", str(sock)], notify, {}), notify, sock


def _budget(peer: Peer, step: int, until, timeout: float = 20.0) -> int | None:
    """Report steps until a plan's ``memory_budget`` satisfies ``until``; that budget."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "no plan with the budget expected"
        step += 10
        peer.steps(step, mean_s=0.5)
        try:
            while True:
                msg = peer.recv(0.3)
                if isinstance(msg, p.Plan) and until(msg.memory_budget):
                    return msg.memory_budget
        except TimeoutError:
            pass


def _hello(ctx, sock: Path, job: str, tier: str) -> Peer:
    peer = Peer(ctx, f"ipc://{sock}", job)
    peer.send(p.Hello(v=p.VERSION, job=job, pid=os.getpid(), gpus=1, local_tier=tier))
    peer.until(p.Welcome)
    return peer


@pytest.mark.slow
def test_two_memory_tiers_on_one_daemon_each_get_half_its_share(short_dir: Path, ctx) -> None:
    d, notify, sock = _serve(short_dir, SHARE)
    peers: list[Peer] = []
    try:
        d.ready()
        peers.append(a := _hello(ctx, sock, "a", "memory"))
        alone = _budget(a, 0, lambda b: b is not None)
        whole = SHARE * psutil.virtual_memory().available
        assert 0.7 * whole < alone < 1.3 * whole, (alone, whole)
        peers.append(b := _hello(ctx, sock, "b", "memory"))
        peers.append(c := _hello(ctx, sock, "c", "disk"))
        half_a = _budget(a, 100, lambda x: x is not None and x < 0.75 * alone)
        half_b = _budget(b, 0, lambda x: x is not None)
        assert 0.35 * alone < half_a < 0.65 * alone, (half_a, alone)
        assert 0.9 * half_a < half_b < 1.1 * half_a, (half_a, half_b)
        # a disk tier is not budgeted: its plans carry none
        plan = None
        deadline = time.monotonic() + 10
        while plan is None:
            assert time.monotonic() < deadline
            c.steps(10, mean_s=0.5)
            with contextlib.suppress(TimeoutError):
                plan = c.until(p.Plan, timeout=0.5)
        assert plan.memory_budget is None
        a.send(p.Goodbye(v=p.VERSION, job="a", rank=0, step=200, reason="done"))
        whole_b = _budget(b, 100, lambda x: x is not None and x > 0.75 * alone)
        assert 0.7 * alone < whole_b < 1.3 * alone, "the job left: its half goes back"
    finally:
        for peer in peers:
            peer.close()
        d.kill()
        notify.close()


@pytest.mark.slow
@pytest.mark.tf
def test_a_hook_given_a_small_budget_by_the_daemon_keeps_at_most_what_fits(
    short_dir: Path, caplog
) -> None:
    tf = pytest.importorskip("tensorflow")
    from adaptd.client import AdaptiveCheckpointer
    from adaptd.client.save.local_tier import _held, copies

    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this host")
    # 1 MiB of state: a memory tier keeps its newest copy while the next is written, so
    # a budget of 1.5 MiB (far below the hook's own bound) does not fit a save
    size = 1 << 20
    share = 1.5 * size / psutil.virtual_memory().available
    d, notify, sock = _serve(short_dir, share)
    shm = Path("/dev/shm") / f"adaptd-test-{uuid.uuid4().hex[:8]}"
    ckptr = None
    try:
        d.ready()
        v = tf.Variable(tf.zeros([size // 4], tf.float32))
        ckptr = AdaptiveCheckpointer(
            short_dir / "ckpts", job="h", socket=f"ipc://{sock}", handle_sigterm=False,
            policy="fixed:steps=2,durable_every=4", local_tier=shm, report_interval=0.1,
            local_tier_disk=short_dir / "disk", v=v,
        )  # fmt: skip
        tier = ckptr._saver.saves.local
        assert ckptr.restore_or_initialize() == 0
        deadline = time.monotonic() + 30
        with caplog.at_level(logging.INFO, logger="adaptd.client"):
            while tier.daemon_budget is None:  # the plan with the budget comes once a tick
                assert time.monotonic() < deadline, "the daemon sent no memory budget"
                ckptr.step()
                time.sleep(0.05)
            budget = tier.daemon_budget
            assert 1.1 * size < budget < 1.95 * size, budget  # one copy fits, not two
            assert budget < tier.budget.limit(0), "the daemon's budget is the smaller bound"
            held_most, on_disk = 0, 0
            for i in range(16):
                v.assign_add(tf.ones_like(v))
                ckptr.step()
                if i < 4:  # the next save makes room: what was held before the budget
                    continue
                held_most = max(held_most, _held(shm))
                on_disk = max(on_disk, len(copies(short_dir / "disk")))
        # the newest copy and the next one do not fit in 1.5 MiB: the saves went to disk,
        # and memory kept at most the budget
        assert held_most <= budget, (held_most, budget)
        assert tier.directory == short_dir / "disk", "no fallback to local disk"
        assert "the daemon's share" in tier.fell_back, tier.fell_back
        assert "saving to local disk" in caplog.text
        assert on_disk >= 1, "the local saves after the fallback are on local disk"
        ckptr.close()
        ckptr = None
    finally:
        if ckptr is not None:
            ckptr.close()
        shutil.rmtree(shm, ignore_errors=True)
        d.kill()
        notify.close()
