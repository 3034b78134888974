"""The SQLite store: batched writes, WAL, migrations from v1, retention, faults."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from adaptd.core.snapshot import Decision
from adaptd.protocol.job import VERSION, SaveReport
from adaptd.state.store import (
    GLOBAL,
    MIGRATIONS,
    SCHEMA_VERSION,
    DecisionRecord,
    FailureRecord,
    SaveRecord,
    Store,
    StoreError,
    job_scope,
    storage_scope,
)

#: The tests' "now": history is written around it and retention counts from it.
T0 = 1_700_000_000.0


class Clock:
    """A wall clock the test moves by hand (retention is about days)."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def open_store(path: Path, **kw: object) -> Store:
    """A store whose clock is the tests' fixed "now" unless a test passes its own."""
    kw.setdefault("clock", Clock())
    return Store.open(path, **kw)  # type: ignore[arg-type]


def save(job: str, step: int, ended: float, **kw: object) -> SaveRecord:
    base = dict(rank=0, started=ended - 2.0, blocking_s=0.05, durable_s=2.0, bytes=1000)
    base.update(kw)
    return SaveRecord(job=job, step=step, ended=ended, **base)  # type: ignore[arg-type]


def other_connection(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, timeout=0.1)


def test_fresh_database_is_wal_and_current(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "adaptd.sqlite3"
    with open_store(db) as s:
        assert s.schema_version() == SCHEMA_VERSION
    assert (db.parent.stat().st_mode & 0o777) == 0o700
    c = other_connection(db)
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"saves", "decisions", "params", "failures", "job_settings"}


def test_writes_wait_for_flush_then_land_in_one_transaction(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    s = open_store(db)
    t = T0 - 100
    for i in range(50):
        s.record_save(save("a", 10 * i, t + i))
    s.record_decision(DecisionRecord("a", t, 0, next_step=10, every_steps=10, policy="fixed"))
    s.record_failure(FailureRecord("a", t + 60, lost_at_step=490, resumed_step=400, restart_s=31))
    s.set_param(job_scope("a"), "save_cost_s", 0.05)
    s.set_param(job_scope("a"), "save_cost_s", 0.07)  # newest wins, one row
    assert s.pending == 53
    reader = other_connection(db)
    assert reader.execute("SELECT count(*) FROM saves").fetchone()[0] == 0  # queued, not written
    assert s.flush() == 53
    assert s.pending == 0
    assert reader.execute("SELECT count(*) FROM saves").fetchone()[0] == 50
    assert s.flush() == 0
    assert s.param(job_scope("a"), "save_cost_s") == 0.07
    assert s.counts() == {
        "saves": 50, "decisions": 1, "failures": 1, "params": 1, "job_settings": 0,
    }  # fmt: skip
    s.close()


def test_history_queries_for_report(tmp_path: Path) -> None:
    s = open_store(tmp_path / "s.db")
    t = T0 - 100
    s.record_save(save("a", 100, t + 1, ok=False, error="ENOSPC", blocking_s=0.01))
    s.record_save(save("a", 200, t + 2, path="/ck/ckpt-200", extra_step_s=0.3, reason="plan"))
    s.record_save(save("a", 200, t + 2.5, rank=1))
    s.record_save(save("b", 50, t + 3))
    report = SaveReport(v=VERSION, job="a", rank=0, step=300, blocking_s=0.02, durable_s=4.0,
                        bytes=4096, path="/ck/ckpt-300")  # fmt: skip
    s.record_save(SaveRecord.from_report(report, received=t + 10))
    d = Decision(next_step=400, every_steps=100, reason="young/daly", policy="adaptive",
                 interval_s=120.0, waste=0.031)  # fmt: skip
    s.record_decision(DecisionRecord.from_decision("a", d, time=t + 11, step=300, step_time_s=1.2))
    s.record_decision(DecisionRecord("a", t + 12, 310, None, urgent=True, reason="drain"))

    saves = s.saves("a")  # read sees the queue: reads flush first
    assert [(r.step, r.rank, r.ok) for r in saves] == [
        (100, 0, False), (200, 0, True), (200, 1, True), (300, 0, True),
    ]  # fmt: skip
    assert saves[0].error == "ENOSPC"
    assert saves[1] == save("a", 200, t + 2, path="/ck/ckpt-200", extra_step_s=0.3, reason="plan")
    assert saves[3].started == t + 6 and saves[3].ended == t + 10 and saves[3].bytes == 4096
    assert [r.step for r in s.saves("a", limit=2)] == [200, 300]  # the newest two, in order
    assert [r.step for r in s.saves("a", since=t + 2, until=t + 3)] == [200, 200]
    assert s.last_save("a").step == 300
    assert s.last_save("a", ok_only=False).step == 300
    assert s.last_save("nobody") is None

    decisions = s.decisions("a")
    assert decisions[0].reason == "young/daly" and decisions[0].waste == 0.031
    assert decisions[0].step_time_s == 1.2 and decisions[0].every_steps == 100
    assert decisions[1].urgent is True and decisions[1].next_step is None
    summaries = {j.job: j for j in s.jobs()}
    assert summaries["a"].saves == 3 and summaries["a"].failed_saves == 1
    assert summaries["a"].last_save == t + 10 and summaries["a"].decisions == 2
    assert [j.job for j in s.jobs()] == ["a", "b"]  # most recently saved first
    s.close()


def test_params_by_scope_and_json_values(tmp_path: Path) -> None:
    s = open_store(tmp_path / "s.db")
    s.set_param(GLOBAL, "gpu_mtbf_s", 1.8e8)
    s.set_param(storage_scope("/scratch"), "bandwidth", {"write_bps": 2.5e9, "samples": 12})
    s.set_param(job_scope("a"), "restore_s", [30.0, 41.5])
    with pytest.raises(ValueError):
        s.set_param(GLOBAL, "bad", float("nan"))
    s.close()
    s = open_store(tmp_path / "s.db")  # survives a restart
    assert s.params(storage_scope("/scratch")) == {"bandwidth": {"write_bps": 2.5e9, "samples": 12}}
    assert s.param(GLOBAL, "gpu_mtbf_s") == 1.8e8
    assert s.param(job_scope("a"), "restore_s") == [30.0, 41.5]
    assert s.param(GLOBAL, "missing", default=7) == 7
    s.close()


def test_job_settings_are_written_through_and_survive_restart(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    s = open_store(db)
    s.set_job_setting("a", policy="fixed:steps=50")
    s.set_job_setting("a", paused=True)  # keeps the policy
    s.set_job_setting("b", paused=True)
    # visible to another connection at once, without any flush
    row = other_connection(db).execute("SELECT policy, paused FROM job_settings WHERE job='a'")
    assert row.fetchone() == ("fixed:steps=50", 1)
    s._conn.close()  # a crash: no close(), no flush...
    os.close(s._lock_fd)  # ...and the dead process's lock goes with it
    s = open_store(db)
    a = s.job_setting("a")
    assert a is not None and (a.policy, a.paused) == ("fixed:steps=50", True)
    s.set_job_setting("a", policy=None, paused=False)
    assert set(s.job_settings()) == {"a", "b"}
    assert s.job_setting("a").policy is None and s.job_setting("a").paused is False
    assert s.clear_job_setting("b") and not s.clear_job_setting("b")
    s.close()


def build_v1(path: Path) -> None:
    """A version-1 database as the first adaptd wrote it, with some history."""
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    for sql in MIGRATIONS[0][1]:
        c.execute(sql)
    c.execute("PRAGMA user_version=1")
    c.execute(
        "INSERT INTO saves (job, rank, step, started, ended, blocking_s, durable_s, bytes, path,"
        " ok, error) VALUES ('old', 0, 500, 100.0, 103.5, 0.2, 3.5, 123456, '/ck/500', 1, '')"
    )
    c.execute(
        "INSERT INTO decisions (job, time, step, next_step, every_steps, urgent, policy, reason,"
        " interval_s, waste) VALUES ('old', 90.0, 450, 500, 50, 0, 'phased', 'warm-up', 60, NULL)"
    )
    c.execute("INSERT INTO params VALUES ('job:old', 'save_cost_s', '0.2', 103.5)")
    c.execute("INSERT INTO failures (job, time, lost_at_step, resumed_step, restart_s)"
              " VALUES ('old', 200.0, 530, 500, 45.0)")  # fmt: skip
    c.close()


def test_migrates_a_hand_built_v1_database(tmp_path: Path) -> None:
    db = tmp_path / "v1.db"
    build_v1(db)
    # a reader cannot use it before the daemon upgraded it
    with pytest.raises(StoreError, match="schema version 1 is older than 3; start the daemon"):
        open_store(db, readonly=True)
    with open_store(db, clock=Clock(300.0), retention_days=1e6) as s:
        assert s.schema_version() == SCHEMA_VERSION == 3
        (old,) = s.saves("old")
        assert (old.step, old.bytes, old.path, old.durable_s) == (500, 123456, "/ck/500", 3.5)
        assert (old.extra_step_s, old.reason) == (0.0, "")  # new columns get their defaults
        assert old.tier == ""  # version 3: a save before two tiers was durable
        (dec,) = s.decisions("old")
        assert dec.reason == "warm-up" and dec.step_time_s is None
        assert dec.durable_every is None  # version 3: one tier
        assert s.failures("old") == [FailureRecord("old", 200.0, 530, 500, 45.0)]
        assert s.param(job_scope("old"), "save_cost_s") == 0.2
        s.set_job_setting("old", paused=True)  # the v2 table exists
        s.record_save(save("old", 600, 310.0, extra_step_s=0.4, reason="interval"))
        assert s.saves("old")[-1].extra_step_s == 0.4
    indexes = {
        r[0]
        for r in other_connection(db).execute("SELECT name FROM sqlite_master WHERE type='index'")
    }
    assert {"saves_job_ended", "decisions_job_time", "failures_job_time"} <= indexes


def test_migrates_a_version_2_database_to_keep_the_durable_cadence(tmp_path: Path) -> None:
    """Version 3 (two tiers): a database the previous adaptd wrote gains the plan's k
    with each decision and each save's tier; its rows keep theirs (none: one tier)."""
    db = tmp_path / "v2.db"
    build_v1(db)
    c = sqlite3.connect(db, isolation_level=None)
    for sql in MIGRATIONS[1][1]:
        c.execute(sql)
    c.execute("PRAGMA user_version=2")
    c.close()
    with pytest.raises(StoreError, match="schema version 2 is older than 3; start the daemon"):
        open_store(db, readonly=True)
    with open_store(db, clock=Clock(300.0), retention_days=1e6) as s:
        assert s.schema_version() == 3
        (dec,) = s.decisions("old")
        assert (dec.reason, dec.durable_every) == ("warm-up", None)
        d = Decision(next_step=620, every_steps=10, durable_every=4, reason="two tiers")
        s.record_decision(DecisionRecord.from_decision("old", d, time=305.0, step=600))
        s.record_save(save("old", 610, 306.0, tier="local"))
        assert [x.durable_every for x in s.decisions("old")] == [None, 4]
        assert [x.tier for x in s.saves("old")] == ["", "local"]


def test_a_failed_migration_leaves_the_old_version(tmp_path: Path) -> None:
    db = tmp_path / "v1.db"
    build_v1(db)
    c = other_connection(db)
    c.execute("CREATE TABLE job_settings (x)")  # makes migration 2 fail half-way
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        open_store(db)
    assert c.execute("PRAGMA user_version").fetchone()[0] == 1
    cols = [r[1] for r in c.execute("PRAGMA table_info(saves)")]
    assert "extra_step_s" not in cols  # the ALTERs before the failure were rolled back


def test_refuses_newer_foreign_and_corrupt_files(tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    sqlite3.connect(newer).execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=r"schema version 4 is newer than this adaptd supports"):
        open_store(newer)
    foreign = tmp_path / "foreign.db"
    fc = sqlite3.connect(foreign)
    fc.execute("CREATE TABLE customers (id)")
    fc.commit()
    fc.close()
    with pytest.raises(StoreError, match=r"tables adaptd did not create \(customers\)"):
        open_store(foreign)
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"corrupt\.db: not a usable SQLite database"):
        open_store(corrupt)
    with pytest.raises(StoreError, match="no adaptd state database here"):
        open_store(tmp_path / "missing.db", readonly=True)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="cannot open the state database"):
        open_store(blocker / "sub" / "x.db")


def test_retention_by_age_and_by_rows(tmp_path: Path) -> None:
    clock = Clock()
    day = 86400.0
    db = tmp_path / "s.db"
    s = open_store(db, clock=clock, retention_days=7, retention_rows=100)
    now = clock.t
    for i in range(30):  # one save a day for 30 days
        s.record_save(save("a", i, now - (29 - i) * day))
        s.record_decision(DecisionRecord("a", now - (29 - i) * day, i, i + 1))
    s.record_failure(FailureRecord("a", now - 20 * day, 5))
    s.set_param(job_scope("gone"), "x", 1)
    s.set_param(storage_scope("/s"), "y", 2)
    s.flush()  # the first flush prunes at once: strictly older than 7 days goes
    assert [r.step for r in s.saves("a")] == list(range(22, 30))  # 7 days ago .. now
    assert s.counts()["decisions"] == 8 and s.failures() == []
    # the job "gone" last learned something 8 days ago; storage parameters never expire
    other_connection(db).execute(
        "UPDATE params SET updated=? WHERE scope LIKE 'job:%' OR scope LIKE 'storage:%'",
        (now - 8 * day,),
    )
    clock.t += 1  # the row from exactly 7 days ago is now past the cutoff
    assert s.prune() == {"saves": 1, "decisions": 1, "failures": 0, "params": 1}
    assert [r.step for r in s.saves("a")] == list(range(23, 30))
    assert s.params(job_scope("gone")) == {}
    assert s.params(storage_scope("/s")) == {"y": 2}

    s.retention_rows = 3
    for i in range(30, 40):
        s.record_save(save("b", i, clock.t))
    s.flush()  # 10 rows since the last prune, over a tenth of retention_rows: it prunes
    assert s.counts()["saves"] == 3  # of 7 + 10 rows, the newest 3 kept
    assert [r.step for r in s.saves("b")] == [37, 38, 39]
    assert s.saves("a") == []
    s.close()


def test_flush_prunes_on_its_own_schedule(tmp_path: Path) -> None:
    """Every ``prune_every_s``, and as soon as a tenth of ``retention_rows`` rows came
    in since the last prune (so the cap holds whatever the inflow)."""
    clock = Clock()
    s = open_store(tmp_path / "s.db", clock=clock, retention_rows=50, prune_every_s=600)
    for i in range(58):
        s.record_save(save("a", i, clock.t))
    s.flush()  # the first flush also prunes
    assert s.counts()["saves"] == 50
    for i in range(58, 62):
        s.record_save(save("a", i, clock.t))
    s.flush()  # 4 rows: not due yet
    assert s.counts()["saves"] == 54
    s.record_save(save("a", 62, clock.t))
    s.flush()  # 5 rows since the last prune, a tenth of 50: due
    assert s.counts()["saves"] == 50
    for i in range(63, 65):
        s.record_save(save("a", i, clock.t))
    s.flush()
    assert s.counts()["saves"] == 52
    clock.t += 600
    s.flush()  # due by time: nothing queued, still pruned
    assert s.counts()["saves"] == 50
    s.close()


def test_a_locked_database_keeps_the_batch_for_the_next_tick(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    s = open_store(db, busy_timeout_s=0.05)
    s.flush()
    s.record_save(save("a", 1, T0 + 1))
    s.record_save(save("a", 2, T0 + 2))
    blocker = other_connection(db)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    t0 = time.perf_counter()
    assert s.flush() == 0
    assert time.perf_counter() - t0 < 1.0  # bounded by the busy timeout, not a hang
    assert s.write_errors == 1 and "locked" in (s.last_error or "")
    assert s.pending == 2
    blocker.execute("ROLLBACK")
    assert s.flush() == 2
    assert [r.step for r in s.saves("a")] == [1, 2]
    s.close()


def test_queue_is_bounded_and_counts_drops(tmp_path: Path) -> None:
    s = open_store(tmp_path / "s.db", max_pending=5)
    for i in range(8):
        s.record_save(save("a", i, T0 + i))
    s.set_param(GLOBAL, "k", 1)  # a new key while full is dropped too
    assert s.pending == 5 and s.dropped == 4
    s.flush()
    assert [r.step for r in s.saves("a")] == [0, 1, 2, 3, 4]
    s.close()


def test_reader_process_sees_history_while_daemon_writes(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    w = open_store(db)
    w.record_save(save("a", 1, T0 + 1))
    w.flush()
    r = open_store(db, readonly=True)
    assert [x.step for x in r.saves("a")] == [1]
    w.record_save(save("a", 2, T0 + 2))
    w.flush()
    assert [x.step for x in r.saves("a")] == [1, 2]
    with pytest.raises(StoreError, match="read-only"):
        r.record_save(save("a", 3, T0 + 3))
    r.close()
    w.close()
    w.close()  # twice is fine


def test_flush_of_a_tick_is_fast(tmp_path: Path) -> None:
    """A tick's batch (many jobs' reports) is one short transaction, not a stall."""
    s = open_store(tmp_path / "s.db")
    s.flush()
    took = []
    for tick in range(20):
        for j in range(50):
            s.record_save(save(f"job{j}", tick, T0 + tick))
            s.record_decision(DecisionRecord(f"job{j}", T0 + tick, tick, tick + 1))
        s.flush()
        took.append(s.last_flush_s)
    assert s.counts()["saves"] == 1000
    # the 90th percentile, not the worst: one fsync on a loaded shared disk may stall;
    # and none as long as the daemon's 1 s tick
    p90 = sorted(took)[int(0.9 * len(took)) - 1]
    assert p90 < 0.25 and max(took) < 1.0, f"100-row flushes took {sorted(took)[-3:]} s"
    s.close()


def test_one_writer_per_database_and_the_refused_one_is_told_who(tmp_path: Path) -> None:
    """Two daemons on one state directory overwrote each other's learned figures."""
    db = tmp_path / "s.db"
    first = Store.open(db, owner="socket /run/a/adaptd.sock")
    with pytest.raises(StoreError) as info:
        Store.open(db, owner="socket /run/b/adaptd.sock")
    msg = str(info.value)
    assert f"in use by another adaptd daemon (pid {os.getpid()}, socket /run/a/adaptd.sock)" in (
        msg
    )
    assert "move it aside" not in msg and "daemon.state_dir" in msg
    with Store.open(db, readonly=True) as reader:  # a reader (adaptd report) still may
        assert reader.schema_version() > 0
    first.close()
    Store.open(db, owner="socket /run/b/adaptd.sock").close()  # free once the first closed


def test_an_in_memory_database_leaves_no_lock_file(tmp_path: Path, monkeypatch) -> None:
    """``:memory:`` took ``:memory:.lock`` in the working directory (one landed in git)."""
    monkeypatch.chdir(tmp_path)
    first = Store.open(":memory:")
    second = Store.open(":memory:")  # private to each connection: no writer lock between them
    first.close()
    second.close()
    assert list(tmp_path.iterdir()) == []
