"""The store's writes that never stall the daemon's loop: queued, then flushed at once.

``record_*`` and :meth:`QueuedWrites.set_param` only append to an in-memory queue, and
:meth:`QueuedWrites.flush`, called once per loop tick, writes the whole queue in one
transaction. With ``synchronous=NORMAL`` in WAL mode a commit is a write to the WAL
without an fsync, so a tick's flush costs well under a millisecond for typical batches.
A flush that fails (disk full, database locked) is logged and counted, the batch is
kept for the next tick, and nothing is raised into the loop; a queue that is not
flushed stops taking rows at ``max_pending`` (they are counted as dropped).

Retention is bounded by age and by row count per history table (:meth:`prune`, run
from :meth:`flush` every ``prune_every_s`` and whenever a tenth of ``retention_rows``
history rows were written since the last prune, so a table holds at most
``retention_rows`` plus that tenth plus one flush, whatever the inflow).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from typing import Any, TypeVar

from adaptd import events
from adaptd.state import schema
from adaptd.state.database import Database, insert, rollback, row
from adaptd.state.records import DecisionRecord, FailureRecord, SaveRecord, record_of
from adaptd.state.schema import DECISION_COLS, FAILURE_COLS, SAVE_COLS, StoreError

__all__ = ["QueuedWrites"]

log = logging.getLogger("adaptd.state.store")

_R = TypeVar("_R")


class QueuedWrites(Database):
    """The store's part that queues history and learned parameters and flushes them."""

    def _init_queue(
        self,
        *,
        retention_days: float,
        retention_rows: int,
        prune_every_s: float,
        max_pending: int,
    ) -> None:
        self.retention_days = retention_days
        self.retention_rows = retention_rows
        self.prune_every_s = prune_every_s
        self.max_pending = max_pending
        self._saves: list[SaveRecord] = []
        self._decisions: list[DecisionRecord] = []
        self._failures: list[FailureRecord] = []
        self._params: dict[tuple[str, str], tuple[str, float]] = {}
        self._last_prune: float | None = None
        #: History rows written since the last prune: a prune is also due once these
        #: reach a tenth of ``retention_rows``, so the cap holds at any inflow rate.
        self._since_prune = 0
        #: Rows dropped because the queue was full (flush not called, or failing).
        self.dropped = 0
        #: Flushes that failed; the batch was kept for the next one.
        self.write_errors = 0
        self.last_error: str | None = None
        #: Seconds the last successful flush took (for the daemon's metrics).
        self.last_flush_s = 0.0

    @property
    def pending(self) -> int:
        """Rows waiting for the next :meth:`flush`."""
        return len(self._saves) + len(self._decisions) + len(self._failures) + len(self._params)

    def _queue(self, into: list[_R], item: _R) -> None:
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only; cannot record")
        with self._lock:
            if self.pending >= self.max_pending:
                self.dropped += 1
                if self.dropped == 1:
                    log.warning("%s: %d rows queued and not flushed; dropping new history rows",
                                self.path, self.max_pending)  # fmt: skip
                return
            into.append(item)

    def record_save(self, rec: SaveRecord) -> None:
        """Queue one save for the next flush."""
        self._queue(self._saves, rec)

    def record_decision(self, rec: DecisionRecord) -> None:
        """Queue one decision for the next flush."""
        self._queue(self._decisions, rec)

    def record_failure(self, rec: FailureRecord) -> None:
        """Queue one observed failure for the next flush."""
        self._queue(self._failures, rec)

    def set_param(self, scope: str, key: str, value: Any) -> None:
        """Queue a learned parameter (any JSON value); the newest value per key wins.

        Raises :class:`TypeError` when ``value`` is not JSON-serialisable.
        """
        text = json.dumps(value, allow_nan=False)
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only; cannot record")
        with self._lock:
            if (scope, key) not in self._params and self.pending >= self.max_pending:
                self.dropped += 1
                return
            self._params[(scope, key)] = (text, self._clock())

    def on_event(self, ev: events.Event) -> None:
        """An :data:`adaptd.events.Sink`: queue the record the daemon's event makes
        (:func:`adaptd.state.records.record_of`). Only queues: cheap in the loop."""
        rec = record_of(ev)
        if isinstance(rec, SaveRecord):
            self.record_save(rec)
        elif isinstance(rec, DecisionRecord):
            self.record_decision(rec)
        elif isinstance(rec, FailureRecord):
            self.record_failure(rec)

    def flush(self) -> int:
        """Write everything queued in one transaction; returns the rows written.

        Never raises for a database or disk fault (a full disk): it is logged with its
        own error, counted in :attr:`write_errors`; the batch stays queued (0 returned).
        """
        with self._lock:
            if self.readonly or self._conn is None:
                return 0
            n = self.pending
            now = self._clock()
            prune_due = (
                self._last_prune is None
                or now - self._last_prune >= self.prune_every_s
                or self._since_prune >= max(1, self.retention_rows // 10)
            )
            if n == 0 and not prune_due:
                return 0
            t0 = time.perf_counter()
            try:
                self._transaction(lambda: self._write_batch(now if prune_due else None))
            except (sqlite3.Error, OSError) as exc:
                self.write_errors += 1
                self.last_error = str(exc)
                log.warning("%s: could not write %d rows (%s); will retry", self.path, n, exc)
                return 0
            self._since_prune += len(self._saves) + len(self._decisions) + len(self._failures)
            self._saves.clear()
            self._decisions.clear()
            self._failures.clear()
            self._params.clear()
            if prune_due:
                self._pruned(now)
            self.last_flush_s = time.perf_counter() - t0
            return n

    def _write_batch(self, prune_at: float | None) -> None:
        c = self._conn
        if self._saves:
            c.executemany(insert("saves", SAVE_COLS), [row(r) for r in self._saves])
        if self._decisions:
            c.executemany(insert("decisions", DECISION_COLS), [row(r) for r in self._decisions])
        if self._failures:
            c.executemany(insert("failures", FAILURE_COLS), [row(r) for r in self._failures])
        if self._params:
            c.executemany(
                "INSERT INTO params (scope, key, value, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (scope, key) DO UPDATE SET value=excluded.value, "
                "updated=excluded.updated",
                [(s, k, v, t) for (s, k), (v, t) in self._params.items()],
            )
        if prune_at is not None:
            self._prune(prune_at)

    def _transaction(self, work: Any) -> Any:
        """``work()`` in one immediate transaction, rolled back if it raises."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            out = work()
            self._conn.execute("COMMIT")
        except BaseException:
            rollback(self._conn)
            raise
        return out

    # ---------------------------------------------------------------- retention

    def prune(self, now: float | None = None) -> dict[str, int]:
        """Delete history older than ``retention_days`` and beyond ``retention_rows``
        per table, and job parameters not updated within the retention period.
        Returns rows deleted per table. Raises :class:`sqlite3.Error` on a fault."""
        with self._lock:
            self.flush()
            now = self._clock() if now is None else now
            out = self._transaction(lambda: self._prune(now))
            self._pruned(now)
            return out

    def _prune(self, now: float) -> dict[str, int]:
        cutoff = now - self.retention_days * 86400.0
        return schema.delete_old(self._conn, cutoff=cutoff, rows=self.retention_rows)

    def _pruned(self, now: float) -> None:
        self._last_prune = now
        self._since_prune = 0
