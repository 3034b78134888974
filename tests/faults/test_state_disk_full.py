"""The daemon's state database on a full disk: the flush says why and loses nothing
(issue 26).

A real SQLite database on a small tmpfs filled to ENOSPC. SQLite rolls the failed
transaction back by itself; the store's own ROLLBACK then raised "cannot rollback - no
transaction is active", which was logged and kept as the error instead of "database
or disk is full", and an ``OSError`` from the write was not caught at all. Once space
is back, the rows queued meanwhile are all written.
"""

from __future__ import annotations

import logging

from adaptd.state.records import SaveRecord
from adaptd.state.store import Store

ROWS = 3000


def save(step: int) -> SaveRecord:
    return SaveRecord(job="full", rank=0, step=step, started=1e9 + step, ended=1e9 + step + 1,
                      blocking_s=0.1, durable_s=0.2, bytes=1 << 20, path="p" * 200)  # fmt: skip


def test_a_full_disk_fails_the_flush_with_its_own_error_and_the_rows_wait(small_fs, caplog):
    store = Store.open(small_fs.path / "adaptd.sqlite3", clock=lambda: 1e9 + ROWS)
    try:
        store.record_save(save(0))
        assert store.flush() == 1
        filler = small_fs.fill()
        for step in range(1, ROWS):
            store.record_save(save(step))
        with caplog.at_level(logging.WARNING, logger="adaptd.store"):
            assert store.flush() == 0  # never raises
        assert store.write_errors >= 1
        assert "full" in store.last_error, store.last_error  # SQLite's own words
        assert "cannot rollback" not in caplog.text
        assert store.pending == ROWS - 1  # kept for the next flush
        filler.unlink()
        assert store.flush() == ROWS - 1
        assert len(store.saves("full")) == ROWS  # nothing lost
    finally:
        store.close()
