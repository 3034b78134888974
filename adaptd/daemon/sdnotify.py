"""The sd_notify protocol, spoken directly (no libsystemd, no extra package).

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``: an AF_UNIX datagram socket
(a path, or an abstract name written with a leading ``@``). The daemon sends
newline-separated ``KEY=VALUE`` assignments to it: ``READY=1`` once it serves,
``STATUS=...`` for ``systemctl status``, ``WATCHDOG=1`` from its main loop when
``WatchdogSec=`` is set, ``STOPPING=1`` when it begins to shut down and
``EXTEND_TIMEOUT_USEC=`` while a drain runs past the stop timeout.

Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op that returns
``False``, so the daemon calls these unconditionally. A send that fails (systemd
gone, socket full) is logged once and never raises: notification is advisory and
must not take the daemon down.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

__all__ = [
    "Notifier",
]

log = logging.getLogger(__name__)


class Notifier:
    """A handle on ``$NOTIFY_SOCKET`` (read once, at construction).

    ``env`` defaults to :data:`os.environ`; ``pid`` to this process (a watchdog
    request addressed by ``$WATCHDOG_PID`` to another process is ignored, as
    sd_watchdog_enabled does).
    """

    def __init__(self, env: Mapping[str, str] | None = None, *, pid: int | None = None) -> None:
        env = os.environ if env is None else env
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        self._pid = os.getpid() if pid is None else pid
        self.watchdog_interval_s = _watchdog_interval(env, self._pid)
        self._sock: socket.socket | None = None
        self._warned = False
        self._last_watchdog: float | None = None

    @property
    def enabled(self) -> bool:
        """True when running under a service manager that listens."""
        return self._address is not None

    # ---------------------------------------------------------------- messages

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` lines (``notify(READY=1, STATUS="serving")``).

        Returns True when the datagram was sent, False when disabled or on error.
        """
        if self._address is None:
            return False
        lines = []
        for key, value in fields.items():
            text = str(value)
            if "\n" in text:  # one assignment per line: a newline would inject another
                text = text.replace("\n", " ")
            lines.append(f"{key}={text}")
        return self._send("\n".join(lines).encode())

    def ready(self, status: str | None = None) -> bool:
        """``READY=1``: the socket is bound and telemetry probed; systemd may start dependants."""
        fields: dict[str, str | int] = {"READY": 1}
        if status:
            fields["STATUS"] = status
        return self.notify(**fields)

    def status(self, text: str) -> bool:
        """``STATUS=text``: one line shown by ``systemctl status``."""
        return self.notify(STATUS=text)

    def watchdog(self, now: float | None = None) -> bool:
        """``WATCHDOG=1``: the main loop is alive. ``now`` (monotonic) records when."""
        self._last_watchdog = now
        return self.notify(WATCHDOG=1)

    def watchdog_due(self, now: float) -> bool:
        """True when a keep-alive should go out: half the watchdog interval has passed.

        Always False when systemd set no watchdog for this process.
        """
        if self.watchdog_interval_s is None or self._address is None:
            return False
        last = self._last_watchdog
        return last is None or now - last >= self.watchdog_interval_s / 2

    def tick(self, now: float) -> bool:
        """Call from every loop iteration: pings the watchdog when it is due."""
        return self.watchdog(now) if self.watchdog_due(now) else False

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: shutdown began (e.g. the SIGTERM drain)."""
        fields: dict[str, str | int] = {"STOPPING": 1}
        if status:
            fields["STATUS"] = status
        return self.notify(**fields)

    def extend_timeout(self, seconds: float) -> bool:
        """``EXTEND_TIMEOUT_USEC``: ask for ``seconds`` more before systemd kills us.

        The drain on SIGTERM sends this so a long save is not cut off by
        ``TimeoutStopSec=`` while it is still within the configured grace period.
        """
        return self.notify(EXTEND_TIMEOUT_USEC=max(0, int(seconds * 1_000_000)))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # ---------------------------------------------------------------- internals

    def _send(self, payload: bytes) -> bool:
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)  # a full socket must not stall the loop
            self._sock.sendto(payload, self._address)  # type: ignore[arg-type]
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "sd_notify to %r failed (%s); continuing without it", self._address, exc
                )
            return False


def _address(raw: str) -> str | bytes | None:
    """``$NOTIFY_SOCKET`` as a sendto address: ``@name`` is Linux's abstract namespace."""
    if not raw:
        return None
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    # systemd also allows vsock:CID:PORT (VMs); this daemon runs on the host, so
    # such an address is ignored rather than misread as a relative path.
    log.warning("NOTIFY_SOCKET=%r is not a path or abstract socket; sd_notify disabled", raw)
    return None


def _watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """``$WATCHDOG_USEC`` in seconds, when it is addressed to ``pid``."""
    usec = env.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not an integer; watchdog disabled", usec)
        return None
    if value <= 0:
        return None
    owner = env.get("WATCHDOG_PID", "")
    if owner and owner.isdigit() and int(owner) != pid:
        return None
    return value / 1_000_000
