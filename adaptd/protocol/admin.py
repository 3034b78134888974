"""The operator's request-reply protocol on the daemon's admin socket.

The admin socket (``adaptd.admin.sock`` beside the job socket, mode 0600) is separate
from the job socket so that the two can be guarded differently: any job may
report, only an operator may ask every job to save. Requests and replies are
msgspec structs over msgpack, tagged by ``op``, strictly validated like the job
protocol (:mod:`adaptd.protocol.job`) but versioned on their own.

The requests and replies below are those of the built-in operator commands; a new
command may define its own (a :class:`Request` and a :class:`Reply` subclass with a tag
of their own) in its module (:mod:`adaptd.commands`). The daemon accepts the requests of
the commands in its table, decoded by a :class:`RequestDecoder` over their types;
:func:`decode_request` decodes the built-in ones.

:func:`request` is the client side used by every operator command (``status``,
``history``, ``save-now``, ``drain``, ``set-policy``, ``pause``/``resume``): one REQ
socket per call, a deadline, never a hang. The daemon's side is
:mod:`adaptd.daemon.admin.handler`.
"""

from __future__ import annotations

import functools
import os
import typing as t
from pathlib import Path

import msgspec
import zmq

from adaptd.protocol import paths
from adaptd.protocol.job import MAX_MESSAGE_BYTES, JobId, Text

__all__ = [
    "ADMIN_VERSION",
    "DRAIN_TIMEOUT_S",
    "MAX_DRAIN_S",
    "MAX_HISTORY",
    "MAX_REQUEST_BYTES",
    "AdminError",
    "AnyReply",
    "AnyRequest",
    "DaemonInfo",
    "DrainJob",
    "DrainReply",
    "DrainRequest",
    "ErrorReply",
    "HistoryReply",
    "HistoryRequest",
    "HistorySave",
    "JobInfo",
    "JobSettings",
    "PauseReply",
    "PauseRequest",
    "PlanInfo",
    "RankInfo",
    "ReplicationInfo",
    "Reply",
    "Request",
    "RequestDecoder",
    "RoundsInfo",
    "SaveInfo",
    "SaveNowReply",
    "SaveNowRequest",
    "SetPolicyReply",
    "SetPolicyRequest",
    "StatusReply",
    "StatusRequest",
    "admin_path",
    "decode_reply",
    "decode_request",
    "encode",
    "request",
]

#: Admin protocol version; bump on an incompatible change.
ADMIN_VERSION = 1
#: Largest admin request the daemon accepts. Replies (status) may be larger.
MAX_REQUEST_BYTES = MAX_MESSAGE_BYTES
#: Longest drain an operator may ask for (a day); the decoder refuses NaN and inf too.
MAX_DRAIN_S = 86_400.0
#: How long a drain waits for the jobs' saves unless the operator says (``--timeout``).
DRAIN_TIMEOUT_S = 300.0
#: Most saves one ``history`` reply lists (the newest ones).
MAX_HISTORY = 10_000


class Request(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="op", forbid_unknown_fields=True
):
    v: int = ADMIN_VERSION


class StatusRequest(Request, frozen=True, tag="status"):
    """Everything the daemon knows about its jobs, and its own counters."""


class SaveNowRequest(Request, frozen=True, tag="save_now"):
    """Ask one job (``job``) or every active job (``job=None``) to save at its next step."""

    job: JobId | None = None
    reason: Text = "operator request"


class DrainRequest(Request, frozen=True, tag="drain"):
    """Every active job saves at its next step; the reply waits until all those saves are
    durable (or failed, or their job gone) or ``timeout_s`` has passed.

    The daemon defers its reply (it keeps serving meanwhile), so the caller's own
    deadline must exceed ``timeout_s``.
    """

    timeout_s: t.Annotated[float, msgspec.Meta(gt=0, le=MAX_DRAIN_S)] = DRAIN_TIMEOUT_S
    reason: Text = "drain"


class SetPolicyRequest(Request, frozen=True, tag="set_policy"):
    """Give a known job a new policy ``spec`` (parsed by :func:`adaptd.core.policy.parse`);
    its new plan is pushed to its ranks at once. ``clear`` (with no ``spec``) takes the
    operator's policy back: the job gets what it would have without one (the config's
    ``[jobs]`` policy, else its own spec, else the daemon's default)."""

    job: JobId
    spec: Text = ""
    clear: bool = False


class PauseRequest(Request, frozen=True, tag="pause"):
    """Hold (``paused=True``) or release the non-urgent saves of one job, or of every
    job (``job=None``: every active job to pause, every paused job to resume)."""

    job: JobId | None = None
    paused: bool = True


class HistoryRequest(Request, frozen=True, tag="history"):
    """One job's saves, oldest first: the newest ``limit`` of those that ended at or
    after ``since`` (Unix seconds; ``None``: all the daemon keeps)."""

    job: JobId
    since: t.Annotated[float, msgspec.Meta(ge=0)] | None = None
    limit: t.Annotated[int, msgspec.Meta(ge=1, le=MAX_HISTORY)] = 100


AnyRequest = t.Union[  # noqa: UP007
    StatusRequest, SaveNowRequest, DrainRequest, SetPolicyRequest, PauseRequest, HistoryRequest
]


class JobSettings(msgspec.Struct, frozen=True):
    """What an operator set for one job; kept across daemon restarts by the caller's store.

    ``policy``: the spec set by ``adaptd set-policy`` (``None``: the job's own or the
    daemon's default). ``paused``: ``adaptd pause`` holds its non-urgent saves.
    """

    policy: str | None = None
    paused: bool = False


# ------------------------------------------------------------------ replies


class Reply(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    """A reply ignores fields it does not know: a newer daemon's reply carries fields
    this command never shows, and it must still read the rest (a command and a daemon
    one release apart talk). Requests stay strict: an older daemon must not drop an
    option it does not know and answer as if it had done what was asked."""

    v: int = ADMIN_VERSION


class RankInfo(msgspec.Struct, frozen=True):
    rank: int
    pid: int
    hostname: str
    alive: bool
    step: int
    last_seen_s: float  # seconds since its last message
    lost_reason: str = ""


class PlanInfo(msgspec.Struct, frozen=True):
    seq: int
    next_step: int | None
    every_steps: int | None
    policy: str
    reason: str
    interval_s: float | None = None
    waste: float | None = None
    durable_every: int | None = None  # two tiers: every k-th save durable (None: one tier)


class SaveInfo(msgspec.Struct, frozen=True):
    step: int
    ok: bool
    blocking_s: float
    durable_s: float
    bytes: int
    extra_step_s: float
    age_s: float  # seconds since the report arrived
    rank: int = 0
    error: str = ""
    reason: str = ""


class RoundsInfo(msgspec.Struct, frozen=True):
    """The daemon's agreement rounds of one job: decided so far, and the one in flight."""

    committed: int
    aborted: int
    open_round: int | None = None
    open_action: str = ""
    open_at_step: int | None = None
    waiting_for: list[int] = []  # live ranks that have not answered the open round


class JobInfo(msgspec.Struct, frozen=True):
    job: str
    state: str  # active | lost | finished
    world_size: int
    ranks: list[RankInfo]
    step: int
    start_step: int
    step_time_s: float | None
    policy: str
    plan: PlanInfo | None
    next_save_step: int | None  # the plan's next save after the current step
    saves: int
    failed_saves: int
    save_cost_s: float | None
    save_latency_s: float | None
    last_save: SaveInfo | None
    last_durable_step: int | None
    waste: float | None  # the policy's predicted waste (newest decision)
    restore_s: float | None
    failures: int
    incarnation: int
    checkpoint_dir: str
    urgent: str | None = None
    # of the failures, those a just-in-time save covered (the job resumed from one), and
    # the share the daemon plans with (None: no failure seen)
    failures_covered: int = 0
    jit_coverage: float | None = None
    lost_reason: str = ""
    lost_s: float | None = None  # seconds since it was lost
    paused: bool = False  # ``adaptd pause``: non-urgent saves held
    policy_set: bool = False  # the policy was set by ``adaptd set-policy``
    # the run resumed from an older checkpoint: the damaged newer one(s) and why
    restore_fallback: str = ""
    # How the job's ranks agree on save steps (docs/multiworker.md): "none" (one rank),
    # "daemon" (this daemon's rounds) or "coordination" (tf.distribute, rank 0 leads).
    agreement: str = "none"
    # Which host decides the job's plan: this daemon's host when ``decided_here``, else
    # the host the ranks' agreed plan names ("" until a rank reported one). A job has
    # one plan, decided on one host; the others show it and relay requests there.
    decided_by: str = ""
    decided_here: bool = True
    plan_from_step: int | None = None  # the agreed plan is in force from this step
    rounds: RoundsInfo | None = None  # the daemon's agreement rounds (agreement "daemon")
    # Hang detection (a job of several ranks this daemon decides, docs/multiworker.md):
    # the silence past which it is taken for stalled (None: not judged now), why, the
    # silence now, and whether it was judged stalled (its ranks were told to abort)
    stall_threshold_s: float | None = None
    stall_reason: str = ""
    stall_silent_s: float | None = None
    stalled: bool = False


class DaemonInfo(msgspec.Struct, frozen=True):
    version: str
    pid: int
    socket: str
    admin_socket: str
    default_policy: str
    uptime_s: float
    messages: int  # frames received on the job socket
    by_kind: dict[str, int]
    rejected: dict[str, int]  # by error code
    sent: int
    send_dropped: int  # replies dropped (peer gone or its queue full)
    plans_sent: int
    policy_errors: int
    sink_errors: int
    jobs_active: int
    jobs_lost: int
    peers: int


class ReplicationInfo(msgspec.Struct, frozen=True):
    """One job's replication to one destination (tiered storage, docs/tiers.md).

    ``seconds_behind``: how long the destination has lacked a checkpoint that exists
    locally (the age of the oldest local save newer than its newest replicated step;
    0 when up to date). ``pending_bytes``: what is left of the running upload plus
    the queued one. Throughputs in bytes/s: the running upload's and the last one's.
    """

    destination: str
    job: str
    url: str
    last_step: int | None  # newest step replicated there (its LATEST)
    uploading_step: int | None
    pending_step: int | None  # queued behind the running upload or other jobs
    pending_uploads: int
    pending_bytes: int
    seconds_behind: float
    throughput_bytes_s: float | None
    last_throughput_bytes_s: float | None
    uploaded_bytes: int
    uploads: int
    failures: int
    skipped: int  # deleted locally before upload, or already there
    yields: int  # times an upload paused for a job's save on the same disk
    yielding: bool = False
    last_error: str = ""
    last_error_age_s: float | None = None
    next_retry_s: float | None = None


class StatusReply(Reply, frozen=True, tag="status"):
    daemon: DaemonInfo
    jobs: list[JobInfo]
    #: the host's newest telemetry (``adaptd.telemetry.report.to_dict``), when wired
    telemetry: dict[str, t.Any] | None = None
    #: per job and destination, when the daemon replicates checkpoints (tiered storage)
    replication: list[ReplicationInfo] | None = None


class SaveNowReply(Reply, frozen=True, tag="save_now"):
    jobs: list[str]  # the jobs asked to save
    ranks: int  # how many ranks were asked (sent SaveNow, or a round proposed to them)
    #: jobs decided on another host: the request went there through their rank (Relay)
    relayed: list[str] = []


class DrainJob(msgspec.Struct, frozen=True):
    """One job's part of a drain: the step it saved, whether that save is durable."""

    job: str
    ranks: int  # ranks asked to save
    step: int | None  # the saved step (``None``: no save reported)
    durable: bool  # every asked rank reported that save durable
    seconds: float  # from the request to the last rank's report (or to the end)
    error: str = ""  # why not durable: a failed save, the job lost, the timeout


class DrainReply(Reply, frozen=True, tag="drain"):
    jobs: list[DrainJob]
    seconds: float
    timed_out: bool


class SetPolicyReply(Reply, frozen=True, tag="set_policy"):
    job: str
    policy: str  # the spec in force now ("" for a job not running here)
    previous: str
    plan_seq: int  # the plan pushed with the new policy (0: the job has no live ranks)
    #: the job is decided on another host: the request was relayed to it (who decides)
    relayed_to: str = ""
    #: ``clear``: the operator's policy taken back (``previous``; "" when none was set),
    #: and where the one in force now comes from ("config", "job", "default")
    cleared: bool = False
    source: str = ""


class HistorySave(msgspec.Struct, frozen=True):
    """One rank's save as the daemon's state database keeps it (times: Unix seconds)."""

    ended: float  # when it was reported durable (or failed)
    step: int
    rank: int
    reason: str
    ok: bool
    blocking_s: float
    durable_s: float
    bytes: int
    extra_step_s: float = 0.0
    error: str = ""
    tier: str = ""  # "local": saved to the job's local tier only, not made durable


class HistoryReply(Reply, frozen=True, tag="history"):
    job: str
    saves: list[HistorySave]  # oldest first; the newest ``limit`` when ``more``
    more: bool = False  # older saves in the window were left out (the request's limit)


class PauseReply(Reply, frozen=True, tag="pause"):
    jobs: list[str]  # the jobs whose setting changed
    paused: bool
    targets: int = 0  # the jobs asked about (--all: every active job, or every paused one)
    relayed: list[str] = []  # jobs decided on another host: relayed there (Relay)


class ErrorReply(Reply, frozen=True, tag="error"):
    code: str
    message: str


AnyReply = t.Union[  # noqa: UP007
    StatusReply, SaveNowReply, DrainReply, SetPolicyReply, PauseReply, HistoryReply, ErrorReply
]

_encoder = msgspec.msgpack.Encoder()
_reply_decoder = msgspec.msgpack.Decoder(AnyReply)


class AdminError(Exception):
    """An admin request failed: no daemon, no answer in time, or an error reply.

    ``code`` is ``no_daemon``, ``timeout``, ``bad_reply`` or the daemon's error code.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def encode(msg: Request | Reply) -> bytes:
    """A message as it crosses the admin socket.

    A request carries only the fields its sender set away from their defaults (and
    always ``op`` and ``v``): a daemon one release older refuses fields it does not know
    (requests are strict), so a field added since, left at its default (``set-policy``'s
    ``clear=False``), must not be sent. A reply is sent whole (readers ignore the
    fields they do not know)."""
    if not isinstance(msg, Request):
        return _encoder.encode(msg)
    config = type(msg).__struct_config__
    out: dict[str, t.Any] = {str(config.tag_field): config.tag, "v": msg.v}
    for f in msgspec.structs.fields(msg):
        value = getattr(msg, f.name)
        if f.encode_name != "v" and (f.default is msgspec.NODEFAULT or value != f.default):
            out[f.encode_name] = value
    return _encoder.encode(out)


class RequestDecoder:
    """Decodes an operator's request of one of ``types`` (each a :class:`Request` with a
    tag of its own); strict: a field it does not know is refused."""

    def __init__(self, types: t.Iterable[type[Request]]) -> None:
        self.types = tuple(types)
        self._decoder = msgspec.msgpack.Decoder(t.Union[self.types])  # type: ignore[arg-type]  # noqa: UP007

    def decode(self, frame: bytes) -> Request:
        """Raises :class:`AdminError` (``invalid``, ``too_large``, ``version``)."""
        if len(frame) > MAX_REQUEST_BYTES:
            raise AdminError(
                "too_large", f"request of {len(frame)} bytes exceeds {MAX_REQUEST_BYTES}"
            )
        try:
            req = self._decoder.decode(frame)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise AdminError("invalid", f"invalid admin request: {exc}") from None
        if req.v != ADMIN_VERSION:
            raise AdminError(
                "version",
                f"admin protocol {req.v} is not supported (the daemon speaks {ADMIN_VERSION})",
            )
        return req


_built_in = RequestDecoder(t.get_args(AnyRequest))


def decode_request(frame: bytes) -> AnyRequest:
    """Decode an operator's request of a built-in command; raises :class:`AdminError`
    (``invalid``, ``too_large``, ``version``)."""
    return _built_in.decode(frame)  # type: ignore[return-value]


def decode_reply(frame: bytes, reply: type[Reply] | None = None) -> Reply:
    """A reply of the daemon: one of the built-in ones, or ``reply`` (or an
    :class:`ErrorReply`). Raises :class:`AdminError` (``bad_reply``)."""
    decoder = _reply_decoder if reply is None else _decoder_of(reply)
    try:
        return decoder.decode(frame)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise AdminError("bad_reply", f"the daemon's reply could not be read: {exc}") from None


@functools.cache
def _decoder_of(reply: type[Reply]) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(t.Union[reply, ErrorReply])  # type: ignore[valid-type]  # noqa: UP007


def admin_path(job_socket: str | os.PathLike[str]) -> Path:
    """The admin socket of the daemon serving ``job_socket``
    (:func:`adaptd.protocol.paths.admin_socket_path`)."""
    return paths.admin_socket_path(job_socket)


def request(
    job_socket: str | os.PathLike[str],
    req: Request,
    timeout_s: float = 3.0,
    reply: type[Reply] | None = None,
) -> Reply:
    """Send ``req`` to the daemon serving ``job_socket`` and return its reply (one of the
    built-in replies, or of type ``reply``: a command's own).

    Raises :class:`AdminError`: ``no_daemon`` when the admin socket file is absent,
    ``timeout`` when nothing answers within ``timeout_s`` (a stale socket file, or
    a daemon that hangs), or the daemon's own error code for an :class:`ErrorReply`.
    """
    path = admin_path(job_socket)
    if not path.exists():
        raise AdminError("no_daemon", f"no adaptd daemon is running (no socket at {path})")
    if not os.access(path, os.R_OK | os.W_OK):
        raise AdminError(
            "denied", f"no permission to use {path} (run as its owner, root or the admin group)"
        )
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"ipc://{path}")
        sock.send(encode(req))
        if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            raise AdminError(
                "timeout",
                f"the adaptd daemon at {path} did not answer within {timeout_s:g}s "
                "(stale socket, or the daemon is stuck)",
            )
        answer = decode_reply(sock.recv(), reply)
    finally:
        sock.close(linger=0)
    if isinstance(answer, ErrorReply):
        raise AdminError(answer.code, answer.message)
    return answer
