"""The daemon's sockets: where they are, who holds them, and what crosses them.

:class:`Transport` owns everything below the messages: the job socket's path (or
its ``tcp://`` endpoint with CURVE), the admin socket beside it, the lock file that
keeps a second daemon off the same socket, the ZeroMQ context and both ROUTER
sockets with their limits (queue lengths, the largest frame), the wake-up pipe a
signal handler or :meth:`Transport.wake` writes to, and the credentials ZeroMQ
recorded for each connection (:func:`peer_cred`). It knows nothing of jobs or
plans: the daemon's loop asks it to poll, hands the frames to the job and admin
handlers, and they answer through :meth:`Transport.send`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from adaptd.daemon.jobs.table import PeerCred, Rank
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.waker import Waker
from adaptd.logfmt import Throttle, logfmt
from adaptd.protocol import admin, paths
from adaptd.protocol import job as p
from adaptd.state import lockfile

__all__ = [
    "BATCH",
    "HARD_MAX_FRAME",
    "HWM",
    "JOB_RCVHWM",
    "MAX_IPC_PATH",
    "CurveKeys",
    "DaemonError",
    "SendRank",
    "Transport",
    "peer_cred",
]

log = logging.getLogger("adaptd.server")

#: Queued messages per peer (ZeroMQ high-water marks): beyond them ZeroMQ drops.
HWM = 1000
#: Inbound messages queued per job connection. With frames of up to ``HARD_MAX_FRAME``
#: this bounds what one flooding peer can park in the daemon's memory (25 MiB); a
#: real rank sends about one message a second.
JOB_RCVHWM = 100
#: Frames above this are cut off by ZeroMQ (the peer is disconnected); between
#: ``MAX_MESSAGE_BYTES`` and this they get a ``too_large`` error reply.
HARD_MAX_FRAME = 4 * p.MAX_MESSAGE_BYTES
#: Messages handled per socket per loop turn, so one flood cannot starve the rest.
BATCH = 500
#: Longest ipc path (sun_path is 108 bytes with its terminating NUL).
MAX_IPC_PATH = 107

#: Sends a message to one rank and notes when (:meth:`Transport.send_rank`).
SendRank = Callable[[Rank, p.Message, float], None]


class DaemonError(Exception):
    """The daemon cannot start: the message says what to change."""


@dataclass(frozen=True)
class CurveKeys:
    """CURVE authentication for a ``tcp://`` job socket.

    ``secret_key``: the server's certificate with its secret key (a
    ``zmq.auth.create_certificates`` ``*.key_secret`` file). ``client_keys``: a
    directory of the public certificates (``*.key``) of the clients allowed in;
    any other key, and any peer that does not speak CURVE, is refused by ZeroMQ's
    ZAP authenticator before a single message reaches the daemon.
    """

    secret_key: Path
    client_keys: Path

    def load(self) -> tuple[bytes, bytes]:
        """The server's (public, secret) key pair; raises :class:`DaemonError`."""
        import zmq.auth

        if not Path(self.client_keys).is_dir():
            raise DaemonError(
                f"daemon.curve_client_keys: {self.client_keys} is not a directory of client "
                "public keys (*.key files made by zmq.auth.create_certificates)"
            )
        try:
            public, secret = zmq.auth.load_certificate(self.secret_key)
        except (OSError, ValueError) as exc:
            raise DaemonError(
                f"daemon.curve_secret_key: cannot read a CURVE certificate from "
                f"{self.secret_key}: {exc}"
            ) from None
        if not secret:
            raise DaemonError(
                f"daemon.curve_secret_key: {self.secret_key} holds no secret key; name the "
                "*.key_secret file, not the public *.key"
            )
        return public, secret


def peer_cred(frame: zmq.Frame) -> PeerCred | None:
    """The credentials ZeroMQ recorded for the connection ``frame`` came over.

    ``ipc://``: ``Peer-Address`` is ``HOST:UID:GID:PID`` from ``SO_PEERCRED``.
    CURVE: ``User-Id`` is the client's public key (set by the ZAP authenticator).
    ``None`` when neither is known.
    """
    key = None
    with contextlib.suppress(zmq.ZMQError, UnicodeDecodeError):
        key = frame.get("User-Id") or None
    address = ""
    with contextlib.suppress(zmq.ZMQError, UnicodeDecodeError):
        address = frame.get("Peer-Address") or ""
    parts = address.rsplit(":", 3)
    if len(parts) == 4 and all(x.isdigit() for x in parts[1:]):
        uid, gid, pid = (int(x) for x in parts[1:])
        return PeerCred(uid=uid, gid=gid, pid=pid or None, key=key)
    return PeerCred(key=key) if key else None


class Transport:
    """The job and admin sockets, the lock and the wake-up pipe of one daemon.

    ``socket``: an ipc path (or ``ipc://PATH``), a ``tcp://HOST:PORT`` endpoint
    (``curve`` required), or ``None`` for ``$ADAPTD_SOCKET`` / the runtime
    directory. Raises :class:`DaemonError` for a TCP socket without CURVE, unusable
    CURVE keys, or an ipc path too long for the kernel; :meth:`open` raises it when
    another live daemon holds the socket or a socket cannot be bound.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        curve: CurveKeys | None = None,
        stats: DaemonStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        waker: Waker | None = None,
    ) -> None:
        text = os.fspath(socket) if socket else os.environ.get("ADAPTD_SOCKET", "")
        #: ``tcp://HOST:PORT`` when jobs connect over TCP (CURVE required), else None.
        self.tcp: str | None = text if text.startswith("tcp://") else None
        self.curve = curve
        if self.tcp is not None and curve is None:
            raise DaemonError(
                f"socket {text!r}: TCP is refused without CURVE authentication; set "
                "daemon.curve_secret_key and daemon.curve_client_keys, or use an ipc path"
            )
        self._curve_pair = curve.load() if self.tcp is not None and curve is not None else None
        self.socket_path = _job_socket_path(None if self.tcp else socket)
        self.admin_path = paths.admin_socket_path(self.socket_path)
        self.lock_path = self.socket_path.with_name(self.socket_path.name + ".lock")
        for path in (self.socket_path, self.admin_path):
            if len(os.fsencode(path)) > MAX_IPC_PATH:
                raise DaemonError(
                    f"socket path {str(path)!r} is {len(os.fsencode(path))} bytes; ipc paths "
                    f"are limited to {MAX_IPC_PATH}: pass a shorter --socket"
                )
        self.stats = stats if stats is not None else DaemonStats()
        self.clock = clock
        #: when :meth:`open` bound the sockets (the daemon's uptime counts from here)
        self.opened_at = 0.0
        self._throttle = Throttle()
        self._ctx: zmq.Context | None = None
        self._auth: Any = None  # zmq.auth ThreadAuthenticator, for CURVE over TCP
        self._jobs: zmq.Socket | None = None
        self._admin: zmq.Socket | None = None
        self._poller: zmq.Poller | None = None
        self._lock_fd: int | None = None
        #: wakes the poll from other threads and signal handlers
        self.waker = waker if waker is not None else Waker()

    @property
    def endpoint(self) -> str:
        """What jobs connect to: ``ipc://PATH`` or the ``tcp://`` endpoint."""
        return self.tcp or f"ipc://{self.socket_path}"

    @property
    def is_open(self) -> bool:
        return self._jobs is not None

    @property
    def wakeup_fd(self) -> int:
        """A non-blocking fd for :func:`signal.set_wakeup_fd`: a signal wakes the poll."""
        return self.waker.wakeup_fd

    def wake(self) -> None:
        """Make the current (or next) :meth:`poll` return at once; safe from any thread."""
        self.waker.wake()

    # ------------------------------------------------------------------ open, close

    def open(self) -> None:
        """Take the lock, bind both sockets. Raises :class:`DaemonError`."""
        if self.is_open:
            return
        _prepare_dir(self.socket_path.parent)
        self._lock()
        try:
            for path in self._files():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # stale: whoever bound it no longer holds the lock
            self._ctx = zmq.Context()
            self._jobs = self._ctx.socket(zmq.ROUTER)
            self._admin = self._ctx.socket(zmq.ROUTER)
            for s in (self._jobs, self._admin):
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.SNDHWM, HWM)
                s.setsockopt(zmq.RCVHWM, HWM)
                s.setsockopt(zmq.MAXMSGSIZE, HARD_MAX_FRAME)
            # A reply to a peer whose queue is full (or that is gone) raises instead of
            # vanishing silently, so it is counted as send_dropped.
            self._jobs.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._jobs.setsockopt(zmq.RCVHWM, JOB_RCVHWM)
            # admin first: once the job socket exists, the daemon answers both
            self._bind(self._admin, self.admin_path, 0o600)
            if self.tcp is not None:
                self._bind_curve(self._jobs, self.tcp)
            else:
                self._bind(self._jobs, self.socket_path, 0o660)
        except BaseException:
            self._close_sockets()
            self._unlock()
            raise
        self._poller = zmq.Poller()
        self._poller.register(self._jobs, zmq.POLLIN)
        self._poller.register(self._admin, zmq.POLLIN)
        self._poller.register(self.waker.fileno(), zmq.POLLIN)
        self.opened_at = self.clock()

    def close(self) -> None:
        """Close the sockets, remove their files, release the lock."""
        if not self.is_open:
            return
        self._close_sockets()
        for path in self._files():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._unlock()

    def _files(self) -> list[Path]:
        """The socket files this daemon binds (and removes)."""
        return [self.admin_path] if self.tcp else [self.socket_path, self.admin_path]

    # ------------------------------------------------------------------ traffic

    def poll(self, timeout_ms: int) -> tuple[bool, bool]:
        """Wait up to ``timeout_ms`` for either socket or a wake-up; returns whether the
        (job, admin) socket has frames. A signal interrupting the wait returns early."""
        assert self._poller is not None
        try:
            ready = dict(self._poller.poll(timeout_ms))
        except zmq.ZMQError as exc:
            if exc.errno == errno.EINTR:
                return False, False
            raise
        if self.waker.fileno() in ready:
            self.waker.drain()
        return self._jobs in ready, self._admin in ready

    def job_frames(self) -> Iterator[list[zmq.Frame]]:
        """Up to :data:`BATCH` waiting messages of the job socket."""
        assert self._jobs is not None
        return _batch(self._jobs)

    def admin_frames(self) -> Iterator[list[zmq.Frame]]:
        """Up to :data:`BATCH` waiting messages of the admin socket."""
        assert self._admin is not None
        return _batch(self._admin)

    def send(self, identity: bytes, msg: p.Message) -> bool:
        """Send ``msg`` to the job connection ``identity`` without blocking; a full queue
        or a vanished peer is counted (``send_dropped``) and logged, never raised."""
        assert self._jobs is not None
        counters = self.stats.counters
        try:
            self._jobs.send_multipart([identity, p.encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            # EAGAIN: the peer's queue is full (a slow or stuck reader); EHOSTUNREACH:
            # it is gone (ROUTER_MANDATORY reports both instead of dropping silently)
            counters["send_dropped"] += 1
            if self._throttle(f"send:{exc.errno}"):
                log.warning(logfmt("send_dropped", peer=identity.hex(), error=exc.strerror))
            return False
        counters["sent"] += 1
        return True

    def send_rank(self, rank: Rank, msg: p.Message, now: float) -> None:
        """:meth:`send` to a registered rank, noting when it last heard from the daemon."""
        if self.send(rank.identity, msg):
            rank.sent(now)

    def send_admin(self, envelope: Sequence[bytes], reply: admin.Reply) -> None:
        """Reply to an operator (a reply nobody waits for any more is dropped)."""
        assert self._admin is not None
        with contextlib.suppress(zmq.Again):
            self._admin.send_multipart([*envelope, admin.encode(reply)], zmq.NOBLOCK)

    # ------------------------------------------------------------------ internals

    def _bind_curve(self, sock: zmq.Socket, endpoint: str) -> None:
        """Bind ``endpoint`` as a CURVE server whose ZAP handler admits the allowed keys."""
        from zmq.auth.thread import ThreadAuthenticator

        assert self._ctx is not None and self.curve is not None and self._curve_pair is not None
        public, secret = self._curve_pair
        self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("adaptd.auth"))
        self._auth.start()
        self._auth.configure_curve(domain="adaptd", location=str(self.curve.client_keys))
        sock.setsockopt(zmq.ZAP_DOMAIN, b"adaptd")
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise DaemonError(f"cannot bind {endpoint}: {exc.strerror}") from None
        allowed = len(list(Path(self.curve.client_keys).glob("*.key")))
        log.info(logfmt("curve", endpoint=endpoint, client_keys=allowed))

    def _bind(self, sock: zmq.Socket, path: Path, mode: int) -> None:
        try:
            sock.bind(f"ipc://{path}")
        except zmq.ZMQError as exc:
            raise DaemonError(f"cannot bind {path}: {exc.strerror}") from None
        os.chmod(path, mode)

    def _lock(self) -> None:
        try:
            self._lock_fd = lockfile.acquire(self.lock_path)
        except OSError as exc:
            raise DaemonError(
                f"cannot open the lock file {self.lock_path}: {exc.strerror}"
            ) from None
        except lockfile.Held as exc:
            raise DaemonError(
                f"another adaptd daemon ({exc.holder}) is serving {self.socket_path}; "
                "stop it first, or pass a different --socket"
            ) from None

    def _unlock(self) -> None:
        lockfile.release(self._lock_fd)
        self._lock_fd = None

    def _close_sockets(self) -> None:
        for s in (self._jobs, self._admin):
            if s is not None:
                s.close(linger=0)
        self._jobs = self._admin = None
        self._poller = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def _batch(sock: zmq.Socket) -> Iterator[list[zmq.Frame]]:
    for _ in range(BATCH):
        try:
            # Frames, not bytes: they carry the connection's credentials (peer_cred).
            yield sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return


def _job_socket_path(socket: str | os.PathLike[str] | None) -> Path:
    """The ipc job socket's path; for a TCP daemon, the default path in the runtime
    directory, beside which its admin socket and lock file live."""
    text = os.fspath(socket) if socket else os.environ.get("ADAPTD_SOCKET", "")
    if text.startswith("tcp://"):
        return paths.runtime_dir() / paths.SOCKET_NAME
    return paths.socket_path(text.removeprefix("ipc://") or None)


def _per_user_dirs() -> Sequence[Path]:
    out = [Path(tempfile.gettempdir()) / f"adaptd-{os.getuid()}"]
    if xdg := os.environ.get("XDG_RUNTIME_DIR"):
        out.append(Path(xdg) / "adaptd")
    return out


def _prepare_dir(directory: Path) -> None:
    """Create the socket's directory; a per-user one must be ours and private (0700)."""
    private = directory in _per_user_dirs()
    try:
        directory.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
    except OSError as exc:
        raise DaemonError(
            f"cannot create the socket directory {directory}: {exc.strerror}; "
            "pass --socket in a writable directory"
        ) from None
    if private:
        st = os.lstat(directory)
        if directory.is_symlink() or st.st_uid != os.getuid():
            raise DaemonError(
                f"{directory} is not a directory owned by uid {os.getuid()}; "
                "remove it or pass --socket elsewhere"
            )
        if st.st_mode & 0o077:
            os.chmod(directory, 0o700)
