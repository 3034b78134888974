"""adaptd.tiers.replica against a local directory (standing for NFS) and a real S3 server.

The S3 side is moto's server mode on loopback (tests/tiers/conftest.py), reached
through s3fs over HTTP. Checkpoint files are synthetic (seeded bytes, TF's names):
the storage layer does not look inside them; tests/tiers/test_client_restore.py
restores real TensorFlow checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import ClassVar

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from adaptd.tiers.replica import (
    ABANDONED_AFTER_S,
    CHUNK,
    Manifest,
    Replica,
    Throttle,
    TierError,
    local_files,
    manifest_name,
)
from adaptd.tiers.restore import restore

from .conftest import Dest, write_checkpoint

MiB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def replica(dest: Dest) -> Replica:
    return Replica(dest.url, storage_options=dest.options)


# ---------------------------------------------------------------------- layout


def test_upload_writes_files_then_manifest_then_latest(dest, tmp_path):
    local = write_checkpoint(tmp_path / "local", 10, shards=(300_000, 5_000))
    write_checkpoint(local, 20)
    rep = replica(dest)
    assert rep.steps() == [] and rep.latest() is None

    first = rep.upload(local, 10, "job")
    second = rep.upload(local, 20, "job")

    assert (first.step, first.files, first.resumed_files) == (10, 3, 0)
    assert first.bytes_sent == first.bytes_total == 305_000 + 2_000
    assert second.bytes_sent == 302_000
    assert rep.steps() == [10, 20] and rep.latest() == 20
    assert dest.names() == [
        "LATEST",
        "ckpt-10.data-00000-of-00002",
        "ckpt-10.data-00001-of-00002",
        "ckpt-10.index",
        "ckpt-10.manifest.json",
        "ckpt-20.data-00000-of-00001",
        "ckpt-20.index",
        "ckpt-20.manifest.json",
    ]  # no journal, no partial file left
    m = json.loads(dest.read("ckpt-10.manifest.json"))
    assert (m["version"], m["job"], m["step"], m["bytes"]) == (1, "job", 10, 307_000)
    assert abs(m["created"] - time.time()) < 60
    expected = [
        {"name": p.name, "size": p.stat().st_size, "sha256": sha(p.read_bytes())}
        for p in local_files(local, 10)
    ]
    assert m["files"] == expected
    assert [f["name"] for f in m["files"]][-1] == "ckpt-10.index"  # data first, index last
    for f in expected:
        assert dest.read(f["name"]) == (local / f["name"]).read_bytes()
    latest = json.loads(dest.read("LATEST"))
    assert latest["step"] == 20 and latest["manifest"] == "ckpt-20.manifest.json"
    assert rep.verify(20).files == rep.manifest(20).files


def test_latest_never_moves_back(dest, tmp_path):
    local = write_checkpoint(tmp_path / "local", 10)
    write_checkpoint(local, 20)
    rep = replica(dest)
    rep.upload(local, 20, "job")
    before = dest.read("LATEST")
    result = rep.upload(local, 10, "job")  # an older step arrives late
    assert result.bytes_sent > 0 and rep.steps() == [10, 20]
    assert rep.latest() == 20 and dest.read("LATEST") == before


def test_a_published_step_is_not_sent_again_but_latest_is_repaired(dest, tmp_path):
    local = write_checkpoint(tmp_path / "local", 10)
    rep = replica(dest)
    rep.upload(local, 10, "job")
    dest.delete("LATEST")  # as if the uploader died between the manifest and LATEST
    again = rep.upload(local, 10, "job")
    assert (again.bytes_sent, again.resumed_files) == (0, again.files)
    assert rep.latest() == 10


def test_a_step_saved_again_with_other_content_replaces_the_old_one(dest, tmp_path):
    """A job rolled back to an older step saves ckpt-<step> again (other bytes): the
    old manifest goes first, then the new files and manifest are published."""
    local = write_checkpoint(tmp_path / "local", 10, shards=(1000,))
    rep = replica(dest)
    rep.upload(local, 10, "job")
    data = local / "ckpt-10.data-00000-of-00001"
    data.write_bytes(bytes(reversed(data.read_bytes())))  # same names and sizes, new content
    again = rep.upload(local, 10, "job")
    assert again.bytes_sent == again.bytes_total == 1000 + 2000
    assert rep.verify(10).files[0].sha256 == sha(data.read_bytes())
    assert dest.read(data.name) == data.read_bytes()


def test_local_checkpoint_missing_or_incomplete(tmp_path):
    rep = Replica(str(tmp_path / "dest"))
    with pytest.raises(FileNotFoundError, match=r"ckpt-7\.index"):
        rep.upload(tmp_path / "nothing", 7, "job")
    local = write_checkpoint(tmp_path / "local", 7, shards=(10, 10))
    (local / "ckpt-7.data-00001-of-00002").unlink()  # max_to_keep deleting it
    with pytest.raises(FileNotFoundError, match="incomplete set of data shards"):
        rep.upload(local, 7, "job")
    assert rep.steps() == []


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("", "non-empty"),
        ("nosuchproto://bucket/x", "not a usable destination URL"),
    ],
)
def test_bad_urls_are_refused(url, needle):
    with pytest.raises(TierError, match=needle):
        Replica(url)


def test_file_url_is_a_mounted_path(tmp_path):
    local = write_checkpoint(tmp_path / "local", 3)
    rep = Replica(f"file://{tmp_path}/dest/")
    assert rep.local and not rep.object_store
    rep.upload(local, 3, "job")
    assert (tmp_path / "dest" / "ckpt-3.manifest.json").exists()
    assert Replica(str(tmp_path / "dest")).verify(3).step == 3


def test_an_unwritable_destination_is_a_tier_error(s3, tmp_path):
    local = write_checkpoint(tmp_path / "local", 1)
    rep = Replica(f"s3://no-such-bucket-{s3.bucket}/job", storage_options=s3.options)
    with pytest.raises(TierError, match="no-such-bucket") as info:
        rep.upload(local, 1, "job")
    assert info.value.__cause__ is not None


# ---------------------------------------------------------------------- integrity


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_object_detected_and_restore_falls_back(dest, tmp_path, damage):
    local = write_checkpoint(tmp_path / "local", 10)
    write_checkpoint(local, 20)
    rep = replica(dest)
    rep.upload(local, 10, "job")
    rep.upload(local, 20, "job")
    name = "ckpt-20.data-00000-of-00001"
    blob = bytearray(dest.read(name))
    if damage == "truncate":
        dest.write(name, bytes(blob[: len(blob) // 2]))
        needle = "150000 bytes, the manifest says 300000"
    elif damage == "flip":
        blob[len(blob) // 3] ^= 0x01  # one bit, same size
        dest.write(name, bytes(blob))
        needle = "sha256 .*corrupted"
    else:
        dest.delete(name)
        needle = "missing"
    with pytest.raises(TierError, match=f"{name}: {needle}"):
        rep.verify(20)
    rep.verify(10)

    new = tmp_path / "new-host"
    result = restore(dest.url, new, storage_options=dest.options)
    assert result.step == 10 and [s for s, _ in result.skipped] == [20]
    assert name in result.skipped[0][1]
    assert sorted(p.name for p in new.iterdir()) == [
        "checkpoint",
        "ckpt-10.data-00000-of-00001",
        "ckpt-10.index",
    ]  # nothing of step 20, no temporary file
    for p in local_files(local, 10):
        assert (new / p.name).read_bytes() == p.read_bytes()
    assert rep.latest() == 20  # a reader never moves LATEST


def test_a_bad_manifest_is_not_trusted(dest, tmp_path):
    local = write_checkpoint(tmp_path / "local", 10)
    write_checkpoint(local, 20)
    write_checkpoint(local, 30)
    rep = replica(dest)
    for s in (10, 20, 30):
        rep.upload(local, s, "job")
    dest.write(manifest_name(30), dest.read(manifest_name(30))[:-20])  # torn JSON
    evil = json.loads(dest.read(manifest_name(20)))
    evil["files"][0]["name"] = "../../etc/ckpt-20.index"  # must never be written outside
    dest.write(manifest_name(20), json.dumps(evil).encode())
    with pytest.raises(TierError, match="not a valid manifest"):
        rep.manifest(30)
    with pytest.raises(TierError, match="is not a file of ckpt-20"):
        rep.verify(20)
    result = restore(dest.url, tmp_path / "new", storage_options=dest.options)
    assert result.step == 10 and [s for s, _ in result.skipped] == [30, 20]


# ---------------------------------------------------------------------- throttle


def test_throttle_arithmetic(fake_clock):
    clock = fake_clock
    t = Throttle(1000.0, burst_s=0.5, clock=clock, sleep=clock.sleep)
    t.take(500)  # starts empty: 500 bytes at 1000 B/s
    assert clock.slept == [0.5]
    clock.now += 10.0  # idle: the bucket refills to the burst only (500 bytes)
    t.take(400)
    t.take(300)  # 100 left, 200 short: 0.2 s
    assert clock.slept == [0.5, pytest.approx(0.2)]
    t.take(0)
    Throttle(None, clock=clock, sleep=clock.sleep).take(10**12)
    assert len(clock.slept) == 2


@pytest.mark.parametrize("rate", [0, -1.0, float("nan"), float("inf"), "10", True])
def test_throttle_rejects_bad_rates(rate):
    with pytest.raises(ValueError, match="positive number of bytes/s"):
        Throttle(rate)


def test_throttle_is_shared_by_concurrent_uploads():
    """Two threads through one bucket: together they get the rate, not twice it."""
    t = Throttle(4 * MiB, burst_s=0.0)
    t0 = time.monotonic()

    def send() -> None:
        for _ in range(4):
            t.take(MiB // 2)

    threads = [threading.Thread(target=send) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    took = time.monotonic() - t0
    assert 0.95 <= took < 5.0, took  # 4 MiB at 4 MiB/s: one second, not half


def test_throttled_upload_is_measured_at_the_cap(tmp_path):
    local = write_checkpoint(tmp_path / "local", 1, shards=(16 * MiB,), index=4096)
    t0 = time.perf_counter()
    fast = Replica(str(tmp_path / "fast")).upload(local, 1, "job")
    unthrottled = time.perf_counter() - t0
    cap = Throttle(8 * MiB)
    t0 = time.perf_counter()
    slow = Replica(str(tmp_path / "slow")).upload(local, 1, "job", throttle=cap)
    throttled = time.perf_counter() - t0
    assert fast.bytes_sent == slow.bytes_sent == 16 * MiB + 4096
    # 2.0 s at the cap; the bucket may have filled for at most burst_s before the first chunk
    assert throttled >= (16 * MiB + 4096) / (8 * MiB) - cap.burst_s
    assert throttled < 10.0
    assert unthrottled < throttled / 2, (unthrottled, throttled)


# ---------------------------------------------------------------------- yielding


def test_should_yield_pauses_the_upload(tmp_path):
    local = write_checkpoint(tmp_path / "local", 1, shards=(3 * CHUNK,))
    rep = Replica(str(tmp_path / "dest"))
    rep.yield_poll_s = 0.01
    training_saves = threading.Event()
    training_saves.set()
    asked = threading.Semaphore(0)
    sent: list[int] = []

    def should_yield() -> bool:
        asked.release()
        return training_saves.is_set()

    results = []
    th = threading.Thread(
        target=lambda: results.append(
            rep.upload(local, 1, "job", should_yield=should_yield, progress=sent.append)
        )
    )
    th.start()
    for _ in range(5):  # polled again and again, and nothing went meanwhile
        assert asked.acquire(timeout=10)
    assert sent == []
    training_saves.clear()
    th.join(30)
    assert sum(sent) == 3 * CHUNK + 2000 and results[0].bytes_sent == sum(sent)
    assert results[0].yielded_s > 0
    rep.verify(1)


def test_a_pause_counts_from_when_the_upload_said_it_yields(tmp_path):
    """The daemon shows "yielding" (and logs it) inside ``should_yield``; a thread that
    loses the CPU right there can find the save over when it runs again. The pause
    lasted from that first answer, not from the thread's return (a CI run logged
    ``yielded_s=0.0`` for a pause a test had watched)."""
    local = write_checkpoint(tmp_path / "local", 1, shards=(CHUNK,), index=100)
    rep = Replica(str(tmp_path / "dest"))
    rep.yield_poll_s = 0.01
    answers = iter([True])  # the job saves at the first chunk, and never after

    def should_yield() -> bool:
        first = next(answers, False)
        if first:
            time.sleep(0.2)  # descheduled after saying "yielding", before returning
        return first

    result = rep.upload(local, 1, "job", should_yield=should_yield)
    assert result.yielded_s >= 0.2, result


def test_yielding_is_bounded(tmp_path):
    local = write_checkpoint(tmp_path / "local", 1, shards=(CHUNK,), index=100)
    rep = Replica(str(tmp_path / "dest"))
    rep.max_yield_s = 0.1
    rep.yield_poll_s = 0.01
    result = rep.upload(local, 1, "job", should_yield=lambda: True)  # a job always saving
    assert result.bytes_sent == CHUNK + 100
    assert 0.2 <= result.yielded_s < 5  # one bounded pause per chunk (two chunks)


# ---------------------------------------------------------------------- resume after a kill

UPLOADER = """
import json, sys
from adaptd.tiers.replica import Replica
url, local, options, stop_at = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
done = 0
def progress(n):
    global done
    done += n
    print(done, flush=True)
    if done >= stop_at:  # hold here, mid-file, until the test kills this process
        sys.stdin.readline()
Replica(url, storage_options=options).upload(local, 5, "job", progress=progress)
print("finished", flush=True)
"""


def test_upload_killed_midway_resumes_with_only_the_rest(dest, tmp_path):
    sizes = (3 * MiB, 6 * MiB)
    local = write_checkpoint(tmp_path / "local", 5, shards=sizes)
    total = sum(sizes) + 2000
    stop_at = sizes[0] + 3 * MiB  # half of the second shard sent
    env = dict(os.environ, **dest.env)
    proc = subprocess.Popen(
        [sys.executable, "-c", UPLOADER, dest.url, str(local), json.dumps(dest.options),
         str(stop_at)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    killed_at = 0
    try:
        for line in proc.stdout:  # progress lines, until it holds mid-way
            killed_at = int(line) if line.strip().isdigit() else killed_at
            if killed_at >= stop_at:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL and killed_at == stop_at

    rep = replica(dest)
    assert rep.steps() == [] and rep.latest() is None  # nothing published half-way
    assert "ckpt-5.data-00001-of-00002" not in dest.names()  # no partial under a final name
    resumed = rep.upload(local, 5, "job")
    assert resumed.resumed_files == 1  # the first shard is not sent again
    if dest.kind == "local":  # and the mounted path keeps what arrived of the second
        assert resumed.bytes_sent <= total - killed_at
    else:  # an unfinished multipart upload is discarded: the second shard is sent whole
        assert resumed.bytes_sent == sizes[1] + 2000
    assert rep.latest() == 5 and rep.verify(5).bytes == total
    assert not [n for n in dest.names() if n.startswith(".")]


def test_a_corrupt_partial_file_is_not_kept(tmp_path):
    """On a mounted path the partial file's prefix is kept only where it matches."""
    local = write_checkpoint(tmp_path / "local", 5, shards=(3 * CHUNK,))
    data = (local / "ckpt-5.data-00000-of-00001").read_bytes()
    folder = tmp_path / "dest"
    folder.mkdir()
    part = bytearray(data[: 2 * CHUNK + 100])
    part[CHUNK + 7] ^= 0xFF  # the second chunk arrived damaged
    (folder / ".ckpt-5.data-00000-of-00001.part").write_bytes(bytes(part))
    result = Replica(str(folder)).upload(local, 5, "job")
    assert result.bytes_sent == 2 * CHUNK + 2000  # the first chunk kept, the rest re-sent
    assert (folder / "ckpt-5.data-00000-of-00001").read_bytes() == data
    Replica(str(folder)).verify(5)


# ---------------------------------------------------------------------- retention


class RecordingFS(LocalFileSystem):
    """A real local filesystem under its own protocol that records deletions in order:
    a destination with rename but without the local fast path (like sftp)."""

    protocol = ("recfile",)
    root_marker = "/"
    deleted: ClassVar[list[str]] = []

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).removeprefix("recfile://"))

    def rm_file(self, path):
        RecordingFS.deleted.append(path.rsplit("/", 1)[-1])
        super().rm_file(path)


def _with_created(dest: Dest, step: int, created: float) -> None:
    """Give a step's manifest a chosen creation time (as if uploaded then)."""
    m = json.loads(dest.read(manifest_name(step)))
    m["created"] = created
    dest.write(manifest_name(step), json.dumps(m).encode())
    Manifest.from_json(dest.read(manifest_name(step)), step=step, where="test")


def test_prune_keeps_last_k_and_one_per_window(dest, tmp_path):
    hour = 3600.0
    base = 1_000 * 24 * hour  # a window boundary
    local = tmp_path / "local"
    steps = [100, 200, 300, 400, 500, 600, 700]
    created = [base, base + 2 * hour, base + 25 * hour, base + 26 * hour, base + 49 * hour,
               base + 50 * hour, base + 51 * hour]  # fmt: skip
    rep = replica(dest)
    for s, c in zip(steps, created, strict=True):
        write_checkpoint(local, s, shards=(1000,), index=100)
        rep.upload(local, s, "job")
        _with_created(dest, s, c)
    deleted = rep.prune(keep_last=2, keep_every_s=24 * hour, now=base + 52 * hour)
    # kept: 600, 700 (last two), 100 / 300 / 500 (first of each day); 200 and 400 go
    assert deleted == [200, 400]
    assert rep.steps() == [100, 300, 500, 600, 700]
    assert not [n for n in dest.names() if n.startswith(("ckpt-200.", "ckpt-400."))]
    for s in rep.steps():
        rep.verify(s)
    assert rep.prune(keep_last=2, keep_every_s=24 * hour, now=base + 52 * hour) == []
    assert rep.prune(keep_last=1, keep_every_s=None, now=base + 52 * hour) == [100, 300, 500, 600]
    assert rep.steps() == [700] and rep.latest() == 700


def test_prune_never_deletes_latest_or_newer_and_nothing_without_latest(tmp_path):
    local = tmp_path / "local"
    rep = Replica(str(tmp_path / "dest"))
    for s in (1, 2, 3):
        write_checkpoint(local, s, shards=(100,), index=10)
        rep.upload(local, s, "job")
    (tmp_path / "dest" / "LATEST").unlink()
    assert rep.prune(keep_last=1, keep_every_s=None, now=time.time()) == []
    rep.upload(local, 2, "job")  # LATEST back at 2; 3 (newer, e.g. being published) stays
    assert rep.prune(keep_last=1, keep_every_s=None, now=time.time()) == [1]
    assert rep.steps() == [2, 3]
    with pytest.raises(ValueError, match="keep_last"):
        rep.prune(keep_last=0, keep_every_s=None, now=0)
    with pytest.raises(ValueError, match="keep_every_s"):
        rep.prune(keep_last=1, keep_every_s=0, now=0)


def test_prune_deletes_the_manifest_first_and_abandoned_uploads(tmp_path):
    fsspec.register_implementation("recfile", RecordingFS, clobber=True)
    RecordingFS.deleted.clear()
    local = tmp_path / "local"
    folder = tmp_path / "dest"
    rep = Replica(f"recfile://{folder}")
    assert not rep.local and not rep.object_store  # temp name + mv, not os.replace
    for s in (1, 2, 3):
        write_checkpoint(local, s, shards=(100, 50), index=10)
        rep.upload(local, s, "job")
    # an upload of step 2.5 that died and never came back, and one that is recent
    (folder / "ckpt-0.data-00000-of-00001").write_bytes(b"old")
    old = time.time() - ABANDONED_AFTER_S - 60
    os.utime(folder / "ckpt-0.data-00000-of-00001", (old, old))
    (folder / ".ckpt-1.upload.json").write_text("{}")  # a partial journal: step 1 is pruned
    (folder / "ckpt-2.data-00000-of-00001.extra").write_bytes(b"")  # not a checkpoint name
    RecordingFS.deleted.clear()
    assert rep.prune(keep_last=1, keep_every_s=None, now=time.time()) == [1, 2]
    assert RecordingFS.deleted[:4] == [
        "ckpt-1.manifest.json",
        ".ckpt-1.upload.json",
        "ckpt-1.data-00000-of-00002",
        "ckpt-1.data-00001-of-00002",
    ]
    assert RecordingFS.deleted.index("ckpt-2.manifest.json") < RecordingFS.deleted.index(
        "ckpt-2.index"
    )
    assert "ckpt-0.data-00000-of-00001" in RecordingFS.deleted  # abandoned, an hour old
    assert sorted(p.name for p in folder.iterdir()) == [
        "LATEST",
        "ckpt-2.data-00000-of-00001.extra",
        "ckpt-3.data-00000-of-00002",
        "ckpt-3.data-00001-of-00002",
        "ckpt-3.index",
        "ckpt-3.manifest.json",
    ]
