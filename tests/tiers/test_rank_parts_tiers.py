"""A multi-worker job's steps at a durable destination: every rank's part goes with its
step, only a step complete for the job is uploaded (the replicator waits for a part
still being written), a manifest that lists less is never restored, and retention
deletes the parts with their step (adaptd/checkpoints/rank_parts.py, adaptd/tiers/)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from adaptd.checkpoints import rank_parts
from adaptd.config.loader import Destination
from adaptd.tiers import destination as dq
from adaptd.tiers.layout import IncompleteStep, manifest_name
from adaptd.tiers.replica import Replica, TierError
from adaptd.tiers.restore import restore

from .conftest import Dest, write_checkpoint

WORLD = 2


def write_step(directory: Path, step: int, ranks: tuple[int, ...] = (0, 1)) -> Path:
    """A step of a job of WORLD ranks: its replicated part and the parts of ``ranks``."""
    write_checkpoint(directory, step, shards=(3_000,), index=200)
    for r in ranks:
        prefix = directory / rank_parts.part_name(step, r, WORLD)
        Path(f"{prefix}.data-00000-of-00001").write_bytes(bytes([r + 1]) * (500 + r))
        Path(f"{prefix}.index").write_bytes(b"part-index-%d" % r)
    return directory


def test_a_step_travels_with_every_ranks_part_and_comes_back_whole(dest: Dest, tmp_path) -> None:
    local = write_step(tmp_path / "local", 10)
    write_step(local, 20)
    rep = Replica(dest.url, storage_options=dest.options)
    rep.upload(local, 10, "job")
    rep.upload(local, 20, "job")
    names = {f.name for f in rep.manifest(20).files}
    assert names == set(rank_parts.files_of(rank_parts.listing(local), 20))
    assert {f"{rank_parts.part_name(20, r, WORLD)}.index" for r in range(WORLD)} <= names

    target = tmp_path / "new-host"
    got = restore(dest.url, target, storage_options=dest.options)
    assert got.step == 20
    assert rank_parts.status(rank_parts.listing(target), 20).complete
    for name in names:
        assert (target / name).read_bytes() == (local / name).read_bytes()

    assert rep.prune(keep_last=1, keep_every_s=None, now=time.time()) == [10]
    assert not [n for n in dest.names() if rank_parts.step_of(n) == 10]


def test_a_step_missing_a_part_is_not_uploaded(tmp_path) -> None:
    local = write_step(tmp_path / "local", 10, ranks=(0,))
    rep = Replica(str(tmp_path / "dest"))
    with pytest.raises(IncompleteStep, match=r"rank\(s\) 1 of 2 have no complete part"):
        rep.upload(local, 10, "job")
    assert rep.steps() == [] and rep.latest() is None


def test_a_manifest_that_lists_less_than_every_part_is_skipped_with_the_reason(
    tmp_path, capsys
) -> None:
    local = write_step(tmp_path / "local", 10)
    write_step(local, 20)
    url = str(tmp_path / "dest")
    rep = Replica(url)
    rep.upload(local, 10, "job")
    rep.upload(local, 20, "job")
    doc = json.loads((tmp_path / "dest" / manifest_name(20)).read_text())
    dropped = [f for f in doc["files"] if "rank-00001" in f["name"]]
    doc["files"] = [f for f in doc["files"] if f not in dropped]
    doc["bytes"] -= sum(f["size"] for f in dropped)
    (tmp_path / "dest" / manifest_name(20)).write_text(json.dumps(doc))

    with pytest.raises(TierError, match=r"rank\(s\) 1 of 2 have no complete part"):
        rep.manifest(20)
    got = restore(url, tmp_path / "new-host")
    assert got.step == 10 and "rank(s) 1 of 2 have no complete part" in got.skipped[0][1]

    from adaptd.cli import main

    assert main(["restore", "--from", url, "--to", str(tmp_path / "cli")]) == 0
    err = capsys.readouterr().err
    assert "skipped step 20:" in err and "rank(s) 1 of 2 have no complete part" in err


def queue(tmp_path: Path) -> dq.DestinationQueue:
    d = Destination("nfs", str(tmp_path / "dest"), None, 1, 5, None, {})
    q = dq.DestinationQueue(d, should_yield=lambda staging: False)
    q.start()
    return q


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g}s"
        time.sleep(0.05)


def test_the_replicator_waits_for_a_part_still_being_written(tmp_path) -> None:
    staging = write_step(tmp_path / "staging", 10, ranks=(0,))  # rank 1 still writing
    q = queue(tmp_path)
    try:
        q.add("job", staging, 10, saved=time.time(), nbytes=1)
        wait_for(lambda: q.status()[0].next_retry_s is not None, "wait for rank 1's part")
        (row,) = q.status()
        assert row.failures == 0 and row.last_step is None and row.pending_step == 10
        write_step(staging, 10, ranks=(1,))  # its write ended
        wait_for(lambda: q.status()[0].last_step == 10, "upload")
    finally:
        q.stop()
        q.join(time.monotonic() + 10)
    assert Replica(str(tmp_path / "dest" / "job")).steps() == [10]


def test_the_replicator_skips_a_step_whose_part_never_comes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(dq, "WAIT_FOR_PARTS", 1)
    staging = write_step(tmp_path / "staging", 10, ranks=(1,))
    q = queue(tmp_path)
    try:
        q.add("job", staging, 10, saved=time.time(), nbytes=1)
        wait_for(lambda: q.status()[0].skipped == 1, "skip")
        (row,) = q.status()
        assert row.failures == 0 and row.pending_step is None and row.last_step is None
    finally:
        q.stop()
        q.join(time.monotonic() + 10)
    assert not (tmp_path / "dest" / "job").exists()
