"""The daemon's side of the job socket: a frame in, the registry and the plans updated.

:class:`JobHandler` takes one message from the job ROUTER and

- validates it (:mod:`adaptd.protocol.job`: one frame, size, schema, version); a bad
  one gets an :class:`~adaptd.protocol.job.Error` reply where a reply is possible, is
  counted by code and becomes a :class:`~adaptd.daemon.events.MessageRejected`, never an
  exception;
- checks the connection: a report must come from the connection that said hello
  as that job and rank (the kernel's or CURVE's credentials,
  :func:`adaptd.daemon.transport.peer_cred`,
  decide who may take a rank);
- hands it to the :class:`~adaptd.daemon.jobs.registry.Registry` (hello, steps, save report,
  goodbye) and to the drains waiting for saves;
- asks the :class:`~adaptd.daemon.jobs.planner.Planner` for a decision, and re-sends the current
  plan to a rank that reports after :data:`RESEND_AFTER_S` without hearing from the
  daemon (the client's liveness signal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from adaptd import __version__
from adaptd.daemon import events as ev
from adaptd.daemon.admin.drains import Drains
from adaptd.daemon.jobs.ops import JobOps
from adaptd.daemon.jobs.planner import Planner
from adaptd.daemon.jobs.records import Job, PeerCred, Rank
from adaptd.daemon.jobs.registry import HelloRefused, Registry, RegistryFull
from adaptd.daemon.jobs.rounds import Agreements
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.logfmt import Throttle, logfmt
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import Transport, peer_cred
from adaptd.protocol import job as p

__all__ = ["RESEND_AFTER_S", "JobHandler"]

log = logging.getLogger("adaptd.server")

#: A rank that sends anything (but a Goodbye) after this long without hearing from the
#: daemon gets the plan (or its Welcome) again: the daemon's half of the liveness
#: contract (:data:`adaptd.protocol.job.KEEPALIVE_S`).
RESEND_AFTER_S = p.KEEPALIVE_S


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
        agreements: Agreements | None = None,
        ops: JobOps | None = None,
    ) -> None:
        self.registry = registry
        self.agreements = agreements
        self.ops = ops
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
        # a SaveCost names the rank whose cost it is: the chief forwards the others'
        other_rank = isinstance(msg, p.SaveCost)
        if msg.job != job.id or (msg.rank != rank.rank and not other_rank):
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
            if self.agreements is not None and job.runs_rounds:
                self.agreements.check(job, now)  # a round no longer waits for it
            return
        elif not self.on_agreement(identity, job, rank, msg, now):
            self.answer(job, rank, now)
            return
        self.planner.decide(job, now)
        self.answer(job, rank, now)

    def answer(self, job: Job, rank: Rank, now: float) -> None:
        """The client's sign that its daemon is alive: the plan again (or the Welcome, for
        a rank sent no plans) unless the rank heard from the daemon within
        ``resend_after_s``. Every message but a Goodbye is answered so: an Ack or a
        JobPlan may be the one the client times (:data:`adaptd.protocol.job.KEEPALIVE_S`)."""
        if now - rank.last_sent >= self.resend_after_s:
            self.planner.send_plan(rank, job, now)

    def on_agreement(
        self, identity: bytes, job: Job, rank: Rank, msg: p.ClientMessage, now: float
    ) -> bool:
        """A message of a multi-rank job's agreement (docs/multiworker.md); returns
        whether the job's policy should run afterwards."""
        if isinstance(msg, p.Ack):
            self.registry.heard(job, rank, now)
            rank.step = max(rank.step, msg.step)
            if self.agreements is not None and job.runs_rounds:
                self.agreements.on_ack(job, msg, now)
            return False
        if isinstance(msg, p.SaveCost):
            self.registry.save_cost(job, rank, msg, now)
        elif isinstance(msg, p.JobPlan):
            self.registry.heard(job, rank, now)
            if job.agreed is None or (job.agreed.at_step, job.agreed.next_step) != (
                msg.at_step,
                msg.next_step,
            ):
                log.info(logfmt("job_plan", job=job.id, rank=rank.rank, at_step=msg.at_step,
                                next_step=msg.next_step, every_steps=msg.every_steps,
                                decided_by=msg.decided_by, source=msg.source))  # fmt: skip
            job.agreed = msg
            return False
        elif isinstance(msg, p.Request):
            self.registry.heard(job, rank, now)
            refused = self.ops.on_request(job, msg, now) if self.ops is not None else "no ops"
            if refused is not None:
                self.reject(identity, "refused", refused)
            return False
        return True

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
        if msg.restore_fallback:
            log.warning(
                logfmt(
                    "restore_fallback",
                    job=job.id,
                    rank=msg.rank,
                    resumed_from=msg.resumed_from,
                    detail=msg.restore_fallback,
                )
            )
        welcome = p.Welcome(v=p.VERSION, job=job.id, rank=rank.rank, daemon_version=__version__)
        self.transport.send_rank(rank, welcome, now)
        if kind in ("resume", "restart"):
            job.plan = None  # a new run: its ranks need a plan for their own steps
        if job.runs_rounds and self.agreements is not None:
            self.planner.decide(job, now)
            self.agreements.on_hello(job, rank, now)  # the plan is proposed, not sent
        elif job.decides and not self.planner.decide(job, now):
            self.planner.send_plan(rank, job, now)
        if bad_policy is not None:
            self.reject(identity, "bad_policy", bad_policy)
