"""Host-local scratch space for the saves of workers that are not the chief."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptd.client.save.scratch import ENV, Scratch, base_dir


def write_like_tf(prefix: str) -> None:
    Path(f"{prefix}.index").write_bytes(b"i")
    Path(f"{prefix}.data-00000-of-00001").write_bytes(b"d" * 100)


def test_each_save_is_removed_and_close_removes_the_directory(tmp_path) -> None:
    scratch = Scratch("job", 2, scratch_dir=tmp_path / "local")
    first = scratch.prefix(10)
    assert scratch.root is not None and scratch.root.parent == tmp_path / "local"
    assert scratch.root.name.startswith("adaptd-job-rank2-")
    write_like_tf(first)
    Path(f"{scratch.prefix(20)}_temp").mkdir()  # a write killed half-way
    scratch.discard(first)
    assert list(scratch.root.iterdir()) == []
    root = scratch.root
    scratch.close()
    assert not root.exists()
    assert Path(scratch.prefix(30)).parent.is_dir()  # usable again: a new directory


def test_the_directory_comes_from_the_argument_then_the_environment(tmp_path) -> None:
    env = {ENV: str(tmp_path / "env")}
    assert base_dir(tmp_path / "arg", env) == tmp_path / "arg"
    assert base_dir(None, env) == tmp_path / "env"
    assert base_dir(None, {}).is_dir()  # the system's temporary directory


def test_a_directory_that_cannot_be_made_is_a_clear_error(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"cannot be created.*host-local directory"):
        base_dir(tmp_path / "file" / "sub", {})


def test_a_killed_processs_scratch_goes_when_the_rank_comes_back(tmp_path) -> None:
    import signal
    import subprocess
    import sys

    base = tmp_path / "local"
    code = (
        "import os, signal, sys\n"
        "from adaptd.client.save.scratch import Scratch\n"
        f"s = Scratch('job', 1, scratch_dir={str(base)!r})\n"
        "open(s.prefix(5) + '.index', 'w').write('i')\n"
        "print(s.root, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = Path(r.stdout.strip())
    assert left.is_dir()  # SIGKILL: nothing of the process ran to tidy up
    other_rank = Scratch("job", 2, scratch_dir=base)
    other_rank.prefix(1)
    assert left.is_dir()  # not this rank's: kept
    mine = Scratch("job", 1, scratch_dir=base)
    mine.prefix(10)
    assert not left.exists()
    alive = Scratch("job", 1, scratch_dir=base)  # a live process's (this one's) is kept
    alive.prefix(11)
    assert mine.root is not None and mine.root.is_dir()
