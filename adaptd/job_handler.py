"""The daemon's side of the job socket: a frame in, the registry and the plans updated.

:class:`JobHandler` takes one message from the job ROUTER and

- validates it (:mod:`adaptd.protocol`: one frame, size, schema, version); a bad
  one gets an :class:`~adaptd.protocol.Error` reply where a reply is possible, is
  counted by code and becomes a :class:`~adaptd.events.MessageRejected`, never an
  exception;
- checks the connection: a report must come from the connection that said hello
  as that job and rank (the kernel's or CURVE's credentials, :func:`adaptd.transport.peer_cred`,
  decide who may take a rank);
- hands it to the :class:`~adaptd.registry.Registry` (hello, steps, save report,
  goodbye) and to the drains waiting for saves;
- asks the :class:`~adaptd.planner.Planner` for a decision, and re-sends the current
  plan to a rank that reports after :data:`RESEND_AFTER_S` without hearing from the
  daemon (the client's liveness signal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from adaptd import __version__
from adaptd import events as ev
from adaptd import protocol as p
from adaptd.drains import Drains
from adaptd.jobs import PeerCred
from adaptd.logfmt import Throttle, logfmt
from adaptd.planner import Planner
from adaptd.registry import HelloRefused, Registry, RegistryFull
from adaptd.settings import OperatorSettings
from adaptd.stats import DaemonStats
from adaptd.transport import Transport, peer_cred

__all__ = ["RESEND_AFTER_S", "JobHandler"]

log = logging.getLogger("adaptd.server")

#: A rank that reports after this long without hearing from the daemon gets the plan again.
RESEND_AFTER_S = 2.0


class JobHandler:
    """Handles the job socket's messages, one at a time, in the daemon's loop."""

    def __init__(
        self,
        *,
        registry: Registry,
        planner: Planner,
        settings: OperatorSettings,
        drains: Drains,
        transport: Transport,
        stats: DaemonStats,
        emit: Callable[[ev.Event], None],
        clock: Callable[[], float],
        resend_after_s: float = RESEND_AFTER_S,
    ) -> None:
        self.registry = registry
        self.planner = planner
        self.settings = settings
        self.drains = drains
        self.transport = transport
        self.stats = stats
        self.emit = emit
        self.clock = clock
        self.resend_after_s = resend_after_s
        self._throttle = Throttle()

    def reject(self, identity: bytes | None, code: str, message: str, *, counter: str = "") -> None:
        """Count, log (throttled) and answer a refused message with an Error (when the
        sender is known)."""
        key = counter or code
        self.stats.rejected[key] += 1
        self.emit(ev.MessageRejected(self.clock(), key))
        if self._throttle(f"reject:{key}"):
            log.warning(logfmt("rejected", code=key, peer=(identity or b"").hex(), message=message))
        if identity is not None:
            error = p.Error(v=p.VERSION, code=code, message=message[: p.MAX_TEXT])
            self.transport.send(identity, error)

    def on_frames(self, parts: list[zmq.Frame]) -> None:
        """One message from the job socket (identity frame first)."""
        self.stats.counters["messages"] += 1
        if len(parts) < 2:
            self.reject(None, "malformed", "a frame without a peer identity")
            return
        frames = [f.bytes for f in parts]
        identity = frames[0]
        if len(frames) != 2:
            self.reject(
                identity,
                "malformed",
                f"expected one frame per message, got {len(frames) - 1}",
                counter="multipart",
            )
            return
        try:
            msg = p.decode_client(frames[1])
        except p.ProtocolError as exc:
            self.reject(identity, exc.code, str(exc))
            return
        now = self.clock()
        kind = str(type(msg).__struct_config__.tag)  # the wire name: "save_report"
        self.stats.by_kind[kind] += 1
        if isinstance(msg, p.Hello):
            self.on_hello(identity, msg, now, peer_cred(parts[1]))
            return
        where = self.registry.peer(identity)
        if where is None:
            self.reject(
                identity,
                "unknown_peer",
                f"{kind} for job {msg.job!r} rank {msg.rank} from a connection that has not "
                "said hello (the daemon may have restarted): send hello again",
            )
            return
        job, rank = where
        if msg.job != job.id or msg.rank != rank.rank:
            self.reject(
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
            self.drains.on_report(job, rank, msg, now)
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
            return
        self.planner.decide(job, now)
        if now - rank.last_sent >= self.resend_after_s:
            self.planner.send_plan(rank, job, now)

    def on_hello(
        self, identity: bytes, msg: p.Hello, now: float, peer: PeerCred | None = None
    ) -> None:
        """Register the rank, choose the job's policy, welcome it and send it a plan."""
        if msg.rank >= msg.world_size:
            self.reject(
                identity,
                "invalid",
                f"hello: rank {msg.rank} is outside world_size {msg.world_size}",
            )
            return
        where = self.registry.peer(identity)
        if where is not None and (where[0].id, where[1].rank) != (msg.job, msg.rank):
            self.reject(
                identity,
                "wrong_job",
                f"this connection already said hello as job {where[0].id!r} rank "
                f"{where[1].rank}; open a new connection for job {msg.job!r} rank {msg.rank}",
            )
            return
        try:
            job, rank, kind = self.registry.hello(identity, msg, now, peer)
        except RegistryFull as exc:
            self.reject(identity, "busy", f"the daemon cannot take more ranks: {exc}")
            return
        except HelloRefused as exc:
            self.reject(identity, exc.code, str(exc))
            return
        if kind == "new":
            self.settings.new_job(job.id)
        bad_policy = self.planner.choose_policy(job, msg.policy, msg.rank)
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
        welcome = p.Welcome(v=p.VERSION, job=job.id, rank=rank.rank, daemon_version=__version__)
        self.transport.send_rank(rank, welcome, now)
        if kind in ("resume", "restart"):
            job.plan = None  # a new run: its ranks need a plan for their own steps
        if not self.planner.decide(job, now):
            self.planner.send_plan(rank, job, now)
        if bad_policy is not None:
            self.reject(identity, "bad_policy", bad_policy)
