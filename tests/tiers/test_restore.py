"""restore() and ``adaptd restore`` against a local directory and moto's S3.

Synthetic checkpoint files (seeded bytes with TF's names): what is checked here is
which step is fetched, that every byte matches, the state file and the command's
output and exit status. Restoring real TF checkpoints (and training on from them)
is tests/tiers/test_client_restore.py.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from adaptd import cli
from adaptd.commands.restore import parse_storage_options
from adaptd.tiers.replica import Replica, TierError, local_files
from adaptd.tiers.restore import restore

from .conftest import Dest, write_checkpoint


def published(dest: Dest, tmp_path: Path, *steps: int) -> Path:
    """Upload ``steps`` (synthetic) to ``dest``; returns the local folder they came from."""
    local = tmp_path / "old-host"
    rep = Replica(dest.url, storage_options=dest.options)
    for s in steps:
        write_checkpoint(local, s, shards=(200_000, 3_000))
        rep.upload(local, s, "job")
    return local


def same_files(local: Path, new: Path, step: int) -> bool:
    return all((new / p.name).read_bytes() == p.read_bytes() for p in local_files(local, step))


# ---------------------------------------------------------------------- restore()


def test_restore_newest_into_a_new_directory(dest, tmp_path):
    local = published(dest, tmp_path, 10, 20)
    new = tmp_path / "new-host" / "ckpt"  # does not exist yet
    fetched: list[int] = []
    began = []
    result = restore(
        dest.url, new, storage_options=dest.options, progress=fetched.append, on_step=began.append
    )
    assert (result.step, result.files, result.bytes, result.skipped) == (20, 3, 205_000, ())
    assert sum(fetched) == 205_000 and [m.step for m in began] == [20]
    assert same_files(local, new, 20)
    assert sorted(p.name for p in new.iterdir()) == [
        "checkpoint",
        "ckpt-20.data-00000-of-00002",
        "ckpt-20.data-00001-of-00002",
        "ckpt-20.index",
    ]
    assert (new / "checkpoint").read_text() == (
        'model_checkpoint_path: "ckpt-20"\nall_model_checkpoint_paths: "ckpt-20"\n'
    )


def test_restore_a_chosen_step_without_fallback(dest, tmp_path):
    local = published(dest, tmp_path, 10, 20)
    assert restore(dest.url, tmp_path / "a", storage_options=dest.options, step=10).step == 10
    assert same_files(local, tmp_path / "a", 10)
    assert '"ckpt-10"' in (tmp_path / "a" / "checkpoint").read_text()
    with pytest.raises(TierError, match="no step 15 there; it has steps 10, 20"):
        restore(dest.url, tmp_path / "b", storage_options=dest.options, step=15)
    dest.write("ckpt-10.index", b"garbage")
    with pytest.raises(TierError, match=r"ckpt-10\.index: 7 bytes, the manifest says"):
        restore(dest.url, tmp_path / "c", storage_options=dest.options, step=10)
    assert not (tmp_path / "c" / "checkpoint").exists()


def test_nothing_there_or_nothing_verifies(dest, tmp_path):
    with pytest.raises(TierError, match="no checkpoint there"):
        restore(dest.url, tmp_path / "a", storage_options=dest.options)
    published(dest, tmp_path, 10, 20)
    dest.delete("ckpt-10.index")
    dest.write("ckpt-20.index", b"x" * 2_000)  # same size, other content
    with pytest.raises(TierError, match="no checkpoint verifies") as info:
        restore(dest.url, tmp_path / "b", storage_options=dest.options)
    assert "step 20: " in str(info.value) and "corrupted" in str(info.value)
    assert "step 10: " in str(info.value) and "missing" in str(info.value)
    assert [p.name for p in (tmp_path / "b").iterdir()] == []  # no temporary file left


# ---------------------------------------------------------------------- adaptd restore


def run_cli(*args: str) -> int:
    return cli.main(["restore", *args])


def test_cli_restores_into_an_empty_directory(dest, tmp_path, capsys):
    local = published(dest, tmp_path, 10, 20)
    opts = [f"--storage-option={k}={v}" for k, v in dest.options.items()]
    assert run_cli("--from", dest.url, "--to", str(tmp_path / "new"), *opts) == 0
    out = capsys.readouterr().out
    assert f"restored step 20 from {dest.url} into {tmp_path / 'new'}: 3 files" in out
    assert "verified" in out and same_files(local, tmp_path / "new", 20)


def test_cli_step_and_json(tmp_path, capsys):
    dest = Dest("local", str(tmp_path / "dest"), {}, {}, _local=tmp_path / "dest")
    published(dest, tmp_path, 10, 20)
    dest.write("ckpt-20.data-00001-of-00002", b"\0" * 3_000)
    code = run_cli("--from", dest.url, "--to", str(tmp_path / "new"), "--json")
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["ok"] is True
    assert (doc["step"], doc["files"], doc["bytes"]) == (10, 3, 205_000)
    assert doc["skipped"][0]["step"] == 20 and "corrupted" in doc["skipped"][0]["reason"]
    assert doc["from"] == dest.url and doc["to"] == str(tmp_path / "new")

    code = run_cli("--from", dest.url, "--to", str(tmp_path / "new2"), "--step", "20", "--json")
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["ok"] is False
    assert "ckpt-20.data-00001-of-00002: sha256" in doc["error"]
    assert not (tmp_path / "new2" / "checkpoint").exists()


def test_cli_refuses_a_directory_with_checkpoints_unless_forced(tmp_path, capsys):
    dest = Dest("local", str(tmp_path / "dest"), {}, {}, _local=tmp_path / "dest")
    published(dest, tmp_path, 10)
    target = write_checkpoint(tmp_path / "busy", 3, shards=(10,))
    assert run_cli("--from", dest.url, "--to", str(target)) == 2
    err = capsys.readouterr().err
    assert f"--to {target} already holds checkpoints" in err and "--force" in err
    assert not (target / "ckpt-10.index").exists()
    assert run_cli("--from", dest.url, "--to", str(target), "--force") == 0
    assert (target / "ckpt-10.index").exists() and (target / "ckpt-3.index").exists()
    # a directory with other files only is fine
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.log").write_text("x")
    assert run_cli("--from", dest.url, "--to", str(tmp_path / "logs")) == 0


def test_cli_errors_name_the_url_and_what_to_do(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli("--from", str(empty), "--to", str(tmp_path / "new")) == 1
    err = capsys.readouterr().err
    assert f"adaptd restore: {empty}: no checkpoint there" in err
    assert "check the URL" in err
    assert run_cli("--from", "nosuchproto://x/y", "--to", str(tmp_path / "new")) == 1
    assert "nosuchproto://x/y: not a usable destination URL" in capsys.readouterr().err
    assert run_cli("--from", str(empty), "--to", str(tmp_path / "n"), "--storage-option=k") == 2
    assert "--storage-option wants KEY=VALUE, got 'k'" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert run_cli("--from", str(empty), "--to", str(tmp_path / "file")) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        run_cli("--to", str(tmp_path / "new"))
    assert exc.value.code == 2 and "--from" in capsys.readouterr().err


def test_cli_reports_an_unreachable_s3_endpoint(tmp_path, capsys):
    pytest.importorskip("s3fs")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = run_cli(
        "--from", "s3://bucket/ckpts/job", "--to", str(tmp_path / "new"),
        f"--storage-option=endpoint_url=http://127.0.0.1:{port}",
        "--storage-option=key=k", "--storage-option=secret=s",
        '--storage-option=config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2}',
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "s3://bucket/ckpts/job" in err and "failed" in err
    assert "check the URL" in err and "--storage-option values" in err
    # an option the S3 client does not know is the destination's problem, not a crash
    code = run_cli(
        "--from", "s3://bucket/ckpts/job", "--to", str(tmp_path / "new"),
        f"--storage-option=endpoint_url=http://127.0.0.1:{port}", "--storage-option=bogus=1",
    )  # fmt: skip
    assert code == 1 and "unexpected keyword argument 'bogus'" in capsys.readouterr().err


def test_storage_options_parse():
    assert parse_storage_options(
        ["endpoint_url=http://h:9000", "anon=true", "client_kwargs.region_name=eu", "n=3", "e="]
    ) == {
        "endpoint_url": "http://h:9000",
        "anon": True,
        "client_kwargs": {"region_name": "eu"},
        "n": 3,
        "e": "",
    }


def test_cli_in_a_subprocess_with_s3_credentials_from_the_environment(s3, tmp_path):
    """The operator's way: AWS_* variables, no options on the command line; on a
    terminal the progress bar is drawn on stderr."""
    dest = Dest("s3", s3.url("ckpts", "job"), s3.options, s3.env, _s3=s3)
    local = published(dest, tmp_path, 7)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaptd.cli", "restore", "--from", dest.url,
         "--to", str(tmp_path / "new")],
        stdout=subprocess.PIPE, stderr=slave,
        env=dict(os.environ, **s3.env, COLUMNS="100", TERM="xterm"),
    )  # fmt: skip
    os.close(slave)
    tty = b""
    while True:  # drain the terminal until the command closes it
        ready, _, _ = select.select([master], [], [], 60)
        assert ready, "no output from adaptd restore within 60 s"
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        tty += chunk
    os.close(master)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, tty.decode(errors="replace")
    assert b"restored step 7" in out
    assert b"step 7: fetching and verifying" in tty
    assert same_files(local, tmp_path / "new", 7)


def test_leftovers_of_a_killed_restore_are_removed(tmp_path):
    dest = Dest("local", str(tmp_path / "dest"), {}, {}, _local=tmp_path / "dest")
    local = published(dest, tmp_path, 10)
    new = tmp_path / "new"
    new.mkdir()
    (new / ".ckpt-10.index.restore").write_bytes(b"half")
    (new / ".checkpoint.restore").write_text("half")
    (new / ".mine.restore").write_text("not ours")
    assert restore(dest.url, new).step == 10
    assert sorted(p.name for p in new.iterdir()) == [
        ".mine.restore",
        "checkpoint",
        "ckpt-10.data-00000-of-00002",
        "ckpt-10.data-00001-of-00002",
        "ckpt-10.index",
    ]
    assert same_files(local, new, 10)
