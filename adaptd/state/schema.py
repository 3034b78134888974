"""The state database's layout: its tables, and the migrations that build them.

The schema is versioned with ``PRAGMA user_version`` and upgraded by the ordered
:data:`MIGRATIONS` when :class:`adaptd.state.store.Store` opens a database: version 1 was
the first layout; version 2 added the save's extra step time and reason, the step
time at each decision, the operator's job settings and the indexes the report
queries use; version 3 the plan's durable cadence k (``durable_every``) with each
decision and the tier of each save (two tiers). The column lists come from the records
(:mod:`adaptd.state.records`), so a record and its table cannot disagree.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import fields
from pathlib import Path
from typing import Any

from adaptd.state.records import DecisionRecord, FailureRecord, SaveRecord

__all__ = [
    "DECISION_COLS",
    "FAILURE_COLS",
    "HISTORY",
    "MIGRATIONS",
    "OURS",
    "SAVE_COLS",
    "SCHEMA_VERSION",
    "StoreError",
    "connect",
    "delete_old",
    "history_query",
    "version",
]

log = logging.getLogger("adaptd.store")


class StoreError(RuntimeError):
    """The database cannot be opened or upgraded; the message names the file and what to do."""


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
    (
        3,
        (
            # two tiers (docs/tiers.md): the plan's "durable every k-th save" and the tier
            # a save went to ("local", or "" for the checkpoint directory)
            "ALTER TABLE decisions ADD COLUMN durable_every INTEGER",
            "ALTER TABLE saves ADD COLUMN tier TEXT NOT NULL DEFAULT ''",
        ),
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]

OURS = {"saves", "decisions", "params", "failures", "job_settings"}
#: History tables: (table, wall-time column) pruned by age and row count.
HISTORY = (("saves", "ended"), ("decisions", "time"), ("failures", "time"))

SAVE_COLS = tuple(f.name for f in fields(SaveRecord))
DECISION_COLS = tuple(f.name for f in fields(DecisionRecord))
FAILURE_COLS = tuple(f.name for f in fields(FailureRecord))


def connect(path: Path, *, readonly: bool, busy_timeout_s: float) -> sqlite3.Connection:
    """Open the database at ``path`` in WAL mode and bring its schema up to date
    (``readonly``: open an existing one as it is). Raises :class:`StoreError` when the
    file cannot be created or opened, is not an adaptd database, or has a schema this
    adaptd cannot use."""
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
            conn = sqlite3.connect(
                path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(
            f"{path}: cannot open the state database ({exc}); check daemon.state_dir "
            "and that the directory is writable by the daemon's user"
        ) from None
    try:
        _prepare(conn, path, readonly)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(
            f"{path}: not a usable SQLite database ({exc}); move it aside and restart "
            "(adaptd then starts with empty state)"
        ) from None
    except StoreError:
        conn.close()
        raise
    return conn


def version(conn: sqlite3.Connection) -> int:
    """The database's ``PRAGMA user_version``."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _prepare(conn: sqlite3.Connection, path: Path, readonly: bool) -> None:
    if not readonly:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":  # e.g. on a filesystem without shared memory
            log.warning("%s: WAL unavailable (journal_mode=%s); writes may block", path, mode)
        conn.execute("PRAGMA synchronous=NORMAL")
    current = version(conn)
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: schema version {current} is newer than this adaptd supports "
            f"({SCHEMA_VERSION}); upgrade adaptd, or set daemon.state_dir to a fresh directory"
        )
    if current == 0:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables - OURS:
            raise StoreError(
                f"{path}: holds tables adaptd did not create "
                f"({', '.join(sorted(tables))}); point daemon.db_path at a file of its own"
            )
    if current < SCHEMA_VERSION:
        if readonly:
            raise StoreError(
                f"{path}: schema version {current} is older than {SCHEMA_VERSION}; "
                "start the daemon once to upgrade it, then read it"
            )
        _migrate(conn, path, current)


def _migrate(conn: sqlite3.Connection, path: Path, current: int) -> None:
    for v, statements in MIGRATIONS:
        if v <= current:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql in statements:
                conn.execute(sql)
            conn.execute(f"PRAGMA user_version={v:d}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        log.info("%s: state schema upgraded to version %d", path, v)


def delete_old(conn: sqlite3.Connection, *, cutoff: float, rows: int) -> dict[str, int]:
    """Delete history older than wall time ``cutoff`` and beyond ``rows`` rows per table,
    and job parameters not updated since ``cutoff`` or beyond the ``rows`` most recently
    updated jobs; returns rows deleted per table. Runs in the caller's transaction."""
    out: dict[str, int] = {}
    for table, column in HISTORY:
        n = conn.execute(f"DELETE FROM {table} WHERE {column} < ?", (cutoff,)).rowcount
        n += conn.execute(
            f"DELETE FROM {table} WHERE id < "
            f"(SELECT id FROM {table} ORDER BY id DESC LIMIT 1 OFFSET ?)",
            (rows - 1,),
        ).rowcount
        out[table] = n
    out["params"] = conn.execute(
        "DELETE FROM params WHERE scope LIKE 'job:%' AND updated < ?", (cutoff,)
    ).rowcount
    # and at most `rows` jobs' parameters: the most recently updated
    out["params"] += conn.execute(
        "DELETE FROM params WHERE scope LIKE 'job:%' AND rowid NOT IN (SELECT rowid "
        "FROM params WHERE scope LIKE 'job:%' ORDER BY updated DESC LIMIT ?)",
        (rows,),
    ).rowcount
    return out


def history_query(
    table: str, job: str, since: float | None, until: float | None, limit: int | None
) -> tuple[str, list[Any]]:
    """The SELECT (newest first) of one job's rows of history ``table`` (``saves`` or
    ``decisions``) between wall times ``since`` and ``until``, at most ``limit``."""
    column = dict(HISTORY)[table]
    cols = {"saves": SAVE_COLS, "decisions": DECISION_COLS, "failures": FAILURE_COLS}[table]
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
    return sql, args
