"""Restore anywhere: a job on a "new host" (an empty local directory) continues from
the checkpoints its old host put on a durable destination, bit-exact.

Real TensorFlow jobs in subprocesses (tests/client/train_script.py: Keras model with
Dropout, Adam, a shuffled tf.data iterator and a tf.random.Generator), checkpoints
put on a local-directory destination and on a moto S3 server with
``Replica.upload`` (the daemon's path is tested with the Replicator), the new host
pointed there by ``ADAPTD_RESTORE_FROM``; the edge cases run in-process with a
small state and ``restore_from=`` / ``storage_options=``.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from adaptd.client import AdaptiveCheckpointer  # noqa: E402
from adaptd.client.restore import remote  # noqa: E402
from adaptd.tiers.replica import Replica, TierError  # noqa: E402

SCRIPT = Path(__file__).parents[1] / "client" / "train_script.py"
JOB = "train-script"  # the script's job id
STEPS = 30
pytestmark = [pytest.mark.tf]


# ---------------------------------------------------------------------- subprocess jobs


def start_job(ckpt: Path, out: Path, steps: int, **env_extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", **env_extra)
    env.pop("ADAPTD_SOCKET", None)
    if "ADAPTD_RESTORE_FROM" not in env_extra:
        env.pop("ADAPTD_RESTORE_FROM", None)
    sock = f"ipc://{ckpt.parent}/no-daemon.sock"
    cmd = [sys.executable, str(SCRIPT), str(ckpt), str(out), "--steps", str(steps),
           "--policy", "fixed:steps=10", "--socket", sock]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen, timeout: float = 240.0) -> tuple[list[str], str]:
    """Wait for a job; its stdout lines and stderr (the hook logs there)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"job did not finish within {timeout}s:\n{err[-3000:]}") from None
    assert proc.returncode == 0, f"job exited {proc.returncode}:\n{err[-3000:]}"
    return out.splitlines(), err


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An uninterrupted 30-step run, and a first host's run that stopped at step 20
    (checkpoints at 10 and 20), run side by side."""
    root = tmp_path_factory.mktemp("trained")
    ref = start_job(root / "ref", root / "ref.bin", STEPS)
    first = start_job(root / "host1", root / "host1.bin", 20)
    lines, _ = finish(first)
    # the report of the last save arrives at close(), after the loop's last line
    assert lines[0] == "start 0" and lines[-1] == "done"
    finish(ref)
    assert (root / "host1" / "ckpt-10.index").exists()
    assert (root / "host1" / "ckpt-20.index").exists()
    return {"ref": root / "ref.bin", "host1": root / "host1"}


def put(dest: Replica, local: Path, *steps: int) -> None:
    for step in steps:
        result = dest.upload(local, step, JOB)
        assert result.step == step and result.bytes_sent > 0


def assert_continues_from(lines: list[str], err: str, step: int) -> None:
    assert lines[0] == f"start {step}", (lines[:3], err[-2000:])
    assert lines[-1] == "done"


# ---------------------------------------------------------------------- new host, bit-exact


@pytest.mark.slow
def test_new_host_continues_from_a_local_destination_bit_exact(trained, tmp_path):
    dest = Replica(str(tmp_path / "dest" / JOB))
    put(dest, trained["host1"], 10, 20)
    new = tmp_path / "host2" / "ckpt"  # does not even exist yet
    out = tmp_path / "host2.bin"
    lines, err = finish(
        start_job(new, out, STEPS, ADAPTD_RESTORE_FROM=str(tmp_path / "dest" / "{job}"))
    )
    assert_continues_from(lines, err, 20)  # from an empty directory: pulled
    assert (new / "ckpt-20.index").exists()
    assert out.read_bytes() == trained["ref"].read_bytes()


@pytest.mark.slow
def test_new_host_continues_from_s3_and_skips_a_corrupted_newest(trained, tmp_path, s3):
    url = f"s3://{s3.bucket}/ckpts/{JOB}"
    dest = Replica(url, storage_options=s3.options)
    put(dest, trained["host1"], 10, 20)
    env = dict(s3.env, ADAPTD_RESTORE_FROM=f"s3://{s3.bucket}/ckpts/{{job}}")

    out = tmp_path / "host2.bin"
    lines, err = finish(start_job(tmp_path / "host2" / "ckpt", out, STEPS, **env))
    assert_continues_from(lines, err, 20)
    assert out.read_bytes() == trained["ref"].read_bytes()

    # the newest checkpoint's data object is damaged in place (same size): the next new
    # host restores the previous verified one and still ends bit-exact
    data = next(m for m in dest.manifest(20).files if ".data-" in m.name)
    key = f"{s3.bucket}/ckpts/{JOB}/{data.name}"
    blob = bytearray(s3.fs.cat_file(key))
    blob[len(blob) // 2] ^= 0xFF
    s3.fs.pipe_file(key, bytes(blob))
    out3 = tmp_path / "host3.bin"
    lines, err = finish(start_job(tmp_path / "host3" / "ckpt", out3, STEPS, **env))
    assert_continues_from(lines, err, 10)  # (its own ckpt-20 is saved later, from step 10)
    with pytest.raises(TierError, match="corrupted"):
        dest.verify(20)
    assert dest.latest() == 20  # a reader never moves LATEST
    assert out3.read_bytes() == trained["ref"].read_bytes()


# ---------------------------------------------------------------------- in-process edge cases


def _checkpointer(directory: Path, value: float = 0.0, **kw) -> AdaptiveCheckpointer:
    return AdaptiveCheckpointer(
        directory,
        job=kw.pop("job", "small"),
        policy="fixed:steps=1000000",
        socket=f"ipc://{directory.parent}/no-daemon-{directory.name}.sock",
        daemon_timeout=0.2,
        handle_sigterm=False,
        v=tf.Variable(tf.fill([1000], value)),
        **kw,
    )


def _saved_at(directory: Path, steps: int, value: float) -> Path:
    """A small checkpoint ``ckpt-<steps>`` holding ``value``, written by the hook."""
    with _checkpointer(directory, value) as c:
        assert c.restore_or_initialize() == 0
        c.step(steps)
        c.save()
    return directory


def test_an_empty_destination_starts_fresh_with_a_warning(tmp_path, caplog):
    empty = tmp_path / "dest"
    empty.mkdir()
    with caplog.at_level(logging.WARNING, "adaptd.client"):
        c = _checkpointer(tmp_path / "local", restore_from=str(empty))
        assert c.restore_or_initialize() == 0
        c.close()
    assert c.pulled is not None and c.pulled.step is None
    line = next(r.getMessage() for r in caplog.records if "starts fresh" in r.getMessage())
    assert str(empty) in line


def test_an_unreachable_destination_starts_fresh_with_a_warning(tmp_path, caplog):
    pytest.importorskip("s3fs")
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {
        "key": "testing",
        "secret": "testing",
        "endpoint_url": f"http://127.0.0.1:{port}",
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
    }
    with caplog.at_level(logging.WARNING, "adaptd.client"):
        c = _checkpointer(
            tmp_path / "local",
            restore_from="s3://no-bucket/nowhere/{job}",
            storage_options=options,
        )
        assert c.restore_or_initialize() == 0
        c.close()
    assert c.pulled.step is None
    assert any(
        "starts fresh" in r.getMessage() and "s3://" in r.getMessage() for r in caplog.records
    )
    assert not remote.has_checkpoint(tmp_path / "local")


def test_a_local_directory_with_checkpoints_never_pulls(tmp_path):
    dest = Replica(str(tmp_path / "dest"))
    dest.upload(_saved_at(tmp_path / "other", 7, 7.0), 7, "small")
    local = _saved_at(tmp_path / "local", 3, 3.0)
    c = _checkpointer(local, restore_from=str(tmp_path / "dest"))
    assert c.restore_or_initialize() == 3  # its own, although the destination has 7
    c.close()
    assert c.pulled.step is None and "already has checkpoints" in c.pulled.reason
    assert not (local / "ckpt-7.index").exists()
    assert float(c.checkpoint.v[0]) == 3.0


def test_restore_from_argument_and_environment(tmp_path, monkeypatch):
    dest = Replica(str(tmp_path / "dest" / "small"))
    dest.upload(_saved_at(tmp_path / "old", 5, 5.0), 5, "small")
    monkeypatch.setenv(remote.ENV, str(tmp_path / "dest" / "{job}"))
    c = _checkpointer(tmp_path / "new")
    assert c.restore_from == str(tmp_path / "dest" / "small")
    assert c.restore_or_initialize() == 5
    assert float(c.checkpoint.v[0]) == 5.0 and c.pulled.step == 5
    assert c.restore_s is not None and c.restore_s >= c.pulled.seconds
    c.close()
    # the argument wins over the environment
    c = _checkpointer(tmp_path / "new2", restore_from=str(tmp_path / "elsewhere"))
    assert c.restore_from == str(tmp_path / "elsewhere")
    c.close()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"restore_from": ""}, "restore_from must be a non-empty URL"),
        ({"restore_from": 5}, "restore_from must be a non-empty URL"),
        ({"restore_from": "nosuchproto://bucket/x"}, "no protocol 'nosuchproto'"),
        ({"storage_options": ["endpoint_url"]}, "storage_options must be a mapping"),
    ],
)
def test_bad_arguments_are_refused_at_construction(tmp_path, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        _checkpointer(tmp_path / "local", **kwargs)


def test_ranks_sharing_a_directory_pull_once(tmp_path):
    dest = Replica(str(tmp_path / "dest"))
    dest.upload(_saved_at(tmp_path / "old", 4, 4.0), 4, "small")
    target = tmp_path / "shared"
    results: list[remote.Pull] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(3)

    def rank() -> None:
        try:
            gate.wait(30)
            results.append(remote.pull_if_empty(target, str(tmp_path / "dest")))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(r.step is not None for r in results) == [False, False, True]
    assert tf.train.latest_checkpoint(str(target)).endswith("ckpt-4")


def test_adaptd_restore_gives_a_checkpoint_tf_restores(tmp_path, capsys):
    """The operator's command on a real checkpoint: TF (and adaptd verify) accept it."""
    from adaptd import cli
    from adaptd.client.restore import verify

    dest = Replica(str(tmp_path / "dest"))
    dest.upload(_saved_at(tmp_path / "old", 6, 6.0), 6, "small")
    new = tmp_path / "new"
    assert cli.main(["restore", "--from", str(tmp_path / "dest"), "--to", str(new)]) == 0
    assert "restored step 6" in capsys.readouterr().out
    latest = tf.train.latest_checkpoint(str(new))
    assert latest == str(new / "ckpt-6")
    v = tf.Variable(tf.zeros([1000]))
    tf.train.Checkpoint(v=v).restore(latest).expect_partial()
    assert float(v[0]) == 6.0
    assert verify.verify(str(new)).ok
