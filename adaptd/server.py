"""The daemon's loop: a ZeroMQ ROUTER for jobs, a ROUTER for operators, one thread.

:class:`Daemon` binds the job socket (``ipc://`` per :mod:`adaptd.paths`) and the
admin socket beside it, then runs one poll loop that

- validates every frame (:mod:`adaptd.protocol`); a bad one gets an
  :class:`~adaptd.protocol.Error` reply where a reply is possible and is counted
  by code, never raised;
- keeps jobs and ranks in a :class:`~adaptd.registry.Registry`;
- after every report asks the job's policy for a decision and pushes a new
  :class:`~adaptd.protocol.Plan` to all the job's ranks when the save steps change;
- re-sends the current plan to a rank that reports after 2 s without hearing
  from the daemon (the client's liveness signal);
- calls ``tick()`` about once a second: liveness checks, then the ``tick_hooks``
  (telemetry sampling, watchdog);
- answers the admin socket (:mod:`adaptd.admin`).

Seams for the parts that plug in later, all with harmless defaults:
``snapshot_source`` (the telemetry sampler's newest frozen snapshot), ``sinks``
(event subscribers: store, metrics, interval model; see :mod:`adaptd.events`) and
``tick_hooks``. None of them may block: the loop waits on nothing but its poller,
whose timeout is the next tick.

The daemon runs in the calling thread (:meth:`Daemon.serve`, used by ``adaptd
serve`` with signals wired to :meth:`Daemon.stop`) or in its own thread
(:meth:`Daemon.start`, for the demo and tests).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import logging
import os
import pwd
import socket as _socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from adaptd import __version__, admin, paths
from adaptd import events as ev
from adaptd import policy as policy_mod
from adaptd import protocol as p
from adaptd.registry import HelloRefused, Job, PeerCred, Rank, Registry, RegistryFull
from adaptd.snapshot import Decision, Snapshot

log = logging.getLogger("adaptd.server")

#: A rank that reports after this long without hearing from the daemon gets the plan again.
RESEND_AFTER_S = 2.0
#: A new decision whose interval and next save moved by at most this fraction of the
#: current interval keeps the current plan (see :func:`same_saves`).
REPLAN_TOLERANCE = 0.05
#: Liveness checks and tick hooks run this often.
TICK_INTERVAL_S = 1.0
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
#: Parsed policy specs kept (parsing reads entry-point metadata: do it once per spec).
POLICY_CACHE = 256


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


def logfmt(event: str, **fields: object) -> str:
    """One structured log line: ``event=plan job=a seq=2 reason="every 50 steps"``."""
    parts = [f"event={event}"]
    for key, value in fields.items():
        if value is None:
            text = "-"
        elif isinstance(value, float):
            text = f"{value:.6g}"
        else:
            text = str(value)
        if not text or any(c in text for c in ' "=\n'):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


def same_saves(old: Decision, new: Decision, step: int, tolerance: float = 0.0) -> bool:
    """True when a job following ``old`` saves at (nearly) the same steps as under ``new``.

    A grid policy re-deciding "next at 200, every 100" once step 100 is passed has
    the plan it already has; pushing it again would only be noise. Same grid and the
    same next save after ``step`` means the same saves from now on. With
    ``tolerance`` > 0, an interval and next save that both moved by at most that
    fraction of the old interval also count as the same: an optimal-interval policy
    re-fits its interval to every step-time report, and the waste curve is flat
    near its optimum (10 % off the interval costs well under 1 % more waste), so
    re-planning for it would churn plans once a second for nothing.
    """
    if old.same_plan(new):
        return True
    if old.urgent != new.urgent:
        return False
    old_next, new_next = old.due_after(step), new.due_after(step)
    if old.every_steps == new.every_steps and old_next == new_next:
        return True
    if tolerance <= 0 or not old.every_steps or not new.every_steps:
        return False
    if old_next is None or new_next is None:
        return False
    slack = tolerance * old.every_steps
    return abs(new.every_steps - old.every_steps) <= slack and abs(new_next - old_next) <= slack


@dataclass
class _DrainJob:
    """One job's part of a drain: which ranks still owe a durable save."""

    job: str
    ranks: int
    waiting: dict[int, int]  # rank -> its step at the request: a report of it or later counts
    step: int | None = None
    error: str = ""
    done_at: float | None = None


@dataclass
class _Drain:
    """A drain in progress: ``adaptd drain`` (``envelope`` set) or the shutdown drain."""

    envelope: list[bytes] | None
    reason: str
    started: float
    deadline: float
    jobs: dict[str, _DrainJob] = field(default_factory=dict)

    def done(self) -> bool:
        return all(j.done_at is not None for j in self.jobs.values())


def _snapshot_now() -> Snapshot:
    return Snapshot(time=time.monotonic())


class _Throttle:
    """Logs the first few occurrences of each key, then every 1000th."""

    def __init__(self, first: int = 5, every: int = 1000) -> None:
        self.first, self.every = first, every
        self.seen: Counter[str] = Counter()

    def __call__(self, key: str) -> bool:
        self.seen[key] += 1
        n = self.seen[key]
        return n <= self.first or n % self.every == 0


class Daemon:
    """The adaptd daemon. Construct, then :meth:`serve` (blocking) or :meth:`start` (thread).

    Raises :class:`DaemonError` from the constructor for a bad ``policy`` or
    socket, and from :meth:`open` when the socket is held by another live daemon
    or cannot be bound.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        policy: str = policy_mod.DEFAULT_SPEC,
        snapshot_source: Callable[[], Snapshot] = _snapshot_now,
        sinks: Iterable[ev.Sink] = (),
        tick_hooks: Iterable[Callable[[float], None]] = (),
        silence_timeout_s: float = 300.0,
        resend_after_s: float = RESEND_AFTER_S,
        tick_interval_s: float = TICK_INTERVAL_S,
        replan_tolerance: float = REPLAN_TOLERANCE,
        clock: Callable[[], float] = time.monotonic,
        registry: Registry | None = None,
        job_settings: Mapping[str, admin.JobSettings] | None = None,
        status_extra: Callable[[], dict[str, Any] | None] | None = None,
        config_settings: Callable[[str], admin.JobSettings | None] | None = None,
        curve: CurveKeys | None = None,
        admin_group: str | None = None,
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
        self.admin_path = admin.admin_path(self.socket_path)
        self.lock_path = self.socket_path.with_name(self.socket_path.name + ".lock")
        #: The admin socket answers root, the daemon's own user and this group only.
        self.admin_gid: int | None = None
        if admin_group:
            try:
                self.admin_gid = grp.getgrnam(admin_group).gr_gid
            except KeyError:
                raise DaemonError(
                    f"daemon.admin_group: no group {admin_group!r} on this host; create it "
                    "or remove the setting"
                ) from None
        for path in (self.socket_path, self.admin_path):
            if len(os.fsencode(path)) > MAX_IPC_PATH:
                raise DaemonError(
                    f"socket path {str(path)!r} is {len(os.fsencode(path))} bytes; ipc paths "
                    f"are limited to {MAX_IPC_PATH}: pass a shorter --socket"
                )
        try:
            self.default_policy = policy_mod.parse(policy)
        except policy_mod.PolicyError as exc:
            raise DaemonError(f"--policy {policy!r}: {exc}") from None
        self.default_spec = policy
        if not silence_timeout_s > 0:
            raise DaemonError(f"--silence-timeout must be > 0 seconds, got {silence_timeout_s}")
        self.snapshot_source = snapshot_source
        self.sinks: list[ev.Sink] = list(sinks)
        self.tick_hooks: list[Callable[[float], None]] = list(tick_hooks)
        self.resend_after_s = resend_after_s
        self.tick_interval_s = tick_interval_s
        if not 0 <= replan_tolerance < 1:
            raise DaemonError(f"replan_tolerance must be in [0, 1), got {replan_tolerance}")
        self.replan_tolerance = replan_tolerance
        self.clock = clock
        self.registry = registry or Registry(emit=self.emit, silence_timeout_s=silence_timeout_s)
        if registry is not None:
            registry.emit = self.emit
        self._policies: dict[str, policy_mod.Policy] = {}
        #: operator settings by job id (restored by the caller, changed by set-policy/pause)
        self.job_settings: dict[str, admin.JobSettings] = {}
        for job_id, setting in (job_settings or {}).items():
            self._adopt_setting(job_id, setting)
        #: settings from the config for a job id not in ``job_settings`` (glob entries),
        #: looked up when the registry sees that job for the first time
        self.config_settings = config_settings
        self.status_extra = status_extra
        #: the Replicator's rows for status (set by the service when it replicates)
        self.replication_source: Callable[[], list[admin.ReplicationInfo]] | None = None
        self._drains: list[_Drain] = []
        self._writing: set[str] = set()  # jobs with a save in flight (SaveInFlight emitted)
        self._stop_requested = False
        self._stop_drain_s = 0.0
        self._shutdown_drain: _Drain | None = None
        self.counters: Counter[str] = Counter()
        self.by_kind: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self._throttle = _Throttle()
        self._ctx: zmq.Context | None = None
        self._auth: Any = None  # zmq.auth ThreadAuthenticator, for CURVE over TCP
        self._jobs: zmq.Socket | None = None
        self._admin: zmq.Socket | None = None
        self._lock_fd: int | None = None
        self._wake_r, self._wake_w = _socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = threading.Event()
        self._tick_soon = False
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._opened = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoint(self) -> str:
        return self.tcp or f"ipc://{self.socket_path}"

    @property
    def wakeup_fd(self) -> int:
        """A non-blocking fd for :func:`signal.set_wakeup_fd`: a signal wakes the poll."""
        return self._wake_w.fileno()

    def open(self) -> None:
        """Take the lock, bind both sockets. Raises :class:`DaemonError`."""
        if self._opened:
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
        self._started = self.clock()
        self._opened = True
        log.info(
            logfmt(
                "listening",
                socket=self.endpoint,
                admin=self.admin_path,
                policy=self.default_spec,
                pid=os.getpid(),
            )
        )

    def serve(self) -> None:
        """Open (if needed) and run the loop in this thread until :meth:`stop`; then close."""
        self.open()
        try:
            self._loop()
        finally:
            self.close()

    def start(self, timeout_s: float = 10.0) -> Daemon:
        """Run the daemon in a background thread; returns once it is serving.

        Raises :class:`DaemonError` (from :meth:`open`) in the caller's thread.
        """
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            try:
                self.open()
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            try:
                self._loop()
            finally:
                self.close()

        self._thread = threading.Thread(target=main, name="adaptd-daemon", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise DaemonError(f"the daemon did not start within {timeout_s:g}s")
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def stop(self, timeout_s: float | None = 10.0, drain_s: float = 0.0) -> None:
        """Ask the loop to end (safe from signal handlers and other threads).

        With ``drain_s`` > 0 the daemon first sends SaveNow (reason ``shutdown``) to
        every live job and keeps serving until each of those saves is reported
        durable (or failed, or its job gone) or ``drain_s`` has passed, then ends.
        A second call while that drain runs ends the loop at once (a second SIGTERM
        or Ctrl-C means "now").

        From another thread it also waits up to ``timeout_s`` (plus ``drain_s``) for
        the daemon thread.
        """
        if drain_s > 0 and not self._stop_requested and not self._stopping.is_set():
            self._stop_drain_s = drain_s
            self._stop_requested = True
        else:
            self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        t = self._thread
        if t is not None and t is not threading.current_thread() and timeout_s is not None:
            t.join(timeout_s + max(0.0, drain_s))

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def close(self) -> None:
        """Close the sockets, remove their files, release the lock."""
        if not self._opened:
            return
        self._opened = False
        self._close_sockets()
        for path in self._files():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._unlock()
        log.info(logfmt("stopped", socket=self.endpoint))

    def _files(self) -> list[Path]:
        """The socket files this daemon binds (and removes)."""
        return [self.admin_path] if self.tcp else [self.socket_path, self.admin_path]

    # ------------------------------------------------------------------ loop

    def _loop(self) -> None:
        assert self._jobs is not None and self._admin is not None
        poller = zmq.Poller()
        poller.register(self._jobs, zmq.POLLIN)
        poller.register(self._admin, zmq.POLLIN)
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        next_tick = self.clock() + self.tick_interval_s
        while not self._stopping.is_set():
            if self._stop_requested and self._shutdown_drain is None:
                self._shutdown_drain = self._start_drain(
                    None, self._stop_drain_s, "shutdown", self.clock()
                )
                self._check_drains(self.clock())
                continue
            wake_at = min([next_tick, *(d.deadline for d in self._drains)])
            timeout_ms = max(0, int((wake_at - self.clock()) * 1000) + 1)
            try:
                ready = dict(poller.poll(timeout_ms))
            except zmq.ZMQError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if self._wake_r.fileno() in ready:
                with contextlib.suppress(BlockingIOError, OSError):
                    while self._wake_r.recv(4096):
                        pass
            if self._stopping.is_set():
                break
            if self._jobs in ready:
                self._drain(self._jobs, self._on_job_frames)
            if self._admin in ready:
                self._drain(self._admin, self._on_admin_frames)
            now = self.clock()
            if now >= next_tick or self._tick_soon:
                self._tick_soon = False
                self.tick(now)
                next_tick = now + self.tick_interval_s
            if self._drains:
                self._check_drains(now)

    def _drain(self, sock: zmq.Socket, handle: Callable[[list[zmq.Frame]], None]) -> None:
        for _ in range(BATCH):
            try:
                # Frames, not bytes: they carry the connection's credentials (peer_cred).
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                handle(frames)
            except Exception:  # a bug in one message's handling must not end the daemon
                self.counters["internal_errors"] += 1
                log.exception(logfmt("internal_error", parts=len(frames)))

    def tick(self, now: float) -> None:
        """Once a second: liveness, then the tick hooks (each guarded)."""
        self.registry.check(now)
        for job_id in list(self._writing):
            job = self.registry.jobs.get(job_id)
            if job is None or job.state != "active":
                self._writing.discard(job_id)
                self.emit(ev.SaveInFlight(now, job_id, False))
        for hook in self.tick_hooks:
            try:
                hook(now)
            except Exception:
                self.counters["tick_errors"] += 1
                if self._throttle(f"tick:{getattr(hook, '__name__', hook)!s}"):
                    log.exception(logfmt("tick_hook_failed", hook=hook))

    # ------------------------------------------------------------------ events

    def emit(self, event: ev.Event) -> None:
        """Hand ``event`` to every sink; a failing sink is counted and logged, never raised."""
        _log_job_event(event)
        for sink in self.sinks:
            try:
                sink(event)
            except Exception:
                self.counters["sink_errors"] += 1
                if self._throttle(f"sink:{sink!r}"):
                    log.exception(logfmt("sink_failed", sink=sink, event=type(event).__name__))

    # ------------------------------------------------------------------ job socket

    def _send(self, identity: bytes, msg: p.Message) -> bool:
        assert self._jobs is not None
        try:
            self._jobs.send_multipart([identity, p.encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            # EAGAIN: the peer's queue is full (a slow or stuck reader); EHOSTUNREACH:
            # it is gone (ROUTER_MANDATORY reports both instead of dropping silently)
            self.counters["send_dropped"] += 1
            if self._throttle(f"send:{exc.errno}"):
                log.warning(logfmt("send_dropped", peer=identity.hex(), error=exc.strerror))
            return False
        self.counters["sent"] += 1
        return True

    def _send_rank(self, rank: Rank, msg: p.Message, now: float) -> None:
        if self._send(rank.identity, msg):
            rank.last_sent = now

    def _reject(
        self, identity: bytes | None, code: str, message: str, *, counter: str = ""
    ) -> None:
        key = counter or code
        self.rejected[key] += 1
        self.emit(ev.MessageRejected(self.clock(), key))
        if self._throttle(f"reject:{key}"):
            log.warning(logfmt("rejected", code=key, peer=(identity or b"").hex(), message=message))
        if identity is not None:
            self._send(identity, p.Error(v=p.VERSION, code=code, message=message[: p.MAX_TEXT]))

    def _on_job_frames(self, parts: list[zmq.Frame]) -> None:
        self.counters["messages"] += 1
        if len(parts) < 2:
            self._reject(None, "malformed", "a frame without a peer identity")
            return
        frames = [f.bytes for f in parts]
        identity = frames[0]
        if len(frames) != 2:
            self._reject(
                identity,
                "malformed",
                f"expected one frame per message, got {len(frames) - 1}",
                counter="multipart",
            )
            return
        try:
            msg = p.decode_client(frames[1])
        except p.ProtocolError as exc:
            self._reject(identity, exc.code, str(exc))
            return
        now = self.clock()
        kind = str(type(msg).__struct_config__.tag)  # the wire name: "save_report"
        self.by_kind[kind] += 1
        if isinstance(msg, p.Hello):
            self._on_hello(identity, msg, now, peer_cred(parts[1]))
            return
        where = self.registry.peer(identity)
        if where is None:
            self._reject(
                identity,
                "unknown_peer",
                f"{kind} for job {msg.job!r} rank {msg.rank} from a connection that has not "
                "said hello (the daemon may have restarted): send hello again",
            )
            return
        job, rank = where
        if msg.job != job.id or msg.rank != rank.rank:
            self._reject(
                identity,
                "wrong_job",
                f"this connection said hello as job {job.id!r} rank {rank.rank}; "
                f"it may not report for job {msg.job!r} rank {msg.rank}",
            )
            return
        if isinstance(msg, p.Steps):
            self.registry.steps(job, rank, msg, now)
        elif isinstance(msg, p.SaveReport):
            counted = self.registry.save_report(job, rank, msg, now)
            for drain in self._drains:
                self._drain_report(drain, job, rank, msg, now)
            log.info(
                logfmt(
                    "save",
                    job=job.id,
                    rank=rank.rank,
                    step=msg.step,
                    ok=msg.ok,
                    blocking_s=msg.blocking_s,
                    durable_s=msg.durable_s,
                    extra_step_s=msg.extra_step_s,
                    bytes=msg.bytes,
                    reason=msg.reason,
                    error=msg.error or None,
                    counted=counted,
                )
            )
        elif isinstance(msg, p.Goodbye):
            self.registry.goodbye(job, rank, msg, now)
            log.info(
                logfmt("goodbye", job=job.id, rank=rank.rank, step=msg.step, reason=msg.reason)
            )
            self._note_writing(job, now)
            return
        self._note_writing(job, now)
        self._decide(job, now)
        if job.plan is not None and now - rank.last_sent >= self.resend_after_s:
            self._send_rank(rank, self._plan_message(job), now)

    def _on_hello(
        self, identity: bytes, msg: p.Hello, now: float, peer: PeerCred | None = None
    ) -> None:
        if msg.rank >= msg.world_size:
            self._reject(
                identity,
                "invalid",
                f"hello: rank {msg.rank} is outside world_size {msg.world_size}",
            )
            return
        where = self.registry.peer(identity)
        if where is not None and (where[0].id, where[1].rank) != (msg.job, msg.rank):
            self._reject(
                identity,
                "wrong_job",
                f"this connection already said hello as job {where[0].id!r} rank "
                f"{where[1].rank}; open a new connection for job {msg.job!r} rank {msg.rank}",
            )
            return
        try:
            job, rank, kind = self.registry.hello(identity, msg, now, peer)
        except RegistryFull as exc:
            self._reject(identity, "busy", f"the daemon cannot take more ranks: {exc}")
            return
        except HelloRefused as exc:
            self._reject(identity, exc.code, str(exc))
            return
        bad_policy: str | None = None
        if kind == "new" and self.config_settings is not None and job.id not in self.job_settings:
            # only for a job new to the registry: what an operator changes later (resume,
            # a new policy) is not undone by the hello of another rank or a reconnect
            configured = self.config_settings(job.id)
            if configured is not None:
                self._adopt_setting(job.id, configured)
        setting = self.job_settings.get(job.id)
        if job.policy is None and setting is not None and setting.policy is not None:
            job.policy = self._policy(setting.policy)  # parsed when it was set
            job.policy_spec = setting.policy
        if job.policy is None:
            spec = msg.policy or self.default_spec
            try:
                job.policy = self._policy(spec)
                job.policy_spec = spec
            except policy_mod.PolicyError as exc:
                bad_policy = f"policy {msg.policy!r} refused, using {self.default_spec!r}: {exc}"
                job.policy = self.default_policy
                job.policy_spec = self.default_spec
        elif msg.policy and msg.policy != job.policy_spec:
            log.warning(
                logfmt(
                    "policy_ignored",
                    job=job.id,
                    rank=msg.rank,
                    asked=msg.policy,
                    using=job.policy_spec,
                )
            )
        log.info(
            logfmt(
                "hello",
                job=job.id,
                rank=msg.rank,
                world_size=msg.world_size,
                pid=msg.pid,
                resumed_from=msg.resumed_from,
                kind=kind,
                policy=job.policy_spec,
            )
        )
        self._send_rank(
            rank,
            p.Welcome(v=p.VERSION, job=job.id, rank=rank.rank, daemon_version=__version__),
            now,
        )
        if kind in ("resume", "restart"):
            job.plan = None  # a new run: its ranks need a plan for their own steps
        changed = self._decide(job, now)
        if not changed and job.plan is not None:
            self._send_rank(rank, self._plan_message(job), now)
        if bad_policy is not None:
            self._reject(identity, "bad_policy", bad_policy)

    def _adopt_setting(self, job_id: str, setting: admin.JobSettings) -> None:
        """Take a restored or configured setting; a policy that no longer parses (a
        plugin uninstalled since) is dropped with a warning, the pause is kept."""
        if setting.policy is not None:
            try:
                self._policy(setting.policy)
            except policy_mod.PolicyError as exc:
                log.warning(logfmt("setting_ignored", job=job_id, policy=setting.policy, error=exc))
                setting = admin.JobSettings(policy=None, paused=setting.paused)
        if setting.policy is not None or setting.paused:
            self.job_settings[job_id] = setting

    def _policy(self, spec: str) -> policy_mod.Policy:
        cached = self._policies.get(spec)
        if cached is None:
            cached = policy_mod.parse(spec)
            if len(self._policies) >= POLICY_CACHE:
                self._policies.pop(next(iter(self._policies)))
            self._policies[spec] = cached
        return cached

    def _plan_message(self, job: Job) -> p.Plan:
        d = job.plan
        assert d is not None
        return p.Plan(
            v=p.VERSION,
            job=job.id,
            seq=job.plan_seq,
            next_step=d.next_step,
            every_steps=d.every_steps if d.every_steps and d.every_steps >= 1 else None,
            policy=(d.policy or job.policy_spec)[: p.MAX_TEXT],
            reason=d.reason[: p.MAX_TEXT],
            interval_s=d.interval_s if d.interval_s is not None and d.interval_s >= 0 else None,
            waste=d.waste if d.waste is not None and d.waste >= 0 else None,
        )

    def tick_soon(self) -> None:
        """Run the tick hooks at the loop's next wake-up instead of at the next second
        (safe from other threads: the fleet's thread calls it when a slot is granted)."""
        self._tick_soon = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def decide(self, job: Job, now: float) -> bool:
        """Run ``job``'s policy now, between its step reports (a tick hook learned
        something that changes its facts, such as a fleet write slot granted); pushes
        the plan if it changed."""
        return self._decide(job, now)

    def _decide(self, job: Job, now: float) -> bool:
        """Run the job's policy; push a plan (or SaveNow) when it changed. Returns whether
        anything was pushed."""
        if job.policy is None or job.state != "active":
            return False
        try:
            snapshot = self.snapshot_source()
        except Exception:
            self.counters["snapshot_errors"] += 1
            if self._throttle("snapshot"):
                log.exception(logfmt("snapshot_failed"))
            snapshot = Snapshot(time=now)
        state = job.tracker.state(
            time=max(job.tracker.time, now),
            pids=tuple(r.pid for r in job.live_ranks() if r.pid > 0),
            urgent=job.urgent,
            storage_target=next((s.target for s in snapshot.storage if job.id in s.jobs), None),
            time_since_failure_s=job.tracker.time_since_failure_s(now),
        )
        try:
            decision = job.policy.decide(snapshot, state)
        except Exception:
            self.counters["policy_errors"] += 1
            if self._throttle(f"policy:{job.policy_spec}"):
                log.exception(logfmt("policy_failed", job=job.id, policy=job.policy_spec))
            return False
        if not isinstance(decision, Decision):
            self.counters["policy_errors"] += 1
            if self._throttle(f"policy-type:{job.policy_spec}"):
                log.error(
                    logfmt(
                        "policy_failed",
                        job=job.id,
                        policy=job.policy_spec,
                        error=f"returned {type(decision).__name__}, not a Decision",
                    )
                )
            return False
        setting = self.job_settings.get(job.id)
        if setting is not None and setting.paused and not decision.urgent:
            decision = Decision(
                next_step=None,
                reason=f"paused by operator (the policy would: {decision.reason})",
                policy=decision.policy,
                interval_s=decision.interval_s,
                waste=decision.waste,
            )
        job.latest = decision
        if decision.urgent:
            if job.urgent_sent:
                return False
            job.urgent_sent = True
            self._save_now(job, decision.reason or "urgent", now)
            return True
        job.urgent_sent = False
        if job.plan is not None and same_saves(
            job.plan, decision, state.step, self.replan_tolerance
        ):
            return False
        job.plan = decision
        job.plan_seq += 1
        plan = self._plan_message(job)
        ranks = job.live_ranks()
        for r in ranks:
            self._send_rank(r, plan, now)
        self.counters["plans_sent"] += len(ranks)
        log.info(
            logfmt(
                "plan",
                job=job.id,
                seq=plan.seq,
                step=state.step,
                next_step=plan.next_step,
                every_steps=plan.every_steps,
                policy=plan.policy,
                reason=plan.reason,
                interval_s=plan.interval_s,
                waste=plan.waste,
                ranks=len(ranks),
            )
        )
        self.emit(
            ev.PlanChanged(now, time.time(), job.id, plan.seq, state.step, decision, len(ranks))
        )
        return True

    def _save_now(self, job: Job, reason: str, now: float) -> int:
        msg = p.SaveNow(v=p.VERSION, job=job.id, reason=reason[: p.MAX_TEXT])
        ranks = job.live_ranks()
        for r in ranks:
            self._send_rank(r, msg, now)
        log.info(logfmt("save_now", job=job.id, step=job.step, reason=reason, ranks=len(ranks)))
        self.emit(ev.SaveRequested(now, time.time(), job.id, job.step, reason, len(ranks)))
        return len(ranks)

    # ------------------------------------------------------------------ admin socket

    def _on_admin_frames(self, parts: list[zmq.Frame]) -> None:
        assert self._admin is not None
        self.counters["admin_requests"] += 1
        frames = [f.bytes for f in parts]
        # REQ peers send [identity, b"", body]; DEALER peers [identity, body]
        if len(frames) == 3 and frames[1] == b"":
            envelope, body = frames[:2], frames[2]
        elif len(frames) == 2:
            envelope, body = frames[:1], frames[1]
        else:
            envelope, body = frames[:1], None
        try:
            self._admin_allowed(peer_cred(parts[-1]))
            if body is None:
                raise admin.AdminError("invalid", f"expected one frame, got {len(frames) - 1}")
            reply = self._admin_reply(admin.decode_request(body), envelope)
        except admin.AdminError as exc:
            self.rejected[f"admin_{exc.code}"] += 1
            self.emit(ev.MessageRejected(self.clock(), f"admin_{exc.code}"))
            log.warning(logfmt("operator_refused", code=exc.code, message=str(exc)))
            reply = admin.ErrorReply(code=exc.code, message=str(exc))
        if reply is not None:
            self._admin_send(envelope, reply)

    def _admin_allowed(self, peer: PeerCred | None) -> None:
        """Raise ``AdminError("denied")`` unless the peer is root, the daemon's own user
        or (with ``admin_group``) in the admin group.

        The socket file's mode already keeps others out; this check holds even when
        that mode is opened up by mistake. Group membership is read from the peer
        process itself (``/proc/PID/status``), so it is what the kernel grants it.
        """
        uid = peer.uid if peer is not None else None
        if uid is not None and uid in (0, os.geteuid()):
            return
        gid = self.admin_gid
        if (
            peer is not None
            and uid is not None
            and gid is not None
            and (peer.gid == gid or gid in _groups_of(peer.pid, uid))
        ):
            return
        raise admin.AdminError(
            "denied",
            "operator commands are for root, the daemon's user and the admin group; "
            f"uid {uid if uid is not None else 'unknown'} is none of them",
        )

    def _admin_send(self, envelope: list[bytes], reply: admin.AnyReply) -> None:
        assert self._admin is not None
        with contextlib.suppress(zmq.Again):
            self._admin.send_multipart([*envelope, admin.encode(reply)], zmq.NOBLOCK)

    def _admin_reply(self, req: admin.AnyRequest, envelope: list[bytes]) -> admin.AnyReply | None:
        """The reply to an operator's request, or ``None`` when it is sent later (drain)."""
        now = self.clock()
        if isinstance(req, admin.StatusRequest):
            return self.status(now)
        if isinstance(req, admin.DrainRequest):
            if not 0 < req.timeout_s <= 86_400:
                raise admin.AdminError(
                    "invalid", f"drain --timeout must be in (0, 86400] seconds, got {req.timeout_s}"
                )
            self._start_drain(envelope, req.timeout_s, req.reason, now)
            self._check_drains(now)
            return None
        if isinstance(req, admin.SetPolicyRequest):
            return self._set_policy(req, now)
        if isinstance(req, admin.PauseRequest):
            return self._pause(req, now)
        if isinstance(req, admin.SaveNowRequest):
            if req.job is None:
                jobs = [j for j in self.registry if j.state == "active"]
            else:
                job = self.registry.jobs.get(req.job)
                if job is None or job.state != "active":
                    active = sorted(j.id for j in self.registry if j.state == "active")
                    shown = ", ".join(active[:20]) or "none"
                    state = "unknown" if job is None else job.state
                    raise admin.AdminError(
                        "unknown_job",
                        f"job {req.job!r} is {state}; active jobs: {shown}",
                    )
                jobs = [job]
            ranks = 0
            for job in jobs:
                job.urgent = req.reason
                ranks += self._save_now(job, req.reason, now)
            log.info(
                logfmt(
                    "operator_action",
                    action="save_now",
                    job=req.job or "--all",
                    jobs=len(jobs),
                    ranks=ranks,
                    reason=req.reason,
                )
            )
            return admin.SaveNowReply(jobs=[j.id for j in jobs], ranks=ranks)
        raise admin.AdminError("invalid", f"unsupported request {type(req).__name__}")

    # ------------------------------------------------------------------ operator settings

    def _known_job(self, job_id: str) -> Job:
        job = self.registry.jobs.get(job_id)
        if job is None:
            known = sorted(j.id for j in self.registry)
            shown = ", ".join(known[:20]) or "none"
            raise admin.AdminError("unknown_job", f"job {job_id!r} is unknown; known jobs: {shown}")
        return job

    def _change_setting(self, job_id: str, now: float, **change: Any) -> admin.JobSettings:
        old = self.job_settings.get(job_id, admin.JobSettings())
        new = admin.JobSettings(
            policy=change.get("policy", old.policy), paused=change.get("paused", old.paused)
        )
        if new.policy is None and not new.paused:
            self.job_settings.pop(job_id, None)
        else:
            self.job_settings[job_id] = new
        self.emit(ev.JobSettingsChanged(now, job_id, new.policy, new.paused))
        return new

    def _replan(self, job: Job, now: float) -> int:
        """Decide afresh and push the plan even if its saves did not change (the reason did).
        Returns the plan's seq, 0 when nothing could be pushed."""
        if job.state != "active":
            return 0
        job.plan = None
        job.urgent_sent = False
        self._decide(job, now)
        return job.plan_seq if job.plan is not None else 0

    def _set_policy(self, req: admin.SetPolicyRequest, now: float) -> admin.SetPolicyReply:
        job = self._known_job(req.job)
        try:
            policy = self._policy(req.spec)
        except policy_mod.PolicyError as exc:
            raise admin.AdminError("bad_policy", f"policy spec {req.spec!r}: {exc}") from None
        previous = job.policy_spec
        job.policy, job.policy_spec = policy, req.spec
        self._change_setting(job.id, now, policy=req.spec)
        seq = self._replan(job, now)
        log.info(
            logfmt(
                "operator_action",
                action="set_policy",
                job=job.id,
                policy=req.spec,
                previous=previous,
                plan_seq=seq,
            )
        )
        return admin.SetPolicyReply(job=job.id, policy=req.spec, previous=previous, plan_seq=seq)

    def _pause(self, req: admin.PauseRequest, now: float) -> admin.PauseReply:
        if req.job is not None:
            if req.job not in self.registry.jobs and req.job not in self.job_settings:
                self._known_job(req.job)  # raises unknown_job
            targets = [req.job]
        elif req.paused:
            targets = [j.id for j in self.registry if j.state == "active"]
        else:
            targets = sorted(k for k, v in self.job_settings.items() if v.paused)
        changed = []
        for job_id in targets:
            if self.job_settings.get(job_id, admin.JobSettings()).paused == req.paused:
                continue
            self._change_setting(job_id, now, paused=req.paused)
            changed.append(job_id)
            job = self.registry.jobs.get(job_id)
            if job is not None:
                self._replan(job, now)
        log.info(
            logfmt(
                "operator_action",
                action="pause" if req.paused else "resume",
                job=req.job or "--all",
                changed=",".join(changed) or "none",
            )
        )
        return admin.PauseReply(jobs=changed, paused=req.paused)

    # ------------------------------------------------------------------ drains

    def _start_drain(
        self, envelope: list[bytes] | None, timeout_s: float, reason: str, now: float
    ) -> _Drain:
        """SaveNow to every active job with live ranks; track their reports."""
        drain = _Drain(envelope, reason, now, now + timeout_s)
        for job in self.registry:
            ranks = job.live_ranks()
            if job.state != "active" or not ranks:
                continue
            job.urgent = reason
            sent = self._save_now(job, reason, now)
            drain.jobs[job.id] = _DrainJob(job.id, sent, {r.rank: r.step for r in ranks})
        self._drains.append(drain)
        log.info(
            logfmt(
                "operator_action" if envelope is not None else "shutdown_drain",
                action="drain",
                jobs=len(drain.jobs),
                timeout_s=timeout_s,
                reason=reason,
            )
        )
        return drain

    def _drain_report(
        self, drain: _Drain, job: Job, rank: Rank, msg: p.SaveReport, now: float
    ) -> None:
        entry = drain.jobs.get(job.id)
        if entry is None or entry.done_at is not None or rank.rank not in entry.waiting:
            return
        if msg.step < entry.waiting[rank.rank]:
            return  # an older save finishing: not the one asked for
        if not msg.ok:
            entry.error = f"rank {rank.rank} save of step {msg.step} failed: {msg.error}"
            entry.done_at = now
            return
        del entry.waiting[rank.rank]
        entry.step = msg.step if entry.step is None else min(entry.step, msg.step)
        if not entry.waiting:
            entry.done_at = now

    def _check_drains(self, now: float) -> None:
        """End drains whose saves are all in (or whose jobs are gone), or whose time is up."""
        for drain in list(self._drains):
            for entry in drain.jobs.values():
                if entry.done_at is not None:
                    continue
                job = self.registry.jobs.get(entry.job)
                if job is None or job.state != "active":
                    entry.error = f"job {job.state if job else 'forgotten'} before its save"
                    entry.done_at = now
                    continue
                gone = sorted(
                    r for r in entry.waiting if (rk := job.ranks.get(r)) is None or not rk.alive
                )
                if gone:
                    entry.error = f"rank {gone[0]} gone before its save"
                    entry.done_at = now
            timed_out = now >= drain.deadline and not drain.done()
            if drain.done() or timed_out:
                self._drains.remove(drain)
                self._finish_drain(drain, now, timed_out)

    def _finish_drain(self, drain: _Drain, now: float, timed_out: bool) -> None:
        jobs = []
        for entry in drain.jobs.values():
            durable = entry.done_at is not None and not entry.error
            error = entry.error
            if entry.done_at is None:
                waiting = ",".join(map(str, sorted(entry.waiting)))
                error = (
                    f"timeout after {now - drain.started:.0f}s: rank(s) {waiting} did not report"
                )
            seconds = (entry.done_at if entry.done_at is not None else now) - drain.started
            jobs.append(
                admin.DrainJob(
                    job=entry.job,
                    ranks=entry.ranks,
                    step=entry.step,
                    durable=durable,
                    seconds=seconds,
                    error=error,
                )
            )
            (log.info if durable else log.warning)(
                logfmt(
                    "drain_job",
                    job=entry.job,
                    step=entry.step,
                    durable=durable,
                    seconds=seconds,
                    error=error or None,
                    reason=drain.reason,
                )
            )
        log.info(
            logfmt(
                "drain_done",
                reason=drain.reason,
                jobs=len(jobs),
                durable=sum(j.durable for j in jobs),
                seconds=now - drain.started,
                timed_out=timed_out,
            )
        )
        if drain.envelope is not None:
            reply = admin.DrainReply(jobs=jobs, seconds=now - drain.started, timed_out=timed_out)
            self._admin_send(drain.envelope, reply)
        if drain is self._shutdown_drain:
            self._stopping.set()

    def _note_writing(self, job: Job, now: float) -> None:
        """Emit :class:`~adaptd.events.SaveInFlight` when the job's save-in-flight flag flips."""
        writing = job.state == "active" and job.tracker.save_in_flight
        if writing != (job.id in self._writing):
            if writing:
                self._writing.add(job.id)
            else:
                self._writing.discard(job.id)
            self.emit(ev.SaveInFlight(now, job.id, writing))

    def status(self, now: float | None = None) -> admin.StatusReply:
        """What ``adaptd status`` shows: every job and the daemon's counters."""
        now = self.clock() if now is None else now
        jobs = [self._job_info(j, now) for j in self.registry]
        c = self.counters
        daemon = admin.DaemonInfo(
            version=__version__,
            pid=os.getpid(),
            socket=self.endpoint.removeprefix("ipc://"),
            admin_socket=str(self.admin_path),
            default_policy=self.default_spec,
            uptime_s=now - self._started,
            messages=c["messages"],
            by_kind=dict(self.by_kind),
            rejected=dict(self.rejected),
            sent=c["sent"],
            send_dropped=c["send_dropped"],
            plans_sent=c["plans_sent"],
            policy_errors=c["policy_errors"],
            sink_errors=c["sink_errors"],
            jobs_active=sum(j.state == "active" for j in self.registry),
            jobs_lost=sum(j.state == "lost" for j in self.registry),
            peers=self.registry.peers,
        )
        telemetry = None
        if self.status_extra is not None:
            try:
                telemetry = self.status_extra()
            except Exception:
                self.counters["status_extra_errors"] += 1
                if self._throttle("status_extra"):
                    log.exception(logfmt("status_extra_failed"))
        replication = None
        if self.replication_source is not None:
            try:
                replication = self.replication_source()
            except Exception:
                self.counters["status_extra_errors"] += 1
                if self._throttle("replication"):
                    log.exception(logfmt("replication_status_failed"))
        return admin.StatusReply(
            daemon=daemon, jobs=jobs, telemetry=telemetry, replication=replication
        )

    def _job_info(self, job: Job, now: float) -> admin.JobInfo:
        t = job.tracker
        plan = None
        if job.plan is not None:
            d = job.plan
            plan = admin.PlanInfo(
                seq=job.plan_seq,
                next_step=d.next_step,
                every_steps=d.every_steps,
                policy=d.policy or job.policy_spec,
                reason=d.reason,
                interval_s=d.interval_s,
                waste=d.waste,
            )
        last = None
        if job.last_save is not None and job.last_save_time is not None:
            s = job.last_save
            last = admin.SaveInfo(
                step=s.step,
                ok=s.ok,
                blocking_s=s.blocking_s,
                durable_s=s.durable_s,
                bytes=s.bytes,
                extra_step_s=s.extra_step_s,
                age_s=now - job.last_save_time,
                rank=s.rank,
                error=s.error,
                reason=s.reason,
            )
        return admin.JobInfo(
            job=job.id,
            state=job.state,
            world_size=job.world_size,
            ranks=[
                admin.RankInfo(
                    rank=r.rank,
                    pid=r.pid,
                    hostname=r.hostname,
                    alive=r.alive,
                    step=r.step,
                    last_seen_s=now - r.last_seen,
                    lost_reason=r.lost_reason,
                )
                for r in sorted(job.ranks.values(), key=lambda r: r.rank)
            ],
            step=t.step,
            start_step=t.start_step,
            step_time_s=t.step_time_s,
            policy=job.policy_spec,
            plan=plan,
            next_save_step=job.plan.due_after(t.step - 1) if job.plan is not None else None,
            saves=t.saves,
            failed_saves=t.failed_saves,
            save_cost_s=t.save_cost_s,
            save_latency_s=t.save_latency_s,
            last_save=last,
            last_durable_step=t.last_durable_step,
            waste=job.latest.waste if job.latest is not None else None,
            restore_s=t.restore_s,
            failures=job.failures,
            incarnation=job.incarnation,
            checkpoint_dir=job.checkpoint_dir,
            urgent=job.urgent,
            lost_reason=job.lost_reason if job.state == "lost" else "",
            lost_s=(now - job.lost_at) if job.state == "lost" and job.lost_at is not None else None,
            paused=self.job_settings.get(job.id, admin.JobSettings()).paused,
            policy_set=self.job_settings.get(job.id, admin.JobSettings()).policy is not None,
        )

    # ------------------------------------------------------------------ files

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
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise DaemonError(
                f"cannot open the lock file {self.lock_path}: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DaemonError(
                f"another adaptd daemon (pid {holder}) is serving {self.socket_path}; "
                "stop it first, or pass a different --socket"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        # The lock file stays: unlinking it would let a starting daemon lock an orphaned inode.
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _close_sockets(self) -> None:
        for s in (self._jobs, self._admin):
            if s is not None:
                s.close(linger=0)
        self._jobs = self._admin = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def _log_job_event(event: ev.Event) -> None:
    if isinstance(event, ev.JobLost):
        log.warning(
            logfmt(
                "job_lost",
                job=event.job,
                step=event.step,
                last_durable_step=event.last_durable_step,
                reason=event.reason,
            )
        )
    elif isinstance(event, ev.JobResumed):
        log.info(
            logfmt(
                "job_resumed",
                job=event.job,
                resumed_from=event.resumed_from,
                last_step=event.last_step,
                lost_steps=event.lost_steps,
                restart_s=event.restart_s,
            )
        )
    elif isinstance(event, ev.JobRevived):
        log.info(logfmt("job_revived", job=event.job))
    elif isinstance(event, ev.JobFinished):
        log.info(logfmt("job_finished", job=event.job, step=event.step, reason=event.reason))


def _job_socket_path(socket: str | os.PathLike[str] | None) -> Path:
    """The ipc job socket's path; for a TCP daemon, the default path in the runtime
    directory, beside which its admin socket and lock file live."""
    text = os.fspath(socket) if socket else os.environ.get("ADAPTD_SOCKET", "")
    if text.startswith("tcp://"):
        return paths.runtime_dir() / paths.SOCKET_NAME
    return paths.socket_path(text.removeprefix("ipc://") or None)


def _groups_of(pid: int | None, uid: int) -> set[int]:
    """The groups of process ``pid`` (``/proc/PID/status``), else of user ``uid``."""
    if pid:
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return set()
    return set(os.getgrouplist(user.pw_name, user.pw_gid))


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
