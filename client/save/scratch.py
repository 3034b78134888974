"""Where a worker that is not the chief writes its part of a save: host-local, and gone
after each save (a :class:`~adaptd.client.save.targets.Target`).

Under ``MultiWorkerMirroredStrategy`` every worker holds the same state and only the
chief's copy is the job's checkpoint; but every worker must take part in each save,
since TensorFlow may need collectives to read the state (``SyncOnRead`` variables).
TensorFlow's own convention (``distributed_file_utils.write_dirpath``) sends the other
workers' writes to ``<dir>/workertemp_<task>``, inside the checkpoint directory: on
shared storage that is N-1 copies of every checkpoint written to the shared server.
Here they go to a temporary directory on the host's own disk instead
(``$ADAPTD_SCRATCH``, else the system's temporary directory), and each is removed as
soon as its write ended. They cost the job only the time they stall it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adaptd.client.save import files

log = logging.getLogger("adaptd.client")

#: Environment variable naming the host-local directory for scratch writes.
ENV = "ADAPTD_SCRATCH"


def base_dir(scratch_dir: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path:
    """``scratch_dir``, else ``$ADAPTD_SCRATCH``, else the system's temporary directory.

    Raises ValueError when the directory does not exist and cannot be created.
    """
    chosen = scratch_dir or environ.get(ENV) or tempfile.gettempdir()
    path = Path(chosen)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"scratch directory {os.fspath(chosen)!r} cannot be created ({exc.strerror}); "
            f"give a host-local directory (scratch_dir= or ${ENV})"
        ) from None
    return path


class Scratch:
    """One process's scratch directory for its saves (created on first use).

    A process killed before :meth:`close` leaves its directory behind; the next scratch
    of the same job and rank on the host removes those whose process is gone (the
    directory names its process: ``adaptd-<job>-rank<rank>-pid<pid>-XXXX``).

    Args:
        job, rank: name the directory.
        scratch_dir: where to create it (see :func:`base_dir`).
        environ: the environment to read ``$ADAPTD_SCRATCH`` from.
    """

    def __init__(
        self,
        job: str,
        rank: int,
        scratch_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._base = base_dir(scratch_dir, os.environ if environ is None else environ)
        self._stem = f"adaptd-{job}-rank{rank}-pid"
        self._prefix = f"{self._stem}{os.getpid()}-"
        self.root: Path | None = None

    def prefix(self, step: int) -> str:
        """The checkpoint prefix for the save of ``step`` (the directory is created)."""
        if self.root is None or not self.root.is_dir():
            self._remove_left_behind()
            self.root = Path(tempfile.mkdtemp(prefix=self._prefix, dir=self._base))
        return str(self.root / f"ckpt-{step}")

    def _remove_left_behind(self) -> None:
        for old in self._base.glob(f"{self._stem}*-*"):
            pid = old.name[len(self._stem) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                log.info("removing %s: scratch of a process that is gone", old)
                shutil.rmtree(old, ignore_errors=True)

    def write(self, checkpoint: Any, step: int, options: Any) -> str:
        """Start the asynchronous write of ``checkpoint`` as the save of ``step`` (not the
        job's copy: host-local, and in no manager's list); its prefix."""
        return checkpoint.write(self.prefix(step), options=options)

    def discard(self, prefix: str) -> None:
        """Remove the files of the save at ``prefix`` (and leftovers of its write)."""
        files.remove_checkpoint(prefix)
        if self.root is not None:
            files.remove_orphans(self.root)

    def ended(self, prefix: str) -> None:
        """The write at ``prefix`` ended: it served the collectives (the chief's copy is
        the job's), so it goes."""
        self.discard(prefix)

    def close(self) -> None:
        """Remove the scratch directory and everything in it."""
        root, self.root = self.root, None
        if root is not None:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


__all__ = ["ENV", "Scratch", "base_dir"]
