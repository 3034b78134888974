"""The local tier from the daemon's config, at the wire and in the hook: a rank asks
its daemon (:mod:`adaptd.client.daemon.job_config`) and gets the config's entry; an
older daemon refuses the question and the rank goes on with its own settings at
once; an older hook, which never asks, gets the Welcome and Plan it knows; the hook's
own ``local_tier`` and ``$ADAPTD_LOCAL_TIER`` win over the config. Real ZeroMQ, a
real daemon in a thread, a real config file's parse. (The whole job through ``adaptd
serve``, killed and resumed: tests/integration/test_local_tier_config.py.)"""

from __future__ import annotations

import threading
import time
import typing
from pathlib import Path

import msgspec
import pytest
import zmq

from adaptd.client.daemon import job_config
from adaptd.client.daemon.link import DaemonLink
from adaptd.config import loader
from adaptd.daemon.jobs.job_config import from_overrides
from adaptd.protocol import job as p
from tests.daemon.daemon_helpers import thread_daemon

CONFIG = """
[jobs."cfg-*"]
local_tier = "/dev/shm/adaptd/{job}/{rank}"
[jobs."cfg-a"]
local_tier_memory = 0.1
local_tier = "/dev/shm/a/{rank}"
local_tier_disk = "/var/tmp/a/{rank}"
"""


def _without(union: typing.Any, kind: type) -> typing.Any:
    """``union`` as a daemon or hook built before ``kind`` existed decodes it."""
    return typing.Union[tuple(t for t in typing.get_args(union) if t is not kind)]  # noqa: UP007


def test_a_rank_gets_its_jobs_local_tier_from_the_daemon_and_an_old_hook_its_welcome(
    short_dir: Path,
) -> None:
    cfg = loader.loads(CONFIG)
    sock = short_dir / "d.sock"
    with thread_daemon(sock, job_config=from_overrides(cfg.job_override)):
        link = DaemonLink(f"ipc://{sock}")
        try:
            got = job_config.ask(link, "cfg-a", 1)
            assert got is not None
            assert (got.local_tier, got.local_tier_memory, got.local_tier_disk) == (
                "/dev/shm/a/{rank}", 0.1, "/var/tmp/a/{rank}",
            )  # fmt: skip
            got = job_config.ask(link, "cfg-b", 0)  # a glob's entry, the hook's defaults
            assert got is not None and got.local_tier == "/dev/shm/adaptd/{job}/{rank}"
            assert got.local_tier_memory is None and got.local_tier_disk == ""
            got = job_config.ask(link, "other", 0)
            assert got is not None and got.local_tier == ""
        finally:
            link.close()

        # a hook older than the question never asks: what it gets for a configured job
        # is what it knows (its decoder has no JobConfig)
        old_hook = msgspec.msgpack.Decoder(_without(p.DaemonMessage, p.JobConfig))
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"ipc://{sock}")
        try:
            dealer.send(p.encode(p.Hello(v=p.VERSION, job="cfg-a", pid=1)))
            kinds = []
            while len(kinds) < 2:
                assert dealer.poll(10_000), kinds
                kinds.append(type(old_hook.decode(dealer.recv())))
            assert kinds == [p.Welcome, p.Plan]
        finally:
            dealer.close(0)
            ctx.term()


def test_an_older_daemon_refuses_the_question_and_the_rank_goes_on_at_once(
    short_dir: Path,
) -> None:
    """An older daemon decodes with its own messages (no AskConfig) and answers a frame
    it cannot decode with an Error, as :class:`adaptd.daemon.jobs.handler.JobHandler`
    does: the rank does not wait out its deadline."""
    old_daemon = msgspec.msgpack.Decoder(_without(p.ClientMessage, p.AskConfig))
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"ipc://{short_dir}/old.sock")
    refused: list[str] = []

    def serve() -> None:
        if not router.poll(10_000):
            return
        peer, frame = router.recv_multipart()
        try:
            old_daemon.decode(frame)
        except msgspec.ValidationError as exc:
            refused.append(str(exc))
            error = p.Error(v=p.VERSION, code="invalid", message=f"invalid message: {exc}")
            router.send_multipart([peer, p.encode(error)])

    thread = threading.Thread(target=serve)
    thread.start()
    link = DaemonLink(f"ipc://{short_dir}/old.sock", timeout_s=30.0)
    try:
        start = time.perf_counter()
        assert job_config.ask(link, "cfg-a", 0) is None
        took = time.perf_counter() - start
        thread.join(10)
        assert refused and "ask_config" in refused[0]
        assert took < job_config.WELCOME_WAIT_S, f"waited {took:.2f} s for an older daemon"
    finally:
        link.close()
        thread.join(10)
        router.close(0)
        ctx.term()


@pytest.mark.tf
def test_the_hooks_own_local_tier_and_its_environment_win_over_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorflow as tf

    from adaptd.client import assembly
    from adaptd.client.options import HookOptions
    from adaptd.client.save.state import CheckpointState

    state = CheckpointState({"v": tf.Variable(1.0)})
    asked: list[int] = []

    def configured() -> p.JobConfig:
        asked.append(1)
        tier, disk = f"{tmp_path}/cfg/{{job}}/{{rank}}", f"{tmp_path}/disk/{{rank}}"
        return p.JobConfig(v=p.VERSION, job="j", local_tier=tier, local_tier_memory=0.1,
                           local_tier_disk=disk)  # fmt: skip

    monkeypatch.delenv(assembly.LOCAL_ENV, raising=False)
    local, _ = assembly.local_tier(state, None, "j", 3, HookOptions(), configured=configured)
    assert local is not None and local.home == tmp_path / "cfg" / "j" / "3"
    assert local.budget.share == 0.1 and local.fallback == tmp_path / "disk" / "3"

    own = HookOptions(local_tier=str(tmp_path / "own"), local_tier_memory=0.5)
    local, _ = assembly.local_tier(state, None, "j", 3, own, configured=configured)
    assert local is not None and local.home == tmp_path / "own" and local.budget.share == 0.5
    monkeypatch.setenv(assembly.LOCAL_ENV, str(tmp_path / "env"))
    local, _ = assembly.local_tier(state, None, "j", 3, HookOptions(), configured=configured)
    assert local is not None and local.home == tmp_path / "env"
    monkeypatch.setenv(assembly.LOCAL_ENV, "")  # one tier, whatever the config says
    assert assembly.local_tier(state, None, "j", 3, HookOptions(), configured=configured) == (
        None, None,
    )  # fmt: skip
    assert len(asked) == 1, "asked the daemon although the hook had its own setting"


def test_an_answer_after_the_hooks_deadline_is_left_alone(fake_daemon) -> None:
    """A JobConfig that comes once the run has started (the daemon answered late) does
    not change the run's tier, and is not taken for an agreement record."""
    from tests.client.test_session_relay import JOB, session_of

    session, chief = session_of(fake_daemon.endpoint)
    handed: list[p.DaemonMessage] = []
    chief.message = lambda msg, n, now: handed.append(msg)  # type: ignore[method-assign]
    try:
        late = p.JobConfig(v=p.VERSION, job=JOB, local_tier="/dev/shm/adaptd/{job}")
        session.on_message(late, 1, time.perf_counter())
        assert handed == []
    finally:
        session.link.close()
