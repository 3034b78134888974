"""The daemon's side of the admin socket: who may ask, and what each request does.

:class:`AdminHandler` takes one operator message (frames from the admin ROUTER),
checks the caller (:meth:`AdminHandler.allowed`: root, the daemon's own user, or a
member of ``daemon.admin_group``, read from the connection's kernel credentials),
decodes the request (:mod:`adaptd.protocol.admin`) and answers it: ``status``, ``history``,
``save-now``, ``set-policy``, ``pause``/``resume`` at once, ``drain`` when the drain
ends (:mod:`adaptd.daemon.admin.drains`). A refusal is an
:class:`~adaptd.protocol.admin.ErrorReply` with a code, counted as ``admin_<code>``. An
action on a job whose plan another host's daemon decides is relayed there through the
job's rank (:mod:`adaptd.daemon.jobs.ops`).
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
from collections.abc import Callable, Sequence

import zmq

from adaptd.core.policy import PolicyError
from adaptd.daemon.jobs.ops import NoRankToRelay
from adaptd.daemon.jobs.records import Job, PeerCred
from adaptd.daemon.logfmt import logfmt
from adaptd.daemon.parts import Core
from adaptd.daemon.transport import DaemonError, peer_cred
from adaptd.protocol import admin
from adaptd.state.records import SaveRecord

__all__ = ["AdminHandler", "HistorySource", "admin_gid"]

log = logging.getLogger("adaptd.server")

#: A job's saves for ``adaptd history``: ``(job, since, limit)`` -> the newest ``limit``
#: that ended at or after ``since`` (Unix seconds, ``None``: all), oldest first (the
#: state database's, :meth:`adaptd.state.store.Store.saves`).
HistorySource = Callable[[str, "float | None", int], Sequence[SaveRecord]]


def admin_gid(group: str | None) -> int | None:
    """The id of ``daemon.admin_group`` (``None``: no group). The group is looked up on
    this host when the daemon starts; raises :class:`~adaptd.daemon.transport.DaemonError`
    when it does not exist."""
    if not group:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise DaemonError(
            f"daemon.admin_group: no group {group!r} on this host; create it or remove the setting"
        ) from None


class AdminHandler:
    """Answers operator requests. ``admin_gid``: the group whose members may ask too."""

    def __init__(
        self,
        core: Core,
        *,
        admin_gid: int | None = None,
        history: HistorySource | None = None,
    ) -> None:
        self.core = core
        self.registry = core.registry
        self.ops = core.ops
        self.settings = core.settings
        self.drains = core.drains
        self.status = core.status
        self.transport = core.transport
        self.stats = core.stats
        self.clock = core.clock
        self.admin_gid = admin_gid
        self.history = history

    def on_frames(self, parts: list[zmq.Frame]) -> None:
        """One message from the admin socket: check, decode, answer (or defer: drain)."""
        self.stats.counters["admin_requests"] += 1
        frames = [f.bytes for f in parts]
        # REQ peers send [identity, b"", body]; DEALER peers [identity, body]
        if len(frames) == 3 and frames[1] == b"":
            envelope, body = frames[:2], frames[2]
        elif len(frames) == 2:
            envelope, body = frames[:1], frames[1]
        else:
            envelope, body = frames[:1], None
        try:
            self.allowed(peer_cred(parts[-1]))
            if body is None:
                raise admin.AdminError("invalid", f"expected one frame, got {len(frames) - 1}")
            reply = self.reply(admin.decode_request(body), envelope)
        except admin.AdminError as exc:
            self.core.refusals.count(f"admin_{exc.code}")
            log.warning(logfmt("operator_refused", code=exc.code, message=str(exc)))
            reply = admin.ErrorReply(code=exc.code, message=str(exc))
        if reply is not None:
            self.transport.send_admin(envelope, reply)

    def allowed(self, peer: PeerCred | None) -> None:
        """Raise ``AdminError("denied")`` unless the peer is root, the daemon's own user
        or (with an admin group) in the admin group.

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

    def reply(self, req: admin.AnyRequest, envelope: Sequence[bytes]) -> admin.AnyReply | None:
        """The reply to an operator's request, or ``None`` when it is sent later (drain)."""
        now = self.clock()
        if isinstance(req, admin.StatusRequest):
            return self.status.status(now)
        if isinstance(req, admin.DrainRequest):  # timeout_s checked by the decoder
            self.drains.start(envelope, req.timeout_s, req.reason, now)
            self.drains.check(now)
            return None
        if isinstance(req, admin.SetPolicyRequest):
            return self._set_policy(req, now)
        if isinstance(req, admin.PauseRequest):
            return self._pause(req, now)
        if isinstance(req, admin.SaveNowRequest):
            return self._save_now(req, now)
        if isinstance(req, admin.HistoryRequest):
            return self._history(req)
        raise admin.AdminError("invalid", f"unsupported request {type(req).__name__}")

    # ------------------------------------------------------------------ requests

    def _save_now(self, req: admin.SaveNowRequest, now: float) -> admin.SaveNowReply:
        if req.job is None:
            jobs = [j for j in self.registry if j.state == "active"]
        else:
            job = self.registry.jobs.get(req.job)
            if job is None or job.state != "active":
                active = sorted(j.id for j in self.registry if j.state == "active")
                shown = ", ".join(active[:20]) or "none"
                state = "unknown" if job is None else job.state
                raise admin.AdminError(
                    "unknown_job", f"job {req.job!r} is {state}; active jobs: {shown}"
                )
            jobs = [job]
        ranks = 0
        relayed = []
        for job in jobs:
            if job.decides:
                ranks += self.ops.save_now(job, req.reason, now)
            else:
                self._relay(job, "save_now", now, reason=req.reason)
                relayed.append(job.id)
        log.info(
            logfmt(
                "operator_action",
                action="save_now",
                job=req.job or "--all",
                jobs=len(jobs),
                ranks=ranks,
                relayed=",".join(relayed) or None,
                reason=req.reason,
            )
        )
        return admin.SaveNowReply(jobs=[j.id for j in jobs], ranks=ranks, relayed=relayed)

    def _relay(self, job: Job, op: str, now: float, *, spec: str = "", reason: str = "") -> str:
        try:
            return self.ops.relay(job, op, now, spec=spec, reason=reason)  # type: ignore[arg-type]
        except NoRankToRelay as exc:
            raise admin.AdminError("not_deciding", str(exc)) from None

    def _known_job(self, job_id: str) -> Job:
        job = self.registry.jobs.get(job_id)
        if job is None:
            known = sorted(j.id for j in self.registry)
            shown = ", ".join(known[:20]) or "none"
            raise admin.AdminError("unknown_job", f"job {job_id!r} is unknown; known jobs: {shown}")
        return job

    def _set_policy(self, req: admin.SetPolicyRequest, now: float) -> admin.SetPolicyReply:
        if req.clear or not req.spec:
            if not req.clear or req.spec:
                raise admin.AdminError("invalid", "set-policy: give a policy spec or clear")
            return self._clear_policy(req.job, now)
        job = self._known_job(req.job)
        if not job.decides:
            try:
                self.core.choice.check(req.spec)  # a bad spec is refused here, at once
            except PolicyError as exc:
                raise admin.AdminError("bad_policy", f"policy spec {req.spec!r}: {exc}") from None
            decider = self._relay(job, "set_policy", now, spec=req.spec)
            log.info(logfmt("operator_action", action="set_policy", job=job.id, policy=req.spec,
                            relayed_to=decider))  # fmt: skip
            return admin.SetPolicyReply(
                job=job.id, policy=req.spec, previous="", plan_seq=0, relayed_to=decider
            )
        try:
            previous, seq = self.ops.set_policy(job, req.spec, now)
        except PolicyError as exc:
            raise admin.AdminError("bad_policy", f"policy spec {req.spec!r}: {exc}") from None
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

    def _clear_policy(self, job_id: str, now: float) -> admin.SetPolicyReply:
        """``set-policy --clear``: the operator's policy taken back (here, where the job is
        decided; a job decided on another host is cleared there)."""
        job = self.registry.jobs.get(job_id)
        if job is None:
            if job_id not in self.settings:
                self._known_job(job_id)  # raises unknown_job
            before, after = self.settings.clear_policy(job_id, now)
            cleared, spec, source, seq = before if before != after else None, after or "", "", 0
        elif not job.decides:
            decider = job.agreed.decided_by if job.agreed is not None else ""
            raise admin.AdminError(
                "not_deciding",
                f"job {job_id!r} is decided by {decider or 'its chief (rank 0)'}'s daemon: "
                f"run `adaptd set-policy --job {job_id} --clear` on that host",
            )
        else:
            cleared, spec, source, seq = self.ops.clear_policy(job, now)
        log.info(logfmt("operator_action", action="clear_policy", job=job_id,
                        cleared=cleared, policy=spec or None, source=source or None,
                        plan_seq=seq))  # fmt: skip
        return admin.SetPolicyReply(job=job_id, policy=spec, previous=cleared or "",
                                    plan_seq=seq, cleared=cleared is not None,
                                    source=source)  # fmt: skip

    def _history(self, req: admin.HistoryRequest) -> admin.HistoryReply:
        """``adaptd history``: the job's saves from the state database."""
        if self.history is None:
            raise admin.AdminError(
                "no_history", "this daemon keeps no save history (it runs without a state "
                "database); `adaptd serve` keeps one in daemon.state_dir"
            )  # fmt: skip
        rows = list(self.history(req.job, req.since, req.limit + 1))  # one more: are there?
        if not rows and req.job not in self.registry.jobs:
            known = ", ".join(sorted(j.id for j in self.registry)[:20]) or "none"
            window = " since then" if req.since is not None else ""
            raise admin.AdminError(
                "unknown_job",
                f"job {req.job!r}: no saves in this daemon's history{window}, and no such job "
                f"here now (jobs here: {known})",
            )
        more = len(rows) > req.limit
        saves = [
            admin.HistorySave(
                ended=r.ended, step=r.step, rank=r.rank, reason=r.reason, ok=r.ok,
                blocking_s=r.blocking_s, durable_s=r.durable_s, bytes=r.bytes,
                extra_step_s=r.extra_step_s, error=r.error,
            )
            for r in rows[-req.limit :]
        ]  # fmt: skip
        return admin.HistoryReply(job=req.job, saves=saves, more=more)

    def _pause(self, req: admin.PauseRequest, now: float) -> admin.PauseReply:
        if req.job is not None:
            if req.job not in self.registry.jobs and req.job not in self.settings:
                self._known_job(req.job)  # raises unknown_job
            targets = [req.job]
        elif req.paused:
            targets = [j.id for j in self.registry if j.state == "active"]
        else:
            targets = self.settings.paused_jobs()
        changed, relayed = [], []
        op = "pause" if req.paused else "resume"
        for job_id in targets:
            job = self.registry.jobs.get(job_id)
            if job is not None and not job.decides:
                if job.state == "active":
                    self._relay(job, op, now)
                    relayed.append(job_id)
            elif self.ops.pause(job_id, req.paused, now):
                changed.append(job_id)
        log.info(
            logfmt(
                "operator_action",
                action=op,
                job=req.job or "--all",
                changed=",".join(changed) or "none",
                relayed=",".join(relayed) or None,
            )
        )
        return admin.PauseReply(
            jobs=changed, paused=req.paused, targets=len(targets), relayed=relayed
        )


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
