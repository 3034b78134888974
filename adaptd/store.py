"""The daemon's memory: an embedded SQLite database in WAL mode.

What lives here is what a restart must not lose and what operators ask about
later: the save history, the decisions and why they were taken, learned
parameters (per job, per storage target, global), the failures seen, and job
settings an operator set at run time (a policy override, a pause).

Writes never stall the daemon's loop: ``record_*`` and :meth:`Store.set_param`
only append to an in-memory queue, and :meth:`Store.flush`, called once per loop
tick, writes the whole queue in one transaction. With ``synchronous=NORMAL`` in
WAL mode a commit is a write to the WAL without an fsync, so a tick's flush costs
well under a millisecond for typical batches. A flush that fails (disk full,
database locked) is logged and counted, the batch is kept for the next tick, and
nothing is raised into the loop. Operator settings (:meth:`Store.set_job_setting`)
are rare and must survive a crash right after the command returned, so they are
written through at once.

Reads (for ``status``, ``report`` and the daemon's start-up) first flush the queue
so they see everything recorded so far. Another process may open the same file
read-only (``readonly=True``) while the daemon runs; WAL lets it read without
blocking the daemon. A second writer may not: opening for writing takes
``adaptd.sqlite3.lock`` (:mod:`adaptd.lockfile`), so a second daemon on the same
state directory refuses to start and names the one holding it, instead of each
overwriting what the other learned.

The schema is versioned with ``PRAGMA user_version`` and upgraded by the ordered
:data:`MIGRATIONS` when the database is opened: version 1 was the first layout;
version 2 added the save's extra step time and reason, the step time at each
decision, the operator's job settings and the indexes the report queries use.
Retention is bounded by age and by row count per history table, and by the number
of jobs whose learned parameters are kept (:meth:`Store.prune`, run from
:meth:`Store.flush` every ``prune_every_s`` and whenever a tenth of
``retention_rows`` history rows were written since the last prune, so a table holds
at most ``retention_rows`` plus that tenth plus one flush, whatever the inflow).
"""

from __future__ import annotations

import enum
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from adaptd import events, lockfile, paths
from adaptd.protocol import SaveReport
from adaptd.snapshot import Decision

log = logging.getLogger(__name__)

#: Scope of learned parameters that are not tied to a job or a storage target.
GLOBAL = "global"


def job_scope(job: str) -> str:
    """The learned-parameter scope of one job."""
    return f"job:{job}"


def storage_scope(target: str) -> str:
    """The learned-parameter scope of one storage target."""
    return f"storage:{target}"


class _Keep(enum.Enum):
    """Sentinel type: "leave this setting as stored"."""

    KEEP = 0


KEEP = _Keep.KEEP


class StoreError(RuntimeError):
    """The database cannot be opened or upgraded; the message names the file and what to do."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class SaveRecord:
    """One save by one rank. Times are wall-clock seconds since the epoch."""

    job: str
    rank: int
    step: int
    started: float
    ended: float
    blocking_s: float
    durable_s: float
    bytes: int
    ok: bool = True
    error: str = ""
    path: str = ""
    extra_step_s: float = 0.0
    reason: str = ""

    @classmethod
    def from_report(cls, msg: SaveReport, *, received: float) -> SaveRecord:
        """The record for a :class:`~adaptd.protocol.SaveReport` received at wall time
        ``received``: the save started ``durable_s`` before it became durable."""
        return cls(
            job=msg.job,
            rank=msg.rank,
            step=msg.step,
            started=received - msg.durable_s,
            ended=received,
            blocking_s=msg.blocking_s,
            durable_s=msg.durable_s,
            bytes=msg.bytes,
            ok=msg.ok,
            error=msg.error,
            path=msg.path,
            extra_step_s=msg.extra_step_s,
            reason=msg.reason,
        )


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A plan sent to a job, and why. ``step`` is the job's step when it was decided."""

    job: str
    time: float
    step: int
    next_step: int | None
    every_steps: int | None = None
    urgent: bool = False
    policy: str = ""
    reason: str = ""
    interval_s: float | None = None
    waste: float | None = None
    step_time_s: float | None = None

    @classmethod
    def from_decision(
        cls,
        job: str,
        decision: Decision,
        *,
        time: float,
        step: int,
        step_time_s: float | None = None,
    ) -> DecisionRecord:
        """The record for ``decision`` taken for ``job`` at wall time ``time``."""
        return cls(
            job=job,
            time=time,
            step=step,
            next_step=decision.next_step,
            every_steps=decision.every_steps,
            urgent=decision.urgent,
            policy=decision.policy,
            reason=decision.reason,
            interval_s=decision.interval_s,
            waste=decision.waste,
            step_time_s=step_time_s,
        )


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """A job vanished without a goodbye and came back resuming from an older step."""

    job: str
    time: float  # wall time the failure was recognised
    lost_at_step: int  # the newest step reported before it vanished
    resumed_step: int | None = None  # the step the new incarnation resumed from
    restart_s: float | None = None  # from vanishing to the first step of the new run


@dataclass(frozen=True, slots=True)
class JobSettings:
    """What an operator set for a job at run time; survives daemon restarts."""

    job: str
    policy: str | None = None  # a policy spec overriding the config's choice
    paused: bool = False
    updated: float = 0.0


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job's footprint in the history, for ``status`` and ``report``."""

    job: str
    saves: int
    failed_saves: int
    last_save: float | None
    decisions: int
    failures: int


# --------------------------------------------------------------------------- schema

#: Ordered migrations: ``(version, statements)``. Each runs in its own transaction
#: together with the ``user_version`` bump, so a crash leaves a consistent version.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            """CREATE TABLE saves (
                id INTEGER PRIMARY KEY,
                job TEXT NOT NULL,
                rank INTEGER NOT NULL,
                step INTEGER NOT NULL,
                started REAL NOT NULL,
                ended REAL NOT NULL,
                blocking_s REAL NOT NULL,
                durable_s REAL NOT NULL,
                bytes INTEGER NOT NULL,
                path TEXT NOT NULL DEFAULT '',
                ok INTEGER NOT NULL,
                error TEXT NOT NULL DEFAULT ''
            )""",
            """CREATE TABLE decisions (
                id INTEGER PRIMARY KEY,
                job TEXT NOT NULL,
                time REAL NOT NULL,
                step INTEGER NOT NULL,
                next_step INTEGER,
                every_steps INTEGER,
                urgent INTEGER NOT NULL DEFAULT 0,
                policy TEXT NOT NULL DEFAULT '',
                reason TEXT NOT NULL DEFAULT '',
                interval_s REAL,
                waste REAL
            )""",
            """CREATE TABLE params (
                scope TEXT NOT NULL,
                key TEXT NOT NULL,
                value TEXT NOT NULL,
                updated REAL NOT NULL,
                PRIMARY KEY (scope, key)
            )""",
            """CREATE TABLE failures (
                id INTEGER PRIMARY KEY,
                job TEXT NOT NULL,
                time REAL NOT NULL,
                lost_at_step INTEGER NOT NULL,
                resumed_step INTEGER,
                restart_s REAL
            )""",
        ),
    ),
    (
        2,
        (
            "ALTER TABLE saves ADD COLUMN extra_step_s REAL NOT NULL DEFAULT 0",
            "ALTER TABLE saves ADD COLUMN reason TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE decisions ADD COLUMN step_time_s REAL",
            """CREATE TABLE job_settings (
                job TEXT PRIMARY KEY,
                policy TEXT,
                paused INTEGER NOT NULL DEFAULT 0,
                updated REAL NOT NULL
            )""",
            "CREATE INDEX saves_job_ended ON saves (job, ended)",
            "CREATE INDEX saves_ended ON saves (ended)",
            "CREATE INDEX decisions_job_time ON decisions (job, time)",
            "CREATE INDEX decisions_time ON decisions (time)",
            "CREATE INDEX failures_job_time ON failures (job, time)",
        ),
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]

_OURS = {"saves", "decisions", "params", "failures", "job_settings"}
#: History tables: (table, wall-time column) pruned by age and row count.
_HISTORY = (("saves", "ended"), ("decisions", "time"), ("failures", "time"))

_SAVE_COLS = tuple(f.name for f in fields(SaveRecord))
_DECISION_COLS = tuple(f.name for f in fields(DecisionRecord))
_FAILURE_COLS = tuple(f.name for f in fields(FailureRecord))

_R = TypeVar("_R")


def _lock_writer(path: Path, owner: str) -> int:
    """Take ``PATH.lock``, the one-writer lock of the database at ``path``."""
    try:
        return lockfile.acquire(path.with_name(path.name + ".lock"), owner)
    except lockfile.Held as exc:
        raise StoreError(
            f"{path}: in use by another adaptd daemon ({exc.holder}); two daemons must not "
            "share a state database: stop that one first, or give this one its own "
            "daemon.state_dir (--state-dir)"
        ) from None


def default_path() -> Path:
    """``adaptd.sqlite3`` in :func:`adaptd.paths.state_dir`."""
    return paths.state_dir() / "adaptd.sqlite3"


# --------------------------------------------------------------------------- the store


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
        self._lock_fd: int | None = None  # the writer's lock (see :meth:`open`)
        self.retention_days = retention_days
        self.retention_rows = retention_rows
        self.prune_every_s = prune_every_s
        self.max_pending = max_pending
        self._clock = clock
        self._lock = threading.RLock()
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
        #: A job's current step time, for decision rows (a PlanChanged event carries
        #: none); the daemon's service sets it to read the job's tracker.
        self.step_time_of: Callable[[str], float | None] | None = None

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
        try:
            if readonly:
                if not path.is_file():
                    raise StoreError(
                        f"{path}: no adaptd state database here; "
                        "is the daemon's daemon.state_dir elsewhere?"
                    )
                conn = sqlite3.connect(
                    f"{path.resolve().as_uri()}?mode=ro",
                    uri=True,
                    timeout=busy_timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                )
            else:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                lock_fd = _lock_writer(path, owner)
                try:
                    conn = sqlite3.connect(
                        path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
                    )
                except BaseException:
                    lockfile.release(lock_fd)
                    raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"{path}: cannot open the state database ({exc}); check daemon.state_dir "
                "and that the directory is writable by the daemon's user"
            ) from None
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
        if not readonly:
            store._lock_fd = lock_fd
        try:
            store._prepare()
        except sqlite3.DatabaseError as exc:
            conn.close()
            lockfile.release(store._lock_fd)
            raise StoreError(
                f"{path}: not a usable SQLite database ({exc}); move it aside and restart "
                "(adaptd then starts with empty state)"
            ) from None
        except StoreError:
            conn.close()
            lockfile.release(store._lock_fd)
            raise
        return store

    def _prepare(self) -> None:
        conn = self._conn
        if not self.readonly:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":  # e.g. on a filesystem without shared memory
                log.warning(
                    "%s: WAL unavailable (journal_mode=%s); writes may block", self.path, mode
                )
            conn.execute("PRAGMA synchronous=NORMAL")
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version} is newer than this adaptd supports "
                f"({SCHEMA_VERSION}); upgrade adaptd, or set daemon.state_dir to a fresh directory"
            )
        if version == 0:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if tables - _OURS:
                raise StoreError(
                    f"{self.path}: holds tables adaptd did not create "
                    f"({', '.join(sorted(tables))}); point daemon.db_path at a file of its own"
                )
        if version < SCHEMA_VERSION:
            if self.readonly:
                raise StoreError(
                    f"{self.path}: schema version {version} is older than {SCHEMA_VERSION}; "
                    "start the daemon once to upgrade it, then read it"
                )
            self._migrate(version)

    def schema_version(self) -> int:
        """The database's ``PRAGMA user_version``."""
        with self._lock:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self, current: int) -> None:
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for sql in statements:
                    self._conn.execute(sql)
                self._conn.execute(f"PRAGMA user_version={version:d}")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            log.info("%s: state schema upgraded to version %d", self.path, version)

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
                    log.warning(
                        "%s: %d rows queued and not flushed; dropping new history rows",
                        self.path,
                        self.max_pending,
                    )
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

    def flush(self) -> int:
        """Write everything queued in one transaction; returns the rows written.

        Never raises for a database fault: it is logged, counted in
        :attr:`write_errors` and the batch stays queued (0 is returned).
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
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._write_batch()
                    if prune_due:
                        self._prune(now)
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
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
                self._last_prune = now
                self._since_prune = 0
            self.last_flush_s = time.perf_counter() - t0
            return n

    def _write_batch(self) -> None:
        c = self._conn
        if self._saves:
            c.executemany(_insert("saves", _SAVE_COLS), [_row(r) for r in self._saves])
        if self._decisions:
            c.executemany(_insert("decisions", _DECISION_COLS), [_row(r) for r in self._decisions])
        if self._failures:
            c.executemany(_insert("failures", _FAILURE_COLS), [_row(r) for r in self._failures])
        if self._params:
            c.executemany(
                "INSERT INTO params (scope, key, value, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (scope, key) DO UPDATE SET value=excluded.value, "
                "updated=excluded.updated",
                [(s, k, v, t) for (s, k), (v, t) in self._params.items()],
            )

    def on_event(self, ev: events.Event) -> None:
        """An :data:`adaptd.events.Sink`: queue what the daemon's event says.

        Every rank's save report is a row; a plan change and an urgent save request
        are decisions; a confirmed failure (:class:`~adaptd.events.JobResumed`) is a
        failure row dated when the job was lost. Only queues: cheap in the loop.
        """
        if isinstance(ev, events.SaveReported):
            self.record_save(SaveRecord.from_report(ev.report, received=ev.wall))
        elif isinstance(ev, events.PlanChanged):
            st = self.step_time_of(ev.job) if self.step_time_of is not None else None
            self.record_decision(
                DecisionRecord.from_decision(
                    ev.job, ev.decision, time=ev.wall, step=ev.step, step_time_s=st
                )
            )
        elif isinstance(ev, events.SaveRequested):
            st = self.step_time_of(ev.job) if self.step_time_of is not None else None
            self.record_decision(
                DecisionRecord(
                    ev.job, ev.wall, ev.step, None, urgent=True, reason=ev.reason, step_time_s=st
                )
            )
        elif isinstance(ev, events.JobResumed):
            self.record_failure(
                FailureRecord(
                    job=ev.job,
                    time=ev.wall - ev.restart_s,
                    lost_at_step=ev.last_step,
                    resumed_step=ev.resumed_from,
                    restart_s=ev.restart_s,
                )
            )

    # ---------------------------------------------------------------- retention

    def prune(self, now: float | None = None) -> dict[str, int]:
        """Delete history older than ``retention_days`` and beyond ``retention_rows``
        per table, and job parameters not updated within the retention period.
        Returns rows deleted per table. Raises :class:`sqlite3.Error` on a fault."""
        with self._lock:
            self.flush()
            now = self._clock() if now is None else now
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                out = self._prune(now)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._last_prune = now
            self._since_prune = 0
            return out

    def _prune(self, now: float) -> dict[str, int]:
        cutoff = now - self.retention_days * 86400.0
        out: dict[str, int] = {}
        c = self._conn
        for table, column in _HISTORY:
            n = c.execute(f"DELETE FROM {table} WHERE {column} < ?", (cutoff,)).rowcount
            n += c.execute(
                f"DELETE FROM {table} WHERE id < "
                f"(SELECT id FROM {table} ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (self.retention_rows - 1,),
            ).rowcount
            out[table] = n
        out["params"] = c.execute(
            "DELETE FROM params WHERE scope LIKE 'job:%' AND updated < ?", (cutoff,)
        ).rowcount
        # and at most retention_rows jobs' parameters: the most recently updated
        out["params"] += c.execute(
            "DELETE FROM params WHERE scope LIKE 'job:%' AND rowid NOT IN (SELECT rowid "
            "FROM params WHERE scope LIKE 'job:%' ORDER BY updated DESC LIMIT ?)",
            (self.retention_rows,),
        ).rowcount
        return out

    # ---------------------------------------------------------------- write-through settings

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
        rows = self._history("saves", "ended", _SAVE_COLS, job, since, until, limit)
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
        rows = self._history("decisions", "time", _DECISION_COLS, job, since, until, limit)
        return [_build(DecisionRecord, r, bools=("urgent",)) for r in rows]

    def failures(self, job: str | None = None) -> list[FailureRecord]:
        """Failures seen, oldest first (of one job, or all)."""
        where, args = ("WHERE job=?", (job,)) if job is not None else ("", ())
        rows = self._read(
            f"SELECT {', '.join(_FAILURE_COLS)} FROM failures {where} ORDER BY time, id", args
        )
        return [_build(FailureRecord, r) for r in rows]

    def last_save(self, job: str, *, ok_only: bool = True) -> SaveRecord | None:
        """The newest save of ``job`` (successful only, by default)."""
        cond = " AND ok=1" if ok_only else ""
        rows = self._read(
            f"SELECT {', '.join(_SAVE_COLS)} FROM saves WHERE job=?{cond} "
            "ORDER BY ended DESC, id DESC LIMIT 1",
            (job,),
        )
        return _build(SaveRecord, rows[0], bools=("ok",)) if rows else None

    def _history(
        self,
        table: str,
        column: str,
        cols: Iterable[str],
        job: str,
        since: float | None,
        until: float | None,
        limit: int | None,
    ) -> list[tuple[Any, ...]]:
        sql = f"SELECT {', '.join(cols)} FROM {table} WHERE job=?"
        args: list[Any] = [job]
        if since is not None:
            sql += f" AND {column} >= ?"
            args.append(since)
        if until is not None:
            sql += f" AND {column} <= ?"
            args.append(until)
        sql += f" ORDER BY {column} DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return list(reversed(self._read(sql, args)))

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

    def counts(self) -> dict[str, int]:
        """Rows per table (for ``status`` and tests)."""
        names = [t for t, _ in _HISTORY] + ["params", "job_settings"]
        return {t: self._read(f"SELECT count(*) FROM {t}")[0][0] for t in names}


def _insert(table: str, cols: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"


def _row(rec: Any) -> tuple[Any, ...]:
    return tuple(
        int(v) if isinstance(v, bool) else v for v in (getattr(rec, f.name) for f in fields(rec))
    )


def _build(cls: type[_R], row: Sequence[Any], *, bools: Sequence[str] = ()) -> _R:
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    values = dict(zip(names, row, strict=True))
    for b in bools:
        values[b] = bool(values[b])
    return cls(**values)
