"""scripts/slowfs.py, the throttled FUSE mount that the save-storm benchmark and the
storage-fault tests use as a shared NFS server: its cap must hold across writers (it
is the yardstick other caps are measured against), its passthrough must be correct
enough for checkpoint writes, and it must unmount cleanly."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import slowfs

MIB = 2**20


def test_token_bucket_paces_to_its_rate_after_the_burst(fake_clock):
    clock = fake_clock
    bucket = slowfs.TokenBucket(10 * MIB, burst_bytes=MIB, clock=clock, sleep=clock.sleep)
    assert bucket.take(MIB) == 0.0  # the initial burst passes at once
    for _ in range(10):
        bucket.take(MIB)
    # 10 MiB beyond the burst at 10 MiB/s: one second of waiting, no more, no less
    assert clock.now - 100.0 == pytest.approx(1.0)
    assert bucket.waited_s == pytest.approx(1.0)
    clock.now += 5.0  # idle: the burst refills, but no more than the burst
    assert bucket.take(MIB) == 0.0
    assert bucket.take(MIB) == pytest.approx(0.1)


def test_token_bucket_refuses_a_nonsense_rate():
    with pytest.raises(ValueError, match="rate_bytes_s must be > 0, got 0"):
        slowfs.TokenBucket(0)


@pytest.fixture
def mounted(tmp_path):
    if why := slowfs.unavailable():
        pytest.skip(why)
    backing, mount = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mount.mkdir()
    with slowfs.slow_mount(backing, mount, bandwidth_mib_s=8) as fs:
        yield fs
    assert not os.path.ismount(mount), "slowfs left its mount behind"
    assert fs.proc.returncode == 0, "\n".join(fs.lines)


def test_writers_share_one_cap_and_the_files_are_whole(mounted):
    """Three writers, 4 MiB each, at 8 MiB/s together: about 1.5 s, not 0.5 s."""
    mount = mounted.mount
    payloads = {f"w{i}": bytes([i + 1]) * (4 * MIB) for i in range(3)}

    def write(name: str) -> None:  # the way TF and fsspec do it: temp file, fsync, rename
        tmp = mount / f"{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(payloads[name])
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, mount / name)

    t0 = time.monotonic()
    threads = [threading.Thread(target=write, args=(n,)) for n in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    # 12 MiB at 8 MiB/s is 1.5 s (less the 256 KiB burst); the upper bound only guards
    # against a stuck server on a busy machine
    assert 1.3 < seconds < 10, seconds
    assert sorted(os.listdir(mount)) == sorted(payloads)
    for name, data in payloads.items():
        assert (mounted.backing / name).read_bytes() == data
    # the rest of what checkpoint writers and readers do
    (mount / "d" / "e").mkdir(parents=True)
    with open(mount / "w0", "r+b") as f:
        f.truncate(10)
    assert (mount / "w0").stat().st_size == 10
    assert (mount / "w0").read_bytes() == b"\x01" * 10
    os.unlink(mount / "w1")
    (mount / "d" / "e").rmdir()
    assert os.statvfs(mount).f_bsize > 0
    assert sorted(os.listdir(mount)) == ["d", "w0", "w2"]


def test_sigterm_unmounts_and_reports_what_went_through(mounted):
    (mounted.mount / "f").write_bytes(b"x" * MIB)
    mounted.proc.terminate()
    mounted.proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while mounted.stats is None and time.monotonic() < deadline:
        threading.Event().wait(0.02)  # the reader thread parses the last line
    assert mounted.stats is not None, "\n".join(mounted.lines)
    assert mounted.stats["bytes_written"] == MIB
    assert not os.path.ismount(mounted.mount)


def test_a_missing_backing_directory_is_named(tmp_path):
    (tmp_path / "mnt").mkdir()
    with (
        pytest.raises(slowfs.SlowFSError, match=r"backing directory .*nope does not exist"),
        slowfs.slow_mount(tmp_path / "nope", tmp_path / "mnt", bandwidth_mib_s=1),
    ):
        pass
