"""Where the daemon's socket and state live, resolved the same way by daemon and client.

Order for the job socket: an explicit path (``--socket``/``socket=``/config), then
``$ADAPTD_SOCKET``, then the systemd runtime directory (``$RUNTIME_DIRECTORY``,
i.e. ``/run/adaptd``), then ``/run/adaptd/adaptd.sock`` when that directory is writable or already
holds the socket (a job in group ``adaptd`` can search it but not write it),
then ``$XDG_RUNTIME_DIR/adaptd/adaptd.sock``, then a per-user temp directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = [
    "ADMIN_SOCKET_NAME",
    "SOCKET_NAME",
    "SYSTEM_RUNTIME_DIR",
    "admin_socket_path",
    "endpoint",
    "runtime_dir",
    "socket_path",
    "state_dir",
]

SOCKET_NAME = "adaptd.sock"
#: The admin socket of a daemon whose job socket has no file (``tcp://``).
ADMIN_SOCKET_NAME = "adaptd.admin.sock"
SYSTEM_RUNTIME_DIR = Path("/run/adaptd")


def runtime_dir() -> Path:
    """The directory for the daemon's sockets (not created here)."""
    if env := os.environ.get("RUNTIME_DIRECTORY"):  # set by systemd's RuntimeDirectory=
        return Path(env.split(":")[0])
    # The system daemon's directory (0750, group adaptd): a job may only *search*
    # it, so a socket already there counts as much as write access does.
    if os.access(SYSTEM_RUNTIME_DIR, os.X_OK) and (
        os.access(SYSTEM_RUNTIME_DIR, os.W_OK) or (SYSTEM_RUNTIME_DIR / SOCKET_NAME).exists()
    ):
        return SYSTEM_RUNTIME_DIR
    if xdg := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(xdg) / "adaptd"
    return Path(tempfile.gettempdir()) / f"adaptd-{os.getuid()}"


def socket_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The job socket's filesystem path. An ``ipc://`` endpoint means its path, as
    ``serve --socket`` and ``ADAPTD_SOCKET`` take it."""
    if explicit:
        return Path(os.fspath(explicit).removeprefix("ipc://"))
    if env := os.environ.get("ADAPTD_SOCKET"):
        return Path(env.removeprefix("ipc://"))
    return runtime_dir() / SOCKET_NAME


def endpoint(explicit: str | os.PathLike[str] | None = None) -> str:
    """The ZeroMQ endpoint (``ipc://PATH``) for the job socket.

    An explicit ``ipc://`` or ``tcp://`` endpoint is returned unchanged.
    """
    text = os.fspath(explicit) if explicit else os.environ.get("ADAPTD_SOCKET", "")
    if text.startswith(("ipc://", "tcp://")):
        return text
    return f"ipc://{socket_path(explicit)}"


def admin_socket_path(job_socket: str | os.PathLike[str], run_dir: Path | None = None) -> Path:
    """The admin socket beside a job socket: ``adaptd.sock`` -> ``adaptd.admin.sock``.

    The daemon binds it there and every operator command looks for it there, so this
    is the one place that says where it is. A ``tcp://`` daemon has no job socket
    file: its admin socket is :data:`ADMIN_SOCKET_NAME` in ``run_dir`` (default
    :func:`runtime_dir`).
    """
    text = os.fspath(job_socket)
    if text.startswith("tcp:/"):  # also the "tcp:/h:p" a Path makes of "tcp://h:p"
        return (run_dir or runtime_dir()) / ADMIN_SOCKET_NAME
    p = Path(text.removeprefix("ipc://"))
    return p.with_name(f"{p.stem}.admin{p.suffix}")


def state_dir() -> Path:
    """Where the daemon keeps its SQLite state: ``$STATE_DIRECTORY`` under systemd,
    else ``$XDG_STATE_HOME/adaptd`` (``~/.local/state/adaptd``)."""
    if env := os.environ.get("STATE_DIRECTORY"):
        return Path(env.split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "adaptd"
