"""The daemon's memory: an embedded SQLite database in WAL mode.

What lives here is what a restart must not lose and what operators ask about
later: the save history, the decisions and why they were taken, learned
parameters (per job, per storage target, global), the failures seen, and job
settings an operator set at run time (a policy override, a pause).

:class:`Store` is one open database: one connection, the lock that serialises the
calls of its threads, its clock. It does three things with them, each with its own
rule:

- **queued writes** never stall the daemon's loop: ``record_*`` and
  :meth:`Store.set_param` only append to an in-memory queue, and :meth:`Store.flush`,
  called once per loop tick, writes the whole queue in one transaction. With
  ``synchronous=NORMAL`` in WAL mode a commit is a write to the WAL without an fsync,
  so a tick's flush costs well under a millisecond for typical batches. A flush that
  fails (disk full, database locked) is logged and counted, the batch is kept for the
  next tick, and nothing is raised into the loop; a queue that is not flushed stops
  taking rows at ``max_pending`` (they are counted as dropped);
- **reads** (for ``status``, ``history``, ``report`` and the daemon's start-up) flush
  the queue first, so they see everything recorded so far;
- **operator settings** (``adaptd set-policy``, ``adaptd pause``) are rare and must
  survive a crash right after the command returned, so they are not queued:
  :meth:`Store.set_job_setting` commits (fsynced) before it returns; the daemon reads
  them back at start (:meth:`Store.job_settings`).

The three share every piece of the store's state (a read flushes the queue, a close
flushes it, all take the one lock on the one connection), so they are one class.

Another process may open the same file read-only (``readonly=True``) while the daemon
runs; WAL lets it read without blocking the daemon. A second writer may not: opening
for writing takes ``adaptd.sqlite3.lock`` (:mod:`adaptd.state.lockfile`), so a second
daemon on the same state directory refuses to start and names the one holding it,
instead of each overwriting what the other learned.

The records it keeps are those of :mod:`adaptd.state.records` (made from the daemon's
events by :func:`adaptd.state.records.record_of`); the tables, their versioned migrations
and the SQL of retention are in :mod:`adaptd.state.schema`.

Retention is bounded by age and by row count per history table (:meth:`Store.prune`,
run from :meth:`Store.flush` every ``prune_every_s`` and whenever a tenth of
``retention_rows`` history rows were written since the last prune, so a table holds at
most ``retention_rows`` plus that tenth plus one flush, whatever the inflow), and by
the number of jobs whose learned parameters are kept.
"""

from __future__ import annotations

import enum
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from adaptd import events
from adaptd.protocol import paths
from adaptd.state import lockfile, schema
from adaptd.state.records import (
    DecisionRecord,
    FailureRecord,
    JobSettings,
    JobSummary,
    SaveRecord,
    record_of,
)
from adaptd.state.schema import (
    DECISION_COLS,
    FAILURE_COLS,
    HISTORY,
    MIGRATIONS,
    SAVE_COLS,
    SCHEMA_VERSION,
    StoreError,
)

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

log = logging.getLogger("adaptd.state.store")

_R = TypeVar("_R")

#: Scope of learned parameters that are not tied to a job or a storage target.
GLOBAL = "global"


def job_scope(job: str) -> str:
    """The learned-parameter scope of one job."""
    return f"job:{job}"


def storage_scope(target: str) -> str:
    """The learned-parameter scope of one storage target."""
    return f"storage:{target}"


def default_path() -> Path:
    """``adaptd.sqlite3`` in :func:`adaptd.protocol.paths.state_dir`."""
    return paths.state_dir() / "adaptd.sqlite3"


class _Keep(enum.Enum):
    """Sentinel type: "leave this setting as stored"."""

    KEEP = 0


KEEP = _Keep.KEEP


class Store:
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
        self._conn = conn
        self.path = path
        self.readonly = readonly
        self._clock = clock
        self._lock = threading.RLock()
        self._lock_fd: int | None = None  # the writer's lock (see :meth:`open`)
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
        conn, lock_fd = _connect(path, readonly, busy_timeout_s, owner)
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

    # ---------------------------------------------------------------- queued writes

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
            c.executemany(_insert("saves", SAVE_COLS), [_row(r) for r in self._saves])
        if self._decisions:
            c.executemany(_insert("decisions", DECISION_COLS), [_row(r) for r in self._decisions])
        if self._failures:
            c.executemany(_insert("failures", FAILURE_COLS), [_row(r) for r in self._failures])
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
            _rollback(self._conn)
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

    # ---------------------------------------------------------------- reads

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
        return [_build(SaveRecord, r, bools=("ok",)) for r in rows]

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
        return [_build(DecisionRecord, r, bools=("urgent",)) for r in rows]

    def failures(self, job: str | None = None) -> list[FailureRecord]:
        """Failures seen, oldest first (of one job, or all)."""
        where, args = ("WHERE job=?", (job,)) if job is not None else ("", ())
        rows = self._read(
            f"SELECT {', '.join(FAILURE_COLS)} FROM failures {where} ORDER BY time, id", args
        )
        return [_build(FailureRecord, r) for r in rows]

    def last_save(self, job: str, *, ok_only: bool = True) -> SaveRecord | None:
        """The newest save of ``job`` (successful only, by default)."""
        cond = " AND ok=1" if ok_only else ""
        rows = self._read(
            f"SELECT {', '.join(SAVE_COLS)} FROM saves WHERE job=?{cond} "
            "ORDER BY ended DESC, id DESC LIMIT 1",
            (job,),
        )
        return _build(SaveRecord, rows[0], bools=("ok",)) if rows else None

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

    # ---------------------------------------------------------------- operator settings

    def set_job_setting(
        self,
        job: str,
        *,
        policy: str | _Keep | None = KEEP,
        paused: bool | _Keep = KEEP,
    ) -> JobSettings:
        """Set a job's policy override and/or pause flag, durably, before returning.

        Pass ``policy=None`` to clear an override; an argument left out keeps its
        stored value. The commit is fsynced (``synchronous=FULL`` for this one
        write), so a power cut right after the operator's command cannot undo it.
        Raises :class:`sqlite3.Error` if it cannot be written, so the command can
        report the failure.
        """
        with self._lock:
            old = self.job_setting(job) or JobSettings(job=job)
            new = JobSettings(
                job=job,
                policy=old.policy if isinstance(policy, _Keep) else policy,
                paused=old.paused if isinstance(paused, _Keep) else bool(paused),
                updated=self._clock(),
            )
            self._conn.execute("PRAGMA synchronous=FULL")
            try:
                self._conn.execute(
                    "INSERT INTO job_settings (job, policy, paused, updated) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (job) DO UPDATE SET policy=excluded.policy, "
                    "paused=excluded.paused, updated=excluded.updated",
                    (new.job, new.policy, int(new.paused), new.updated),
                )
            finally:
                self._conn.execute("PRAGMA synchronous=NORMAL")
            return new

    def clear_job_setting(self, job: str) -> bool:
        """Forget an operator's settings for ``job``; True when there were any."""
        with self._lock:
            return self._conn.execute("DELETE FROM job_settings WHERE job=?", (job,)).rowcount > 0

    def job_setting(self, job: str) -> JobSettings | None:
        """The operator's settings for ``job``, if any."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT job, policy, paused, updated FROM job_settings WHERE job=?", (job,)
            ).fetchall()
        return _build(JobSettings, rows[0], bools=("paused",)) if rows else None

    def job_settings(self) -> dict[str, JobSettings]:
        """Every job's operator settings (the daemon reloads these at start)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT job, policy, paused, updated FROM job_settings ORDER BY job"
            ).fetchall()
        return {r[0]: _build(JobSettings, r, bools=("paused",)) for r in rows}


def _connect(
    path: Path, readonly: bool, busy_timeout_s: float, owner: str
) -> tuple[sqlite3.Connection, int | None]:
    """The database's connection and, for a writer, its lock (taken first).

    An in-memory database (``:memory:``) is private to its connection: no lock, and
    no ``:memory:.lock`` file left in the working directory."""
    private = str(path) == ":memory:"
    lock_fd = None if readonly or private else _lock_writer(path, owner)
    try:
        return schema.connect(path, readonly=readonly, busy_timeout_s=busy_timeout_s), lock_fd
    except BaseException:
        lockfile.release(lock_fd)
        raise


def _lock_writer(path: Path, owner: str) -> int:
    """Take ``PATH.lock``, the one-writer lock of the database at ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return lockfile.acquire(path.with_name(path.name + ".lock"), owner)
    except lockfile.Held as exc:
        raise StoreError(
            f"{path}: in use by another adaptd daemon ({exc.holder}); two daemons must not "
            "share a state database: stop that one first, or give this one its own "
            "daemon.state_dir (--state-dir)"
        ) from None
    except OSError as exc:
        raise StoreError(
            f"{path}: cannot open the state database ({exc}); check daemon.state_dir "
            "and that the directory is writable by the daemon's user"
        ) from None


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already: on a full disk it
    rolls back by itself, and a second ROLLBACK would raise "no transaction is
    active" in place of the error that says what happened."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _insert(table: str, cols: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"


def _row(rec: Any) -> tuple[Any, ...]:
    """A record as an SQL row (booleans as integers)."""
    return tuple(
        int(v) if isinstance(v, bool) else v for v in (getattr(rec, f.name) for f in fields(rec))
    )


def _build(cls: type[_R], values: Sequence[Any], *, bools: Sequence[str] = ()) -> _R:
    """A record from an SQL row (``bools``: the fields stored as integers)."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    kw = dict(zip(names, values, strict=True))
    for b in bools:
        kw[b] = bool(kw[b])
    return cls(**kw)
