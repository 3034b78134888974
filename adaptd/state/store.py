"""The daemon's memory: an embedded SQLite database in WAL mode.

What lives here is what a restart must not lose and what operators ask about
later: the save history, the decisions and why they were taken, learned
parameters (per job, per storage target, global), the failures seen, and job
settings an operator set at run time (a policy override, a pause).

:class:`Store` is one open database (:class:`~adaptd.state.database.Database`) with
three parts, one job each:

- :class:`~adaptd.state.queued_writes.QueuedWrites`: writes never stall the daemon's
  loop: history and learned parameters are queued and written in one transaction per
  tick (:meth:`Store.flush`); a failing flush keeps the batch for the next one;
  retention is applied there too;
- :class:`~adaptd.state.history_reads.HistoryReads`: reads (for ``status``,
  ``history``, ``report`` and the daemon's start-up) flush the queue first, so they see
  everything recorded so far;
- :class:`~adaptd.state.settings_table.SettingsTable`: operator settings are rare and
  must survive a crash right after the command returned, so they are written through
  at once.

Another process may open the same file read-only (``readonly=True``) while the daemon
runs; WAL lets it read without blocking the daemon. A second writer may not: opening
for writing takes ``adaptd.sqlite3.lock`` (:mod:`adaptd.state.lockfile`), so a second
daemon on the same state directory refuses to start and names the one holding it,
instead of each overwriting what the other learned.

The records it keeps are those of :mod:`adaptd.state.records` (made from the daemon's
events by :func:`adaptd.state.records.record_of`); the tables, their versioned migrations
and the SQL of retention are in :mod:`adaptd.state.schema`.

Retention is bounded by age and by row count per history table, and by the number
of jobs whose learned parameters are kept (:meth:`Store.prune`, see
:mod:`adaptd.state.queued_writes`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from adaptd.state import lockfile, schema
from adaptd.state.database import connect, default_path
from adaptd.state.history_reads import HistoryReads
from adaptd.state.queued_writes import QueuedWrites
from adaptd.state.records import (
    DecisionRecord,
    FailureRecord,
    JobSettings,
    JobSummary,
    SaveRecord,
)
from adaptd.state.schema import MIGRATIONS, SCHEMA_VERSION, StoreError
from adaptd.state.settings_table import KEEP, SettingsTable

__all__ = [
    "GLOBAL",
    "KEEP",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "DecisionRecord",
    "FailureRecord",
    "JobSettings",
    "JobSummary",
    "SaveRecord",
    "Store",
    "StoreError",
    "default_path",
    "job_scope",
    "storage_scope",
]

#: Scope of learned parameters that are not tied to a job or a storage target.
GLOBAL = "global"


def job_scope(job: str) -> str:
    """The learned-parameter scope of one job."""
    return f"job:{job}"


def storage_scope(target: str) -> str:
    """The learned-parameter scope of one storage target."""
    return f"storage:{target}"


class Store(QueuedWrites, HistoryReads, SettingsTable):
    """The state database. Create with :meth:`open`; use from one thread at a time
    (calls are serialised with a lock, so a helper thread may flush)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        *,
        readonly: bool,
        retention_days: float,
        retention_rows: int,
        prune_every_s: float,
        max_pending: int,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(conn, path, readonly=readonly, clock=clock)
        self._lock_fd: int | None = None  # the writer's lock (see :meth:`open`)
        self._init_queue(
            retention_days=retention_days,
            retention_rows=retention_rows,
            prune_every_s=prune_every_s,
            max_pending=max_pending,
        )

    @classmethod
    def open(
        cls,
        path: str | Path | None = None,
        *,
        readonly: bool = False,
        retention_days: float = 30.0,
        retention_rows: int = 200_000,
        prune_every_s: float = 600.0,
        max_pending: int = 10_000,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 0.5,
        owner: str = "",
    ) -> Store:
        """Open (creating and migrating as needed) the database at ``path``
        (default: :func:`default_path`).

        ``readonly=True`` opens an existing database for reading only, without
        migrating it. Opening for writing takes the database's lock file first and
        names this process in it (``owner``, e.g. the daemon's socket, says more).
        Raises :class:`StoreError` when another process holds the lock (naming it),
        when the file cannot be created or opened, is not an adaptd database, or has
        a schema this adaptd cannot use.
        """
        if retention_days <= 0 or retention_rows < 1:
            raise ValueError(
                f"retention must be positive: days={retention_days}, rows={retention_rows}"
            )
        path = Path(path) if path is not None else default_path()
        conn, lock_fd = connect(path, readonly, busy_timeout_s, owner)
        store = cls(
            conn,
            path,
            readonly=readonly,
            retention_days=retention_days,
            retention_rows=retention_rows,
            prune_every_s=prune_every_s,
            max_pending=max_pending,
            clock=clock,
        )
        store._lock_fd = lock_fd
        return store

    def schema_version(self) -> int:
        """The database's ``PRAGMA user_version``."""
        with self._lock:
            return schema.version(self._conn)

    def close(self) -> None:
        """Flush what is queued and close. Safe to call twice."""
        with self._lock:
            if self._conn is None:  # type: ignore[comparison-overlap]
                return
            if not self.readonly:
                self.flush()
            self._conn.close()
            self._conn = None  # type: ignore[assignment]
            lockfile.release(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
