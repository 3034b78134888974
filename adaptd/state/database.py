"""The state database's connection, shared by the parts of the store.

:class:`Database` is what each part of :class:`adaptd.state.store.Store` works on: one
SQLite connection (WAL mode, :mod:`adaptd.state.schema`), the lock that serialises the
calls of its threads, its path and whether it was opened read-only. :func:`connect` opens
the connection, taking the one-writer lock file first (:mod:`adaptd.state.lockfile`); the
row helpers turn the records of :mod:`adaptd.state.records` into SQL rows and back.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from adaptd.protocol import paths
from adaptd.state import lockfile, schema
from adaptd.state.schema import StoreError

__all__ = ["Database", "build", "connect", "default_path", "insert", "rollback", "row"]

_R = TypeVar("_R")


def default_path() -> Path:
    """``adaptd.sqlite3`` in :func:`adaptd.protocol.paths.state_dir`."""
    return paths.state_dir() / "adaptd.sqlite3"


def connect(
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


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already: on a full disk it
    rolls back by itself, and a second ROLLBACK would raise "no transaction is
    active" in place of the error that says what happened."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class Database:
    """One open database: its connection, lock, path, clock (``time.time``-like)."""

    def __init__(
        self, conn: sqlite3.Connection, path: Path, *, readonly: bool, clock: Callable[[], float]
    ) -> None:
        self._conn = conn
        self.path = path
        self.readonly = readonly
        self._clock = clock
        self._lock = threading.RLock()

    def flush(self) -> int:
        """Write what is queued (:class:`adaptd.state.queued_writes.QueuedWrites`); reads
        flush first so that they see everything recorded so far."""
        raise NotImplementedError


def insert(table: str, cols: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"


def row(rec: Any) -> tuple[Any, ...]:
    """A record as an SQL row (booleans as integers)."""
    return tuple(
        int(v) if isinstance(v, bool) else v for v in (getattr(rec, f.name) for f in fields(rec))
    )


def build(cls: type[_R], values: Sequence[Any], *, bools: Sequence[str] = ()) -> _R:
    """A record from an SQL row (``bools``: the fields stored as integers)."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    kw = dict(zip(names, values, strict=True))
    for b in bools:
        kw[b] = bool(kw[b])
    return cls(**kw)
