"""The daemon's side of the admin socket: who may ask, and which command answers.

:class:`AdminHandler` takes one operator message (frames from the admin ROUTER),
checks the caller (:meth:`AdminHandler.allowed`: root, the daemon's own user, or a
member of ``daemon.admin_group``, read from the connection's kernel credentials),
decodes the request as one of the operator requests in the table
(:class:`~adaptd.daemon.admin.commands.OperatorCommands`) and has its answer run
(``status``, ``history``, ``save-now``, ``set-policy``, ``pause``/``resume`` at once,
``drain`` when the drain ends: :mod:`adaptd.daemon.admin.answers`). A refusal is an
:class:`~adaptd.protocol.admin.ErrorReply` with a code, counted as ``admin_<code>``.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
from collections.abc import Callable

import zmq

from adaptd.daemon.admin.commands import OperatorCommands
from adaptd.daemon.admin.context import AdminContext, HistorySource
from adaptd.daemon.admin.drains import Drains
from adaptd.daemon.admin.status import StatusView
from adaptd.daemon.jobs.ops import JobOps
from adaptd.daemon.jobs.policy_choice import PolicyChoice
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.jobs.table import PeerCred
from adaptd.daemon.refusals import Refusals
from adaptd.daemon.stats import DaemonStats
from adaptd.daemon.transport import DaemonError, Transport, peer_cred
from adaptd.logfmt import logfmt
from adaptd.protocol import admin

__all__ = ["AdminHandler", "HistorySource", "admin_gid"]

log = logging.getLogger("adaptd.server")


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
    """Answers operator requests. ``commands``: the operator commands it answers;
    ``admin_gid``: the group whose members may ask too; ``history``: the saves
    ``adaptd history`` shows (``None``: refused)."""

    def __init__(
        self,
        *,
        transport: Transport,
        stats: DaemonStats,
        refusals: Refusals,
        clock: Callable[[], float],
        registry: Registry,
        ops: JobOps,
        drains: Drains,
        choice: PolicyChoice,
        settings: OperatorSettings,
        status: StatusView,
        commands: OperatorCommands,
        admin_gid: int | None = None,
        history: HistorySource | None = None,
    ) -> None:
        self.transport = transport
        self.stats = stats
        self.refusals = refusals
        self.clock = clock
        # what each request's answer works through (:class:`AdminContext`)
        self.registry, self.ops, self.drains = registry, ops, drains
        self.choice, self.settings, self.status = choice, settings, status
        self.commands = commands
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
            req = self.commands.decode(body)
            ctx = AdminContext(
                registry=self.registry, ops=self.ops, drains=self.drains, choice=self.choice,
                settings=self.settings, status=self.status, history=self.history,
                envelope=envelope, now=self.clock(),
            )  # fmt: skip
            reply = self.commands.answer(req, ctx)
        except admin.AdminError as exc:
            self.refusals.count(f"admin_{exc.code}")
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
