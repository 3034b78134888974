"""What the store is asked about later: the save history, decisions, failures, learned
parameters.

Reads (for ``status``, ``history``, ``report`` and the daemon's start-up) first flush
the queue (:class:`~adaptd.state.queued_writes.QueuedWrites`) so they see everything
recorded so far. Another process may open the same file read-only while the daemon
runs; WAL lets it read without blocking the daemon.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from adaptd.state import schema
from adaptd.state.database import Database, build
from adaptd.state.records import DecisionRecord, FailureRecord, JobSummary, SaveRecord
from adaptd.state.schema import FAILURE_COLS, HISTORY, SAVE_COLS

__all__ = ["HistoryReads"]


class HistoryReads(Database):
    """The store's part that answers questions about what was recorded."""

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            self.flush()
            return self._conn.execute(sql, args).fetchall()

    def saves(
        self,
        job: str,
        *,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
    ) -> list[SaveRecord]:
        """A job's saves in time order (all ranks); ``limit`` keeps the newest."""
        rows = self._history("saves", job, since, until, limit)
        return [build(SaveRecord, r, bools=("ok",)) for r in rows]

    def decisions(
        self,
        job: str,
        *,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
    ) -> list[DecisionRecord]:
        """A job's decisions in time order; ``limit`` keeps the newest."""
        rows = self._history("decisions", job, since, until, limit)
        return [build(DecisionRecord, r, bools=("urgent",)) for r in rows]

    def failures(self, job: str | None = None) -> list[FailureRecord]:
        """Failures seen, oldest first (of one job, or all)."""
        where, args = ("WHERE job=?", (job,)) if job is not None else ("", ())
        rows = self._read(
            f"SELECT {', '.join(FAILURE_COLS)} FROM failures {where} ORDER BY time, id", args
        )
        return [build(FailureRecord, r) for r in rows]

    def last_save(self, job: str, *, ok_only: bool = True) -> SaveRecord | None:
        """The newest save of ``job`` (successful only, by default)."""
        cond = " AND ok=1" if ok_only else ""
        rows = self._read(
            f"SELECT {', '.join(SAVE_COLS)} FROM saves WHERE job=?{cond} "
            "ORDER BY ended DESC, id DESC LIMIT 1",
            (job,),
        )
        return build(SaveRecord, rows[0], bools=("ok",)) if rows else None

    def _history(self, table: str, job: str, *window: float | None) -> list[tuple[Any, ...]]:
        """A job's rows of a history table in time order, within ``(since, until,
        limit)`` (:func:`adaptd.state.schema.history_query`)."""
        return list(reversed(self._read(*schema.history_query(table, job, *window))))

    def jobs(self) -> list[JobSummary]:
        """Every job in the history, with counts, most recently saved first."""
        rows = self._read(
            """
            WITH names AS (
                SELECT job FROM saves UNION SELECT job FROM decisions
                UNION SELECT job FROM failures
            )
            SELECT n.job,
                (SELECT count(*) FROM saves s WHERE s.job = n.job AND s.ok = 1),
                (SELECT count(*) FROM saves s WHERE s.job = n.job AND s.ok = 0),
                (SELECT max(ended) FROM saves s WHERE s.job = n.job AND s.ok = 1) AS last,
                (SELECT count(*) FROM decisions d WHERE d.job = n.job),
                (SELECT count(*) FROM failures f WHERE f.job = n.job)
            FROM names n
            ORDER BY last IS NULL, last DESC, n.job
            """
        )
        return [JobSummary(*r) for r in rows]

    def param(self, scope: str, key: str, default: Any = None) -> Any:
        """One learned parameter (decoded from JSON), or ``default``."""
        rows = self._read("SELECT value FROM params WHERE scope=? AND key=?", (scope, key))
        return json.loads(rows[0][0]) if rows else default

    def params(self, scope: str) -> dict[str, Any]:
        """All learned parameters of ``scope``."""
        rows = self._read("SELECT key, value FROM params WHERE scope=? ORDER BY key", (scope,))
        return {k: json.loads(v) for k, v in rows}

    def counts(self) -> dict[str, int]:
        """Rows per table (for ``status`` and tests)."""
        names = [t for t, _ in HISTORY] + ["params", "job_settings"]
        return {t: self._read(f"SELECT count(*) FROM {t}")[0][0] for t in names}
