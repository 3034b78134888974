"""The daemon's side of the job socket: a frame in, the registry and the plans updated.

:class:`JobHandler` takes one message from the job ROUTER and

- validates it (:mod:`adaptd.protocol.job`: one frame, size, schema, version); a bad
  one gets an :class:`~adaptd.protocol.job.Error` reply where a reply is possible, is
  counted by code and becomes a :class:`~adaptd.events.MessageRejected`, never an
  exception (:class:`~adaptd.daemon.refusals.Refusals`);
- checks the connection: a report must come from the connection that said hello
  as that job and rank (the kernel's or CURVE's credentials,
  :func:`adaptd.daemon.transport.peer_cred`, decide who may take a rank);
- answers a rank's question for its job's configured settings, hello or not
  (:mod:`~adaptd.daemon.jobs.job_config`);
- hands it to the part that owns what it says: the
  :class:`~adaptd.daemon.jobs.registry.Registry` (hello, steps, save report, goodbye;
  what it learns goes to the sinks, the drains among them), the
  :class:`~adaptd.daemon.jobs.delivery.Delivery`
  (a hello's Welcome, an agreement round's acknowledgement, the liveness signal),
  the job's operator actions (a request relayed from another host);
- asks the :class:`~adaptd.daemon.jobs.planner.Planner` for a decision.

It is given the parts it works through by name (:func:`adaptd.daemon.assembly.build`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from adaptd.daemon.jobs import job_config
from adaptd.daemon.jobs.delivery import Delivery
from adaptd.daemon.jobs.ops import JobOps
from adaptd.daemon.jobs.planner import Planner
from adaptd.daemon.jobs.policy_choice import PolicyChoice
from adaptd.daemon.jobs.registry import HelloRefused, Registry, RegistryFull
from adaptd.daemon.jobs.stall_watch import StallWatch
from adaptd.daemon.jobs.table import Job, PeerCred, Rank
from adaptd.daemon.refusals import Refusals
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import Transport, peer_cred
from adaptd.logfmt import logfmt
from adaptd.protocol import job as p

__all__ = ["JobHandler"]

log = logging.getLogger("adaptd.server")


class JobHandler:
    """Handles the job socket's messages, one at a time, in the daemon's loop."""

    def __init__(
        self,
        *,
        transport: Transport,
        stats: DaemonStats,
        refusals: Refusals,
        clock: Callable[[], float],
        registry: Registry,
        choice: PolicyChoice,
        planner: Planner,
        delivery: Delivery,
        ops: JobOps,
        configured: job_config.JobConfigSource = job_config.nothing,
        stall: StallWatch | None = None,
    ) -> None:
        self.transport = transport
        self.stats = stats
        self.refusals = refusals
        self.clock = clock
        self.registry = registry
        self.choice = choice
        self.planner = planner
        self.delivery = delivery
        self.ops = ops
        #: A job's configured settings, for a rank that asks before its hello.
        self.configured = configured
        #: The watch for hung jobs (heartbeats and progress; None: no watch).
        self.stall = stall

    def reject(self, identity: bytes | None, code: str, message: str, *, counter: str = "") -> None:
        """Count, log (throttled) and answer a refused message with an Error (when the
        sender is known)."""
        self.refusals.refuse(counter or code, message, peer=(identity or b"").hex())
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
        if isinstance(msg, p.AskConfig):  # before the hello: no connection check
            self.transport.send(identity, self.configured(msg.job))
            return
        if isinstance(msg, p.Beat):  # its own connection: no hello on it
            self.on_beat(identity, msg, now, peer_cred(parts[1]))
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
            if self.stall is not None:
                self.stall.steps(job, msg, now)
            self.planner.reported(job, rank.rank, now)  # decides once all its ranks reported
        elif isinstance(msg, p.SaveReport):
            self._save_report(job, rank, msg, now)
            self.planner.decide(job, now)
        elif isinstance(msg, p.Goodbye):
            self.registry.goodbye(job, rank, msg, now)
            log.info(
                logfmt("goodbye", job=job.id, rank=rank.rank, step=msg.step, reason=msg.reason)
            )
            self.delivery.left(job, now)
            return
        elif self.on_agreement(identity, job, rank, msg, now):
            self.planner.decide(job, now)
        self.delivery.answer(job, rank, now)

    def on_beat(self, identity: bytes, msg: p.Beat, now: float, peer: PeerCred | None) -> None:
        """A rank's heartbeat, over a connection of its own: taken when the job and rank
        are known here and the connection is the same process as the rank's hello
        (where the kernel or CURVE says who it is)."""
        job = self.registry.jobs.get(msg.job)
        rank = job.ranks.get(msg.rank) if job is not None else None
        if job is None or rank is None:
            # a rank not (yet) registered here (the daemon restarted, or a stranger):
            # answered like any report from one, and the rank's heartbeat beats on
            # until its training thread's hello comes
            self.reject(
                identity,
                "unknown_peer",
                f"beat for job {msg.job!r} rank {msg.rank}, which has not said hello here "
                "(the daemon may have restarted): its hello comes first",
            )
            return
        if self.stall is None:
            return  # hang detection is off on this daemon: a beat is only taken
        known = rank.peer
        if (
            known is not None
            and peer is not None
            and (known.owner != peer.owner or (known.pid and peer.pid and known.pid != peer.pid))
        ):
            self.reject(
                identity,
                "wrong_job",
                f"beat for job {msg.job!r} rank {msg.rank} from a process that is not the one "
                "that said hello as it",
            )
            return
        self.registry.heard(job, rank, now)
        self.stall.beat(job, rank, identity, msg, now)

    def _save_report(self, job: Job, rank: Rank, msg: p.SaveReport, now: float) -> None:
        counted = self.registry.save_report(job, rank, msg, now)
        log.info(logfmt("save", job=job.id, rank=rank.rank, step=msg.step, ok=msg.ok,
                        blocking_s=msg.blocking_s, durable_s=msg.durable_s,
                        extra_step_s=msg.extra_step_s, bytes=msg.bytes, reason=msg.reason,
                        error=msg.error or None, counted=counted))  # fmt: skip

    def on_agreement(
        self, identity: bytes, job: Job, rank: Rank, msg: p.ClientMessage, now: float
    ) -> bool:
        """A message of a multi-rank job's agreement (docs/multiworker.md); returns
        whether the job's policy should run afterwards."""
        if isinstance(msg, p.SaveCost):
            self.registry.save_cost(job, rank, msg, now)
            return True
        if not isinstance(msg, (p.Ack, p.JobPlan, p.Request)):
            return True
        self.registry.heard(job, rank, now)
        if isinstance(msg, p.Ack):
            rank.reached(msg.step)
            self.delivery.acked(job, msg, now)
        elif isinstance(msg, p.JobPlan):
            if job.agree(msg):
                log.info(logfmt("job_plan", job=job.id, rank=rank.rank, at_step=msg.at_step,
                                next_step=msg.next_step, every_steps=msg.every_steps,
                                decided_by=msg.decided_by, source=msg.source))  # fmt: skip
        else:
            refused = self.ops.on_request(job, msg, now)
            if refused is not None:
                self.reject(identity, "refused", refused)
        return False

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
        bad_policy = self.choice.at_hello(job, msg.policy, msg.rank, kind)
        log.info(logfmt("hello", job=job.id, rank=msg.rank, world_size=msg.world_size,
                        pid=msg.pid, resumed_from=msg.resumed_from, kind=kind,
                        policy=job.policy_spec))  # fmt: skip
        if msg.restore_fallback:
            detail = msg.restore_fallback
            log.warning(logfmt("restore_fallback", job=job.id, rank=msg.rank,
                               resumed_from=msg.resumed_from, detail=detail))  # fmt: skip
        self.delivery.welcome(job, rank, now)
        pushed = job.decides and self.planner.decide(job, now)
        self.delivery.joined(job, rank, pushed, now)  # in rounds: the plan is proposed, not sent
        if bad_policy is not None:
            self.reject(identity, "bad_policy", bad_policy)
