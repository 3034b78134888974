"""Operator requests that cross hosts in-band carry the signature of the daemon they
were typed at.

An operator's ``set-policy``, ``pause`` or ``resume`` typed on a host that does not
decide a multi-host job goes to the job's local rank (:class:`~adaptd.protocol.job.Relay`),
in-band to the chief, and from the chief to the deciding daemon
(:class:`~adaptd.protocol.job.Request`). The job's own processes carry it, so they could
also make one up: before this, a rank could send ``Request(op="set_policy")`` and
override what the operator set for its job (or resume saves an operator paused),
which only an admin socket may do. So these operations are signed: every host's
daemon holds the same secret (``daemon.relay_key_file``, readable by the daemon's
user only, like munge's key), the daemon the operator typed at signs the request
(HMAC-SHA256 over the job, operation, spec, reason, origin, the time and a nonce),
and the deciding daemon takes it only with a valid signature, issued within
:data:`MAX_AGE_S` of its own clock, and only once (a replayed request is refused).

``save_now`` needs no signature: a job can ask for a save of its own anyway
(``request_save()``). Without a key, relaying the other operations is refused where
they are typed, with what to do (run it on the deciding host, or configure the key).
Which operations are signed is each operator command's entry (``signed``) in the
daemon's table, :data:`adaptd.daemon.admin.commands.OPERATOR_COMMANDS`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["MAX_AGE_S", "RelayKey"]

#: A signed request is taken within this many seconds of when it was signed (either
#: way: the hosts' clocks may differ by up to this much).
MAX_AGE_S = 300.0
#: Shortest secret accepted (bytes).
MIN_KEY_BYTES = 16
#: Nonces remembered at most (a replay within :data:`MAX_AGE_S` is refused).
MAX_NONCES = 100_000


class RelayKey:
    """The fleet's shared secret: signs relayed requests here, checks them there.

    Args:
        secret: the key's bytes (at least :data:`MIN_KEY_BYTES`).
        wall: the wall clock (signatures carry the time they were made).
    """

    def __init__(self, secret: bytes, *, wall: Callable[[], float] = time.time) -> None:
        if len(secret) < MIN_KEY_BYTES:
            raise ValueError(
                f"the relay key has {len(secret)} bytes; it needs at least {MIN_KEY_BYTES} "
                "(e.g. head -c 32 /dev/urandom > /etc/adaptd/relay.key)"
            )
        self._secret = secret
        self.wall = wall
        self._seen: dict[str, float] = {}  # nonce -> when it stops mattering

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RelayKey:
        """The key in file ``path``; raises :class:`ValueError` (unreadable, too short,
        or readable by others than its owner and group)."""
        p = Path(path)
        try:
            mode = p.stat().st_mode
            secret = p.read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"cannot read the relay key {str(p)!r}: {exc.strerror}") from None
        if mode & stat.S_IROTH:
            raise ValueError(
                f"the relay key {str(p)!r} is readable by every user (mode {stat.S_IMODE(mode):o}):"
                " chmod 0600 it (or 0640 for the daemon's group)"
            )
        return cls(secret)

    def sign(self, job: str, op: str, spec: str, reason: str, origin: str) -> str:
        """The ``auth`` field of a Relay of these fields: ``v1:TIME_MS:NONCE:MAC``."""
        issued = str(int(self.wall() * 1000))
        nonce = secrets.token_hex(8)
        return f"v1:{issued}:{nonce}:{self._mac(job, op, spec, reason, origin, issued, nonce)}"

    def check(self, job: str, op: str, spec: str, reason: str, origin: str, auth: str) -> str:
        """Why a Request with these fields is refused, or ``""`` when its ``auth`` is a
        valid, fresh signature not seen before (it is then remembered)."""
        parts = auth.split(":")
        if len(parts) != 4 or parts[0] != "v1" or not parts[1].isdigit():
            return "it is not signed by an adaptd daemon (no valid auth field)"
        _, issued, nonce, mac = parts
        good = self._mac(job, op, spec, reason, origin, issued, nonce)
        if not hmac.compare_digest(mac, good):
            return "its signature does not match (another relay key, or the request was changed)"
        now = self.wall()
        age = now - int(issued) / 1000
        if abs(age) > MAX_AGE_S:
            return (
                f"it was signed {age:.0f}s from now, beyond {MAX_AGE_S:.0f}s (a replay, or "
                "the hosts' clocks differ that much)"
            )
        self._forget(now)
        if nonce in self._seen:
            return "it was taken before (a replay)"
        self._seen[nonce] = now + 2 * MAX_AGE_S
        return ""

    def _mac(self, *fields: str) -> str:
        text = "\0".join(fields).encode()
        return hmac.new(self._secret, text, hashlib.sha256).hexdigest()

    def _forget(self, now: float) -> None:
        if len(self._seen) >= MAX_NONCES:
            self._seen = {n: t for n, t in self._seen.items() if t > now}
            while len(self._seen) >= MAX_NONCES:  # a flood of fresh ones: drop the oldest
                self._seen.pop(next(iter(self._seen)))
