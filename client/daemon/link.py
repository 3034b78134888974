"""The hook's ZeroMQ connection to the daemon, and whether the daemon is alive.

A DEALER socket with ``LINGER=0`` (closing never waits for the daemon) and
``IMMEDIATE=1`` (nothing is queued for a daemon that is not there: a send to no
peer fails at once instead of piling up stale reports). Every send is
non-blocking; a message that cannot go out is dropped and counted. Frames that do
not decode are dropped and counted too: a broken daemon must not break training.

Over ``tcp://`` the connection is CURVE-encrypted and authenticated: the daemon's
public key and this client's key pair come from the arguments or from
``$ADAPTD_CURVE_SERVER_KEY`` (the server's public ``*.key`` file, or its 40-character
Z85 key) and ``$ADAPTD_CURVE_CLIENT_KEY`` (this client's ``*.key_secret`` file); a
``tcp://`` endpoint without them is refused at construction.

Liveness is judged from the times passed in (no clock here): the daemon counts as
present once it has sent Welcome, and as lost when nothing arrived for
``timeout_s`` after a send it had to answer (or a refused one: with no peer every
send is). A daemon answers a rank it has told nothing for
:data:`~adaptd.protocol.job.KEEPALIVE_S`, so only sends at least that long after
the newest message received start the clock: a dead daemon is noticed within
``KEEPALIVE_S`` plus the report interval plus ``timeout_s`` of its last message.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import zmq

from adaptd.client.checks import check_seconds
from adaptd.protocol import job as protocol

__all__ = [
    "CLIENT_KEY_ENV",
    "DAEMON_TIMEOUT_S",
    "SERVER_KEY_ENV",
    "DaemonLink",
    "curve_keys",
]

log = logging.getLogger("adaptd.client")

#: Default seconds of silence (after a send the daemon must answer) before the daemon
#: counts as gone: the hook's ``daemon_timeout``.
DAEMON_TIMEOUT_S = 5.0
#: Environment variables naming the CURVE keys for a ``tcp://`` daemon.
SERVER_KEY_ENV = "ADAPTD_CURVE_SERVER_KEY"
CLIENT_KEY_ENV = "ADAPTD_CURVE_CLIENT_KEY"


def curve_keys(
    server_key: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
) -> tuple[bytes, bytes, bytes]:
    """(server public, client public, client secret) Z85 keys for a CURVE connection.

    ``server_key``: the daemon's public certificate file or its Z85 key;
    ``client_key``: this client's ``*.key_secret`` certificate file. Either falls back
    to its environment variable. Raises :class:`ValueError` naming what is missing.
    """
    import zmq.auth

    server = server_key or os.environ.get(SERVER_KEY_ENV)
    client = client_key or os.environ.get(CLIENT_KEY_ENV)
    if not server or not client:
        raise ValueError(
            "a tcp:// daemon needs CURVE keys: pass curve_server_key/curve_client_key or "
            f"set ${SERVER_KEY_ENV} (the daemon's public key file) and ${CLIENT_KEY_ENV} "
            "(this client's *.key_secret file); see docs/daemon.md"
        )
    text = os.fspath(server)
    try:
        if len(text) == 40 and not Path(text).exists():
            server_public = text.encode("ascii")
        else:
            server_public, _ = zmq.auth.load_certificate(text)
        public, secret = zmq.auth.load_certificate(os.fspath(client))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read a CURVE key: {exc}") from None
    if not secret:
        raise ValueError(
            f"{os.fspath(client)!r} holds no secret key: name this client's *.key_secret file"
        )
    return server_public, public, secret


class DaemonLink:
    """One DEALER connection to ``endpoint``; never raises on send or receive."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = DAEMON_TIMEOUT_S,
        curve_server_key: str | os.PathLike[str] | None = None,
        curve_client_key: str | os.PathLike[str] | None = None,
    ) -> None:
        """Raises :class:`ValueError` for a bad timeout or endpoint, or a ``tcp://``
        endpoint without usable CURVE keys (see :func:`curve_keys`)."""
        check_seconds("daemon_timeout", timeout_s)
        keys = None
        if endpoint.startswith("tcp://"):
            keys = curve_keys(curve_server_key, curve_client_key)
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        # Its own context, so that close() can terminate it: zmq_ctx_term is what waits
        # for a lingering last message (the Goodbye); without it a process that ends
        # right after close() (os._exit in a forked worker, or a busy machine at
        # interpreter exit) kills the I/O thread with the message still queued.
        self._context = zmq.Context()
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.SNDHWM, 100)
        sock.setsockopt(zmq.RCVHWM, 100)
        if keys is not None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            self._context.term()
            raise ValueError(
                f"socket={endpoint!r} is not a usable ZeroMQ endpoint: {exc}"
            ) from None
        self._sock: zmq.Socket | None = sock
        self.sent = 0
        self.dropped = 0  # sends refused (no daemon connected, or its queue full)
        self.bad_frames = 0  # frames that did not decode
        self.welcomed = False
        self.last_rx: float | None = None  # time of the newest message from the daemon
        self.first_tx_since_rx: float | None = None  # oldest send not yet answered by anything

    # ------------------------------------------------------------------ I/O

    def send(self, msg: protocol.Message, now: float) -> bool:
        """Queue ``msg`` without blocking; False (and counted) when it was dropped."""
        sock = self._sock
        if sock is None:
            return False
        # A refused send counts as unanswered too: once a dead daemon's peer is gone
        # (IMMEDIATE=1) every send is refused, and that silence must still time out.
        # Sooner after a message than KEEPALIVE_S, the daemon need not answer.
        rx = self.last_rx
        if self.first_tx_since_rx is None and (rx is None or now - rx >= protocol.KEEPALIVE_S):
            self.first_tx_since_rx = now
        try:
            sock.send(protocol.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        except zmq.ZMQError as exc:
            self.dropped += 1
            log.debug("send to %s failed: %s", self.endpoint, exc)
            return False
        self.sent += 1
        return True

    def receive(self, now: float) -> list[protocol.DaemonMessage]:
        """All messages waiting now (never blocks)."""
        sock = self._sock
        out: list[protocol.DaemonMessage] = []
        if sock is None:
            return out
        while sock.poll(0, zmq.POLLIN):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError as exc:
                log.debug("receive from %s failed: %s", self.endpoint, exc)
                break
            self.last_rx = now
            self.first_tx_since_rx = None
            # A single frame; tolerate an empty delimiter frame in front of it.
            try:
                msg = protocol.decode_daemon(frames[-1])
            except protocol.ProtocolError as exc:
                self.bad_frames += 1
                if self.bad_frames == 1:
                    log.warning("dropping a bad message from the daemon (%s): %s", exc.code, exc)
                continue
            if isinstance(msg, protocol.Welcome):
                self.welcomed = True
            out.append(msg)
        return out

    def poll(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a message to arrive (without reading it); True
        when one is waiting. For start-up and the rare waits of the training thread (a
        step held for a daemon's decision), never on the per-step path."""
        sock = self._sock
        if sock is None:
            return False
        try:
            return bool(sock.poll(max(0, int(timeout_s * 1000)), zmq.POLLIN))
        except zmq.ZMQError:
            return False

    # ------------------------------------------------------------------ liveness

    def alive(self, now: float) -> bool:
        """Welcomed, and not silent for ``timeout_s`` since an unanswered send."""
        if not self.welcomed:
            return False
        pending = self.first_tx_since_rx
        return pending is None or now - pending < self.timeout_s

    def forget(self) -> None:
        """The daemon is considered gone: require a new Welcome before trusting it."""
        self.welcomed = False
        self.first_tx_since_rx = None

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; messages already queued (a Goodbye) go out first, for at
        most ``linger_ms``. Blocks until they have (or the time is up): with
        ``IMMEDIATE`` nothing is queued while no daemon is connected, so without one
        this returns at once."""
        if self._sock is not None:
            self._sock.close(linger_ms)
            self._sock = None
            self._context.term()

    @property
    def closed(self) -> bool:
        return self._sock is None
