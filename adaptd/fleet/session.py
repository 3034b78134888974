"""One daemon's connection to etcd: the only module that talks to it.

Built on ``etcd3gw`` (etcd's v3 JSON gateway over HTTP(S); its ``/version`` probe picks
``/v3/`` on etcd ≥ 3.4 and ``/v3beta/`` on 3.3). What this module adds:

- **Every call is bounded.** Each HTTP request has ``call_timeout_s`` (connect and
  read); a call tries the configured endpoints in turn, but never past
  ``call_deadline_s`` in all. etcd down, slow (a stopped process), partitioned or
  without a leader becomes :class:`FleetUnavailable`, which callers catch to decide
  locally; it never hangs the caller.
- **One lease per session.** :meth:`EtcdSession.open` grants it, :meth:`keepalive`
  renews it (call it every ``lease_ttl_s / 3``); keys put with ``leased=True`` vanish
  when the daemon stops renewing (crash, SIGKILL, partition), so nothing is cleaned
  up by hand. A lease that expired (etcd unreachable for longer than its TTL) raises
  :class:`LeaseLost`: open a new session, which registers afresh.
- **Authentication.** With a user and password the session asks etcd for a token
  (``/v3/auth/authenticate``) and sends it on every request, asking again when etcd
  says it expired. A refused password or a key outside the user's role raises
  :class:`FleetAuthError` (a configuration problem, not an outage).
- **TLS** with a CA file and, optionally, a client certificate and key.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from adaptd.fleet.keys import DEFAULT_PREFIX, KeySpace, range_end
from adaptd.logfmt import logfmt

log = logging.getLogger("adaptd.fleet")

#: gRPC status codes etcd returns through the gateway (the JSON error's ``code``).
_UNAUTHENTICATED = 16
_PERMISSION_DENIED = 7
_TRANSIENT_CODES = frozenset({4, 10, 14})  # deadline exceeded, aborted, unavailable
#: etcd's words when it wants credentials it did not get (code 3, invalid argument).
_AUTH_TEXT = ("authentication failed", "user name is empty", "user name not found")
_TRANSIENT_TEXT = ("leader changed", "no leader", "request timed out", "too many requests")


class FleetError(Exception):
    """Something went wrong talking to etcd; the message says what."""


class FleetUnavailable(FleetError):
    """etcd did not answer in time (down, slow, partitioned, no leader): decide locally."""


class FleetAuthError(FleetError):
    """etcd refused the credentials or a key: fix ``[fleet] user``/``password`` or the role."""


class LeaseLost(FleetError):
    """The session's lease expired (etcd was out of reach longer than its TTL), so its
    leased keys are gone: open a new session."""


#: A lease's time to live by default, and the range allowed: a dead daemon's slots are
#: free again within it.
LEASE_TTL_S = 10
LEASE_TTL_RANGE_S = (2, 3600)
#: One etcd request's timeout by default; a call over all endpoints gives up after
#: :func:`call_deadline` of it.
CALL_TIMEOUT_S = 1.0


def call_deadline(call_timeout_s: float) -> float:
    """How long a call may take over all endpoints: 2.5 requests' timeouts, at least 2.5 s."""
    return max(2.5, 2.5 * call_timeout_s)


class FleetSettingError(ValueError):
    """A :class:`FleetSettings` value that cannot work; ``key`` names the ``[fleet]`` key
    at fault and ``reason`` says why (the message is ``"fleet: " + reason``)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"fleet: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class FleetSettings:
    """How to reach etcd and who this daemon is there (the config's ``[fleet]``, whose
    keys :mod:`adaptd.config.schema` declares). Raises :class:`FleetSettingError`."""

    endpoints: tuple[str, ...]
    host: str
    prefix: str = DEFAULT_PREFIX
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    lease_ttl_s: int = LEASE_TTL_S
    call_timeout_s: float = CALL_TIMEOUT_S
    call_deadline_s: float = call_deadline(CALL_TIMEOUT_S)

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise FleetSettingError(
                "etcd", "give at least one etcd endpoint, e.g. http://127.0.0.1:2379"
            )
        for url in self.endpoints:
            parts = urlsplit(url)
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.path
                not in (
                    "",
                    "/",
                )
            ):
                raise FleetSettingError(
                    "etcd",
                    f"etcd endpoint {url!r} must look like http://HOST:PORT or https://HOST:PORT",
                )
        for key, check in (("prefix", KeySpace), ("host", KeySpace.check_host)):
            try:
                check(getattr(self, key))
            except ValueError as exc:
                raise FleetSettingError(key, str(exc)) from None
        if (self.user is None) != (self.password is None):
            raise FleetSettingError("user", "user and password go together; set both or neither")
        if (self.cert_file is None) != (self.key_file is None):
            raise FleetSettingError(
                "cert_file", "cert_file and key_file go together; set both or neither"
            )
        low, high = LEASE_TTL_RANGE_S
        if not low <= self.lease_ttl_s <= high:
            raise FleetSettingError(
                "lease_ttl_s", f"lease_ttl_s must be {low}-{high} seconds, got {self.lease_ttl_s}"
            )
        if not 0 < self.call_timeout_s <= self.call_deadline_s:
            raise FleetSettingError(
                "call_timeout_s",
                f"call_timeout_s ({self.call_timeout_s}) must be > 0 and at most "
                f"call_deadline_s ({self.call_deadline_s})",
            )

    @property
    def keys(self) -> KeySpace:
        return KeySpace(self.prefix)


@dataclass(frozen=True, slots=True)
class Mark:
    """How many keys a prefix holds and the newest one's create revision: a key that
    came, went or was put anew (a daemon restarted) changes it, so a reader re-reads the
    keys only then (issue 35: every daemon reading every member every round was O(N²))."""

    count: int = 0
    newest: int = 0

    @staticmethod
    def of(entries: Sequence[Entry]) -> Mark:
        return Mark(len(entries), max((e.create_revision for e in entries), default=0))


@dataclass(frozen=True, slots=True)
class WatchOutcome:
    """What :meth:`EtcdSession.watch_deletes` saw: the keys deleted (in order), the
    revision to watch on from (the newest deletion's), and ``resync`` when etcd could
    not replay from the revision asked (compacted): read everything again."""

    deleted: Sequence[str]
    revision: int
    resync: bool = False


@dataclass(frozen=True, slots=True)
class Put:
    """One write of :meth:`EtcdSession.put_all_if`."""

    key: str
    value: bytes
    leased: bool


@dataclass(frozen=True, slots=True)
class Guard:
    """One condition of :meth:`EtcdSession.put_all_if` (an etcd transaction compare).

    Build it with :meth:`range_since`, :meth:`key_at`, :meth:`created_at` or
    :meth:`none_created_since`."""

    key: str
    prefix: bool
    target: str  # "MOD" or "CREATE"
    result: str  # "LESS" or "EQUAL"
    revision: int

    @staticmethod
    def range_since(prefix: str, seen_revision: int) -> Guard:
        """No key under ``prefix`` was created or modified after ``seen_revision``."""
        return Guard(prefix, True, "MOD", "LESS", seen_revision + 1)

    @staticmethod
    def key_at(key: str, mod_revision: int) -> Guard:
        """``key`` was last written at ``mod_revision`` (0: it does not exist)."""
        return Guard(key, False, "MOD", "EQUAL", mod_revision)

    @staticmethod
    def created_at(key: str, create_revision: int) -> Guard:
        """``key`` exists, created at ``create_revision`` (not deleted and made again)."""
        return Guard(key, False, "CREATE", "EQUAL", create_revision)

    @staticmethod
    def none_created_since(prefix: str, newest_create: int) -> Guard:
        """No key under ``prefix`` was created after ``newest_create``."""
        return Guard(prefix, True, "CREATE", "LESS", newest_create + 1)

    def compare(self) -> dict[str, Any]:
        field_name = "mod_revision" if self.target == "MOD" else "create_revision"
        out: dict[str, Any] = {
            "key": _b64(self.key),
            "target": self.target,
            "result": self.result,
            field_name: self.revision,
        }
        if self.prefix:
            out["range_end"] = _b64(range_end(self.key))
        return out


#: How many revisions a session remembers when it first heard of (:class:`HeardAt`).
REVISIONS_KEPT = 4096


class HeardAt:
    """When this session first heard of each revision of etcd, on its own clock.

    Every answer carries etcd's revision (the header's, or a watched event's); the first
    answer at or past revision ``r`` says that anything etcd stored by ``r`` existed by
    the time it came. So a key's create revision dates it on this daemon's clock to
    within the gap between two of its calls, however long ago it first read the key
    (:meth:`dated`). That is what lets a daemon date another host's claim without
    trusting that host's clock and without re-reading the queue to see it early
    (issue 35: each waiter's read of the whole queue every 10 s, N²/10 claims a second
    in a storm on one target, was the limit at 500 hosts).

    Keeps the newest :data:`REVISIONS_KEPT` revisions it heard of (one per call that
    moved etcd on, about an hour at a call a second); a revision older than those is
    dated by the oldest kept (it existed by then, at least).
    """

    def __init__(self, keep: int = REVISIONS_KEPT) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._keep = keep
        self._revisions: list[int] = []
        self._times: list[float] = []

    def heard(self, revision: int, at: float) -> None:
        """An answer said etcd was at ``revision`` when it came, at ``at``."""
        if self._revisions and revision <= self._revisions[-1]:
            return
        self._revisions.append(revision)
        self._times.append(at)
        if len(self._revisions) > 2 * self._keep:
            del self._revisions[: -self._keep], self._times[: -self._keep]

    def dated(self, revision: int) -> float | None:
        """When this session first heard of ``revision`` or a later one (what etcd
        stored at ``revision`` existed by then), or ``None`` if it has not yet."""
        i = bisect.bisect_left(self._revisions, revision)
        return self._times[i] if i < len(self._times) else None


@dataclass(frozen=True, slots=True)
class Entry:
    """One key as etcd returned it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


def _error_of(exc: Exception) -> tuple[int | None, str]:
    """(gRPC code, message) from an etcd3gw exception's response text."""
    text = str(getattr(exc, "detail_text", None) or (exc.args[0] if exc.args else exc))
    try:
        body = json.loads(text)
    except ValueError:
        return None, text.strip()[:300]
    if not isinstance(body, dict):
        return None, text.strip()[:300]
    code = body.get("code")
    return (int(code) if isinstance(code, int | str) and str(code).isdigit() else None), str(
        body.get("message") or body.get("error") or text
    )[:300]


class EtcdSession:
    """A leased session on one etcd cluster. Not thread-safe: one thread uses it.

    ``client_factory`` builds an ``etcd3gw.Etcd3Client`` for an endpoint URL (the
    default does; tests never replace it, it exists so the import stays lazy).
    """

    def __init__(
        self,
        settings: FleetSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        client_factory: Callable[[str, FleetSettings], Any] | None = None,
    ) -> None:
        self.settings = settings
        self.keys = settings.keys
        self.clock = clock
        self._factory = client_factory or _etcd3gw_client
        self._clients: list[Any] = []
        self._current = 0
        self._token: str | None = None
        self.lease_id: int | None = None
        #: revision of the newest answer (etcd's header)
        self.revision = 0
        #: when this session first heard of each revision (dates keys by theirs)
        self.heard_at = HeardAt()
        self._waiting = False
        self._watch: Any = None  # the watch response being read, for interrupt_wait

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> EtcdSession:
        """Connect (authenticating if configured) and grant the session's lease.

        Raises :class:`FleetUnavailable` or :class:`FleetAuthError`.
        """
        if not self._clients:
            self._clients = [self._factory(url, self.settings) for url in self.settings.endpoints]
        if self.settings.user is not None:
            self._authenticate()
        out = self._call("lease/grant", {"TTL": self.settings.lease_ttl_s, "ID": 0})
        self.lease_id = int(out["ID"])
        return self

    def keepalive(self) -> int:
        """Renew the lease; returns its TTL. Raises :class:`LeaseLost` once it expired."""
        if self.lease_id is None:
            raise LeaseLost("the session has no lease; open it first")
        out = self._call("lease/keepalive", {"ID": self.lease_id})
        ttl = int(out.get("result", {}).get("TTL", -1))
        if ttl <= 0:
            lost, self.lease_id = self.lease_id, None
            raise LeaseLost(f"lease {lost:x} expired: etcd was out of reach longer than its TTL")
        return ttl

    def close(self) -> None:
        """Revoke the lease (its keys vanish at once), bounded; never raises."""
        lease, self.lease_id = self.lease_id, None
        if lease is not None:
            try:
                self._call("kv/lease/revoke", {"ID": lease})
            except FleetError as exc:
                log.info(
                    logfmt(
                        "fleet_revoke_failed",
                        lease=f"{lease:x}",
                        error=str(exc),
                        hint="it expires by itself",
                    )
                )
        for client in self._clients:
            client.session.close()
        self._clients = []

    # ------------------------------------------------------------------ key-value

    def get_prefix(self, prefix: str, *, min_mod_revision: int = 0) -> list[Entry]:
        """Every key under ``prefix`` (sorted by key), or only those changed at or after
        ``min_mod_revision``; sets :attr:`revision`."""
        body: dict[str, Any] = {"key": _b64(prefix), "range_end": _b64(range_end(prefix))}
        if min_mod_revision > 0:
            body["min_mod_revision"] = min_mod_revision
        out = self._call("kv/range", body)
        return [_entry(kv) for kv in out.get("kvs", ())]

    def put(self, key: str, value: bytes, *, leased: bool) -> None:
        """Write ``key``; with ``leased`` it lives only as long as the session's lease."""
        self._call("kv/put", self._put(key, value, leased))

    def delete(self, key: str) -> bool:
        """Delete ``key``; True when it existed."""
        out = self._call("kv/deleterange", {"key": _b64(key)})
        return int(out.get("deleted", 0)) > 0

    def put_if_unchanged(
        self, key: str, value: bytes, *, leased: bool, watched: str, seen_revision: int
    ) -> bool:
        """Compare-and-swap over a range: write ``key`` only if no key under ``watched``
        was created or modified after ``seen_revision`` (the newest ``mod_revision`` the
        caller read there; 0 when it was empty). False: someone else moved first, re-read
        and decide again. Deletions under ``watched`` do not count (they only free room).
        """
        return self.put_all_if(
            [Put(key, value, leased)], [Guard.range_since(watched, seen_revision)]
        )

    def put_all_if(self, puts: Sequence[Put], guards: Sequence[Guard]) -> bool:
        """Write every one of ``puts`` in one transaction if every one of ``guards``
        holds; False (nothing written) when one does not: someone moved first."""
        txn = {
            "compare": [g.compare() for g in guards],
            "success": [{"request_put": self._put(p.key, p.value, p.leased)} for p in puts],
            "failure": [],
        }
        return bool(self._call("kv/txn", txn).get("succeeded", False))

    def delete_all_if(self, keys: Sequence[str], guards: Sequence[Guard]) -> bool:
        """Delete every one of ``keys`` in one transaction if every one of ``guards``
        holds; False (nothing deleted) when one does not."""
        txn = {
            "compare": [g.compare() for g in guards],
            "success": [{"request_delete_range": {"key": _b64(k)}} for k in keys],
            "failure": [],
        }
        return bool(self._call("kv/txn", txn).get("succeeded", False))

    def mark(self, prefix: str) -> Mark:
        """:class:`Mark` of the keys under ``prefix``: etcd counts them and sends the
        newest one's key alone, not the keys."""
        return _mark(self._call("kv/range", _mark_request(prefix)))

    def get_prefixes_marking(
        self, prefixes: Sequence[str], marked: str | None
    ) -> tuple[list[list[Entry]], Mark | None]:
        """Every key under each of ``prefixes``, and the :class:`Mark` of those under
        ``marked`` (if given), in one request at one revision; sets :attr:`revision`."""
        ranges = [
            {"request_range": {"key": _b64(p), "range_end": _b64(range_end(p))}} for p in prefixes
        ]
        if marked is not None:
            ranges.append({"request_range": _mark_request(marked)})
        out = self._call("kv/txn", {"compare": [], "success": ranges, "failure": []})
        got = out.get("responses", [])
        got = [*got, *({} for _ in range(len(ranges) - len(got)))]
        lists = [
            [_entry(kv) for kv in r.get("response_range", {}).get("kvs", ())]
            for r in got[: len(prefixes)]
        ]
        mark = _mark(got[-1].get("response_range", {})) if marked is not None else None
        return lists, mark

    def watch_deletes(
        self,
        prefix: str,
        timeout_s: float,
        *,
        start_revision: int,
        enough: Callable[[Sequence[str]], bool],
    ) -> WatchOutcome:
        """Watch the deletions under ``prefix`` from ``start_revision`` (an etcd watch
        that filters out puts, long-polled) for up to ``timeout_s``, until ``enough`` of
        the keys deleted so far says so. A waiter far back in a queue thus sleeps
        through the releases that cannot make it eligible instead of re-reading the
        queue at each (issue 35). Bounded like every call; raises
        :class:`FleetUnavailable` when etcd does not answer at all."""
        import requests

        if not self._clients:
            raise FleetUnavailable("the fleet session is closed")
        client = self._clients[self._current]
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(range_end(prefix)),
                "start_revision": start_revision,
                "filters": ["NOPUT"],
            }
        }
        deleted: list[str] = []
        revision = start_revision - 1
        self._waiting = True
        try:
            resp = client.session.post(
                client.get_url("watch"),
                json=body,
                stream=True,
                timeout=(self.settings.call_timeout_s, timeout_s),
            )
        except requests.Timeout:
            self._waiting = False
            return WatchOutcome(deleted, revision)  # connected, nothing said in time
        except requests.RequestException as exc:
            self._waiting = False
            raise FleetUnavailable(f"etcd watch on {prefix}: {exc!r}"[:300]) from None
        self._watch = resp
        if not self._waiting:  # interrupted before the stream was there
            resp.close()
        try:
            if resp.status_code != 200:
                return WatchOutcome(deleted, revision, resync=True)
            deadline = self.clock() + timeout_s
            for line in resp.iter_lines(chunk_size=None):
                if line.strip():
                    result = json.loads(line).get("result", {})
                    if result.get("canceled") or int(result.get("compact_revision", 0) or 0):
                        return WatchOutcome(deleted, revision, resync=True)  # compacted
                    for event in result.get("events", ()):
                        kv = event.get("kv", {})
                        deleted.append(base64.b64decode(kv.get("key", "")).decode())
                        revision = max(revision, int(kv.get("mod_revision", 0)))
                    if revision >= start_revision:
                        self.heard_at.heard(revision, self.clock())
                    if deleted and enough(deleted):
                        return WatchOutcome(deleted, revision)
                if self.clock() >= deadline:
                    break
            return WatchOutcome(deleted, revision)
        except (requests.RequestException, ValueError, AttributeError, OSError):
            return WatchOutcome(deleted, revision)  # timed out (no change), interrupted, broke
        finally:
            self._waiting = False
            self._watch = None
            resp.close()

    @property
    def waiting(self) -> bool:
        """True while :meth:`watch_deletes` reads its watch stream."""
        return self._watch is not None

    def interrupt_wait(self) -> None:
        """End a :meth:`watch_deletes` in progress (from another thread): the only
        method that may be called concurrently."""
        self._waiting = False
        resp = self._watch
        if resp is not None:
            with contextlib.suppress(Exception):
                # shutdown, not close: it wakes a thread blocked reading the socket
                fd = resp.raw._fp.fileno()
                with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.shutdown(socket.SHUT_RDWR)

    def _put(self, key: str, value: bytes, leased: bool) -> dict[str, Any]:
        payload: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if leased:
            if self.lease_id is None:
                raise LeaseLost("the session has no lease; open it again")
            payload["lease"] = self.lease_id
        return payload

    # ------------------------------------------------------------------ transport

    def _authenticate(self) -> None:
        for client in self._clients:
            client.session.headers.pop("Authorization", None)
        out = self._call(
            "auth/authenticate",
            {"name": self.settings.user, "password": self.settings.password},
            reauth=False,
        )
        self._token = str(out["token"])
        for client in self._clients:
            client.session.headers["Authorization"] = self._token

    def _call(self, path: str, payload: dict[str, Any], *, reauth: bool = True) -> dict[str, Any]:
        """POST ``payload`` to ``/v3/<path>`` on the first endpoint that answers in time."""
        import requests
        from etcd3gw import exceptions as gw

        if not self._clients:
            raise FleetUnavailable("the fleet session is closed")
        start = self.clock()
        errors: list[str] = []
        for i in range(len(self._clients)):
            if i and self.clock() - start >= self.settings.call_deadline_s:
                break
            index = (self._current + i) % len(self._clients)
            client = self._clients[index]
            try:
                out = client.post(client.get_url(path), json=payload)
            except (gw.ConnectionFailedError, gw.ConnectionTimeoutError) as exc:
                errors.append(f"{self.settings.endpoints[index]}: {type(exc).__name__}{_tls(exc)}")
                continue
            except (requests.RequestException, ValueError) as exc:  # a reply cut short or garbled
                errors.append(f"{self.settings.endpoints[index]}: {exc!r}"[:200])
                continue
            except gw.Etcd3Exception as exc:
                code, message = _error_of(exc)
                if code == _UNAUTHENTICATED and reauth and self.settings.user is not None:
                    self._authenticate()  # the token expired (etcd's --auth-token-ttl)
                    return self._call(path, payload, reauth=False)
                refused = code in (_UNAUTHENTICATED, _PERMISSION_DENIED)
                if refused or any(t in message for t in _AUTH_TEXT):
                    raise FleetAuthError(
                        f"etcd refused {path} for user {self.settings.user!r}: {message}; check "
                        "[fleet] user/password and that the user's role covers this host's keys "
                        "(docs/fleet.md)"
                    ) from None
                if code in _TRANSIENT_CODES or any(t in message for t in _TRANSIENT_TEXT):
                    errors.append(f"{self.settings.endpoints[index]}: {message}")
                    continue
                raise FleetError(f"etcd {path}: {message}") from None
            self._current = index
            header = out.get("header") if isinstance(out, dict) else None
            if header and "revision" in header:
                self.revision = max(self.revision, int(header["revision"]))
                self.heard_at.heard(self.revision, self.clock())
            return out
        raise FleetUnavailable(
            f"etcd did not answer {path} within {self.settings.call_deadline_s:g}s: "
            + "; ".join(errors or ["no endpoint tried"])
        )


def _tls(exc: Exception) -> str:
    """What to fix when a connection failed on TLS (etcd3gw keeps requests' words)."""
    text = str(getattr(exc, "detail_text", "") or exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return " (TLS: etcd's certificate is not signed by [fleet] ca_file, or ca_file is unset)"
    if "BAD_CERTIFICATE" in text or "CERTIFICATE_REQUIRED" in text:
        return (
            " (TLS: etcd refused this client: set [fleet] cert_file and key_file to a "
            "certificate its --trusted-ca-file signed)"
        )
    return ""


def _etcd3gw_client(url: str, settings: FleetSettings) -> Any:
    import etcd3gw

    parts = urlsplit(url)
    return etcd3gw.Etcd3Client(
        host=parts.hostname or "localhost",
        port=parts.port or (443 if parts.scheme == "https" else 2379),
        protocol=parts.scheme,
        timeout=settings.call_timeout_s,
        session=_tls_session(settings),
    )


def _tls_session(settings: FleetSettings) -> Any:
    """A ``requests`` session that verifies etcd with ``ca_file`` and shows
    ``cert_file``/``key_file``. ``requests`` lets ``$REQUESTS_CA_BUNDLE`` (or
    ``$CURL_CA_BUNDLE``), set on many hosts to the system's bundle, override a
    session's CA, and the system's bundle does not hold a private etcd CA: every call
    then failed certificate verification (found by tests/fleet/test_fleet_matrix.py's
    TLS cell). The configured CA wins here; without one, ``requests`` decides as usual."""
    import requests

    class Session(requests.Session):
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            out = super().merge_environment_settings(*args, **kwargs)
            if settings.ca_file is not None:
                out["verify"] = settings.ca_file
            return out

    session = Session()
    if settings.ca_file is not None:
        session.verify = settings.ca_file
    if settings.cert_file is not None and settings.key_file is not None:
        session.cert = (settings.cert_file, settings.key_file)
    return session


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


def _entry(kv: dict[str, Any]) -> Entry:
    return Entry(
        key=base64.b64decode(kv["key"]).decode(),
        value=base64.b64decode(kv.get("value", "")),
        create_revision=int(kv.get("create_revision", 0)),
        mod_revision=int(kv.get("mod_revision", 0)),
        lease=int(kv.get("lease", 0)),
    )


def _mark_request(prefix: str) -> dict[str, Any]:
    return {
        "key": _b64(prefix),
        "range_end": _b64(range_end(prefix)),
        "limit": 1,
        "sort_order": "DESCEND",
        "sort_target": "CREATE",
        "keys_only": True,
    }


def _mark(out: dict[str, Any]) -> Mark:
    """The :class:`Mark` from a range answer of :func:`_mark_request` (its ``count`` is
    every key's, whatever the limit)."""
    kvs = out.get("kvs", ())
    return Mark(int(out.get("count", 0)), int(kvs[0].get("create_revision", 0)) if kvs else 0)


def newest_revision(entries: Sequence[Entry]) -> int:
    """The newest ``mod_revision`` among ``entries`` (0 for none): what a
    :meth:`EtcdSession.put_if_unchanged` after reading them compares against."""
    return max((e.mod_revision for e in entries), default=0)
