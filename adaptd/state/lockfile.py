"""One live owner per resource: an ``flock`` on a lock file that names its holder.

The daemon takes one beside its job socket (two daemons must not serve one socket)
and one beside its state database (two daemons must not write one database, each
overwriting what the other learned). The lock is the kernel's: it goes with the
process, so a killed daemon's lock is free at once and nothing is cleaned up by
hand. The file itself stays, since unlinking it would let a starting process lock an
orphaned inode while another locks the new file.

The holder writes ``pid N, <what>`` into the file right after locking; a process
that loses a race with it may read the file before that write, so it waits briefly
for the holder's line before saying who holds the lock.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

#: How long a process that found the lock taken waits for the holder to name itself.
HOLDER_WAIT_S = 1.0


class Held(Exception):
    """Another live process holds the lock; ``holder`` is its line (pid and what it is)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by {holder}")
        self.path = path
        self.holder = holder


def acquire(path: str | os.PathLike[str], what: str = "") -> int:
    """Lock ``path`` (created 0600 if missing) and name this process in it.

    Returns the open descriptor: the lock is held until it is closed (:func:`release`)
    or the process ends. Raises :class:`Held` when another process holds it, and
    :class:`OSError` when the file cannot be opened.
    """
    p = Path(path)
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise Held(p, holder) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}{', ' + what if what else ''}\n".encode())
    return fd


def release(fd: int | None) -> None:
    """Give the lock up (the file stays)."""
    if fd is not None:
        os.close(fd)


def _holder(fd: int) -> str:
    """The holder's line; a holder that locked an instant ago may not have written it."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        if text:
            return text if text.startswith("pid ") else f"pid {text}"
        if time.monotonic() >= deadline:
            return "a process that has not said which (pid unknown)"
        time.sleep(0.01)  # the holder writes its line right after locking
