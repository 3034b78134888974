"""The daemon as ``adaptd serve`` runs it: built from one :class:`Config`, opened, served,
closed.

:class:`Service` is the lifecycle: :meth:`Service.open` has every part built in one
place (:func:`adaptd.daemon.service_parts.build_service`, which says in what order and
why), binds the daemon's sockets under a private umask and then gives them the
configured modes and group (so a socket is never world-reachable, not even between
bind and chmod), starts the fleet's thread, the replicator and the Prometheus endpoint,
probes the telemetry once. :meth:`Service.serve` wires SIGTERM and SIGINT to a drain
(:meth:`Service.request_stop`), then tells systemd ``READY=1``
(:mod:`adaptd.daemon.sdnotify`) and runs the daemon's loop; :meth:`Service.close`
closes everything in reverse order, persisting what was learned first.

Raises :class:`ServiceError` (one line saying what to change) for any start-up
problem: state database, sockets, metrics address.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from adaptd.config.loader import Config
from adaptd.core.estimators import FailureRate
from adaptd.core.snapshot import Snapshot
from adaptd.daemon.admin.handler import admin_gid
from adaptd.daemon.host_snapshot import storage_limits
from adaptd.daemon.sdnotify import Notifier
from adaptd.daemon.server import Daemon
from adaptd.daemon.service_parts import ServiceError, ServiceParts, build_service
from adaptd.daemon.transport import DaemonError
from adaptd.daemon.upkeep import EXTEND_BY_S, PERSIST_EVERY_S
from adaptd.logfmt import logfmt
from adaptd.metrics.exporter import MetricsError, MetricsServer
from adaptd.state.learned import FAILURE_RATE_KEY, LEARNED_KEY

if TYPE_CHECKING:
    from adaptd.fleet.part import FleetPart
    from adaptd.telemetry.sampler import Sampler
    from adaptd.tiers.replicator import Replicator

__all__ = [
    "EXTEND_BY_S",
    "FAILURE_RATE_KEY",
    "LEARNED_KEY",
    "PERSIST_EVERY_S",
    "Service",
    "ServiceError",
    "storage_limits",
]

log = logging.getLogger("adaptd.service")


def set_permissions(cfg: Config, daemon: Daemon) -> None:
    """Give the daemon's sockets the configured modes and groups. Raises
    :class:`ServiceError` naming the setting for a group that does not exist or a
    socket whose mode cannot be set."""
    gid = -1
    if cfg.socket_group:
        try:
            gid = grp.getgrnam(cfg.socket_group).gr_gid
        except KeyError:
            raise ServiceError(
                f"daemon.socket_group: no group {cfg.socket_group!r} on this host; "
                "create it (systemd-sysusers) or remove the setting"
            ) from None
    try:
        admin_group = admin_gid(cfg.admin_group)
    except DaemonError as exc:
        raise ServiceError(str(exc)) from None
    try:
        if daemon.tcp is None:  # a tcp:// job socket has no file (CURVE guards it)
            if gid != -1:
                os.chown(daemon.socket_path, -1, gid)
            os.chmod(daemon.socket_path, cfg.socket_mode)
        if admin_group is not None:
            os.chown(daemon.admin_path, -1, admin_group)
        os.chmod(daemon.admin_path, cfg.admin_socket_mode)
    except OSError as exc:
        raise ServiceError(
            f"daemon.socket_mode/socket_group: cannot set {exc.filename}: {exc.strerror}"
        ) from None


class Service:
    """Everything ``adaptd serve`` runs. :meth:`open`, :meth:`serve`, :meth:`close` (or
    :meth:`run`, which does all three)."""

    def __init__(
        self,
        cfg: Config,
        *,
        notifier: Notifier | None = None,
        sampler: Sampler | None = None,
        metrics_strict: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sampler``: a telemetry sampler (default :meth:`Sampler.default` at the
        configured interval). ``metrics_strict=False`` turns a busy metrics port into
        a warning (used when the address is the built-in default, so a second daemon
        on the host, such as the demo's, still starts)."""
        self.cfg = cfg
        self.notifier = notifier if notifier is not None else Notifier()
        self._sampler = sampler
        self.metrics_strict = metrics_strict
        self.clock = clock
        #: every part, once :meth:`open` built them
        self.parts: ServiceParts | None = None
        self.metrics_server: MetricsServer | None = None
        #: set once shutdown began (SIGTERM): the daemon drains, systemd is asked for time
        self.stopping_event = threading.Event()
        self._closed = False

    # ------------------------------------------------------------------ the parts

    @property
    def daemon(self) -> Daemon | None:
        return self.parts.daemon if self.parts is not None else None

    @property
    def fleet(self) -> FleetPart | None:
        return self.parts.fleet if self.parts is not None else None

    @property
    def replicator(self) -> Replicator | None:
        return self.parts.replicator if self.parts is not None else None

    @property
    def failure_rate(self) -> FailureRate | None:
        """The host's failure-rate posterior (``None`` until :meth:`open`)."""
        return self.parts.learned.failure_rate if self.parts is not None else None

    @property
    def stopping(self) -> bool:
        return self.stopping_event.is_set()

    def snapshot(self) -> Snapshot:
        """The daemon's snapshot source (:class:`~adaptd.daemon.host_snapshot.HostSnapshot`)."""
        assert self.parts is not None
        return self.parts.snapshot()

    # ------------------------------------------------------------------ open

    def open(self) -> None:
        """Build and bind everything; raises :class:`ServiceError`. On failure what
        was opened is closed again."""
        try:
            self.parts = build_service(
                self.cfg,
                notifier=self.notifier,
                stopping=self.stopping_event,
                sampler=self._sampler,
                clock=self.clock,
            )
            self._start(self.parts)
        except BaseException:
            self.close(persist=False)
            raise

    def _start(self, parts: ServiceParts) -> None:
        cfg, daemon = self.cfg, parts.daemon
        # Bind under a private umask: the socket files exist with no group/other
        # access until set_permissions below gives them the configured modes.
        old = os.umask(0o077)
        try:
            daemon.open()
        except DaemonError as exc:
            raise ServiceError(str(exc)) from None
        finally:
            os.umask(old)
        set_permissions(cfg, daemon)
        if parts.fleet is not None:
            parts.fleet.start()
        if parts.replicator is not None:
            parts.replicator.start()
            jobs = ",".join(o.pattern for o in cfg.jobs if o.replicate_to)
            log.info(logfmt("replication", destinations=",".join(cfg.destinations), jobs=jobs))
        self._serve_metrics(parts)
        parts.sampler.tick(self.clock())  # probe telemetry once before READY

    def _serve_metrics(self, parts: ServiceParts) -> None:
        if self.cfg.metrics_listen is None:
            return
        host, port = self.cfg.metrics_listen
        try:
            self.metrics_server = parts.metrics.serve(host, port)
        except MetricsError as exc:
            if self.metrics_strict:
                raise ServiceError(f"metrics.listen: {exc}") from None
            log.warning(logfmt("metrics_off", listen=f"{host}:{port}", error=str(exc),
                               hint="set metrics.listen to serve them"))  # fmt: skip
        else:
            log.info(logfmt("metrics", url=self.metrics_server.url))

    # ------------------------------------------------------------------ run

    def request_stop(self, signum: int | None = None) -> None:
        """Begin shutdown (safe from a signal handler): ``STOPPING=1``, then the
        daemon drains for ``daemon.drain_grace_s`` (every job saves) and exits."""
        if self.parts is None:
            return
        name = signal.Signals(signum).name if signum is not None else "request"
        grace = self.cfg.drain_grace_s
        log.info(logfmt("stopping", signal=name, drain_grace_s=grace))
        again = self.stopping
        self.stopping_event.set()
        self.parts.sampler.draining = True
        if not again:
            self.notifier.stopping(f"stopping ({name}); draining up to {grace:g}s")
        if not again and grace > 0:
            self.notifier.extend_timeout(grace + EXTEND_BY_S)
            self.parts.daemon.stop(timeout_s=None, drain_s=grace)
        else:  # a second signal stops at once
            self.parts.daemon.stop(timeout_s=None)

    def serve(self) -> None:
        """Run the daemon's loop in this thread until stopped; SIGTERM/SIGINT stop it."""
        assert self.parts is not None
        daemon = self.parts.daemon
        handler = lambda signum, frame: self.request_stop(signum)  # noqa: E731
        old_term = signal.signal(signal.SIGTERM, handler)
        old_int = signal.signal(signal.SIGINT, handler)
        # the C-level handler writes to this fd, which wakes the poll at once
        previous = signal.set_wakeup_fd(daemon.wakeup_fd, warn_on_full_buffer=False)
        # READY only now: told before the handlers, a SIGTERM right after it (systemd's
        # stop of a unit that just started; seen in a test) killed the daemon undrained
        self.parts.upkeep.ready(self.clock(), f"serving {daemon.socket_path}")
        try:
            daemon.serve()
        finally:
            signal.set_wakeup_fd(previous)
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, old_int)

    def persist_learned(self) -> None:
        """Queue the failure-rate posterior and every known job's learned costs."""
        if self.parts is not None:
            self.parts.upkeep.persist_learned()

    def close(self, *, persist: bool = True) -> None:
        """Close in reverse order of :meth:`open`; persists what was learned first."""
        if self._closed:
            return
        self._closed = True
        parts = self.parts
        if parts is not None:
            if parts.replicator is not None and not parts.replicator.stop():
                log.warning(logfmt("replication_stop_slow", why="an upload did not end in time"))
            if persist:
                with contextlib.suppress(Exception):
                    self.persist_learned()
            if parts.fleet is not None:
                with contextlib.suppress(Exception):
                    parts.fleet.close()
            parts.daemon.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if parts is not None:
            with contextlib.suppress(Exception):
                parts.sampler.close()
            parts.store.flush()
            parts.store.close()
        self.notifier.close()

    def run(self) -> None:
        """:meth:`open`, :meth:`serve`, :meth:`close`; raises :class:`ServiceError`."""
        self.open()
        try:
            self.serve()
        finally:
            self.close()
