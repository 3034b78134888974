"""The wire protocol between the training-loop hook and the daemon.

Messages are typed, versioned msgspec structs encoded as msgpack. Each is tagged
by its ``kind`` field; decoding is strict (wrong types, unknown kinds, missing
fields and oversized frames are rejected with :class:`ProtocolError`), so the
daemon validates every message before it looks at it. Nothing is ever unpickled.

Client -> daemon: :class:`Hello`, :class:`Steps`, :class:`SaveReport`, :class:`Goodbye`,
:class:`AskConfig` (answered by :class:`JobConfig`: the job's configured local tier),
:class:`Beat` (a rank's heartbeat thread, over a connection of its own),
and for jobs of several ranks :class:`Ack`, :class:`JobPlan`, :class:`Request`,
:class:`SaveCost` (the chief forwards another rank's cost of a save: δ of a job is
its slowest rank's; accepted from any rank of the job, since it names another rank).
Daemon -> client: :class:`Welcome`, :class:`Plan`, :class:`SaveNow`, :class:`Error`,
:class:`Abort` (the job stalled: free the survivors, answering a :class:`Beat`),
and for jobs of several ranks :class:`Propose`, :class:`Decide`, :class:`Relay`.

A message whose ``v`` differs from :data:`VERSION` is refused with an error reply
naming both versions.

Version 2 added the agreement of jobs with several ranks (docs/multiworker.md):
:class:`Propose`, :class:`Ack` and :class:`Decide` are one round of it (a change takes
effect at a step every rank acknowledged before reaching it). The daemon runs these
rounds for ranks without a coordination runtime of their own; ranks under
``tf.distribute`` run the same rounds, with the same records (JSON-encoded, see
:func:`encode_json`), on TensorFlow's coordination service, and tell their daemon
the plan agreed (:class:`JobPlan`). An operator request made on a host whose daemon
does not decide the job's plan travels to the deciding host in-band: the daemon
hands it to its ranks (:class:`Relay`), the job's chief hands it to its own daemon
(:class:`Request`). A version-1 client would switch plans on arrival, which is what
broke agreement, so it is refused rather than served.

Hang detection (docs/multiworker.md) added :class:`Beat` and :class:`Abort` within
version 2, as :class:`AskConfig` was: a daemon older than them refuses a Beat (an
:class:`Error`, code ``invalid``) and the hook's heartbeat stops; a hook older than
them never beats, so it is never sent an Abort.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "KEEPALIVE_S",
    "LIVENESS_TIMEOUT_S",
    "MAX_MESSAGE_BYTES",
    "MAX_OFFERED",
    "MAX_TEXT",
    "REPORT_INTERVAL_S",
    "ROUND_TIMEOUT_S",
    "TIER_NAMES",
    "VERSION",
    "Abort",
    "Ack",
    "Action",
    "AgreementKind",
    "AskConfig",
    "Beat",
    "ClientMessage",
    "Count",
    "DaemonMessage",
    "Decide",
    "Error",
    "Every",
    "Figure",
    "Goodbye",
    "Hello",
    "JobConfig",
    "JobId",
    "JobPlan",
    "Message",
    "Operation",
    "Plan",
    "Propose",
    "ProtocolError",
    "RankMessage",
    "Relay",
    "Request",
    "RestoreOffer",
    "Restored",
    "SaveCost",
    "SaveNow",
    "SaveReport",
    "Seconds",
    "Steps",
    "Text",
    "Tier",
    "Welcome",
    "decode_client",
    "decode_daemon",
    "decode_rank",
    "encode",
    "encode_json",
    "tier_name",
]

#: Protocol version. Bump on any incompatible change.
VERSION = 2
#: The liveness contract. A daemon answers any message of a known rank that it has
#: sent nothing for this long (the plan again, or the Welcome for a rank sent no plans);
#: so a client counts silence only from a send made this long after the newest message
#: it received: a send the daemon must answer. (A client that counted from any send
#: would take a live daemon with nothing new to say for dead whenever its timeout is
#: shorter than this plus its report interval.)
KEEPALIVE_S = 2.0
#: How often a rank reports its steps by default (the hook's ``report_interval``): the
#: daemon's view of a rank's step may be this far behind, so a daemon's round proposes
#: at least this far ahead.
REPORT_INTERVAL_S = 1.0
#: A rank silent this long is taken for gone by default (the daemon's
#: ``daemon.liveness_timeout_s``, ``serve --silence-timeout``).
LIVENESS_TIMEOUT_S = 300.0
#: Bound on a daemon's agreement round (:mod:`adaptd.core.rounds`), both ways: the
#: daemon counts a rank that has not answered by then as missing, and a rank holding at
#: the round's step waits that long for the decision before it counts the round aborted.
ROUND_TIMEOUT_S = 10.0
#: Largest frame either side accepts. Real messages are a few hundred bytes.
MAX_MESSAGE_BYTES = 64 * 1024
#: Longest free-text field (reasons, error text, paths).
MAX_TEXT = 4096
#: The ``reason`` of a just-in-time save's :class:`SaveReport` (a survivor saved the last
#: completed step after a peer failed): the daemon counts it apart from the periodic
#: saves' cost, and a job that resumes from it had its failure covered.
JIT_REASON = "just-in-time"
#: Largest count or step: SQLite's INTEGER (and int64) limit. A larger one would be
#: accepted and then make every later write of the daemon's store fail.
MAX_COUNT = 2**63 - 1
#: Longest duration a message may carry (about 32 years). Durations must be finite:
#: one ``inf`` step time or save cost would stay in a job's estimates for good.
MAX_SECONDS = 1e9
#: Shortest step a report may claim (0 means unmeasured): intervals are divided by
#: the step time, and a step of 1e-300 s plans saves beyond any integer.
MIN_STEP_S = 1e-9
#: Most ranks a job may have, and GPUs one rank may use: a job's GPU count weighs in
#: the host's failure rate, so an absurd one would move every job's plan.
MAX_RANKS = 2**20
MAX_RANK_GPUS = 1024

_Text = msgspec.Meta(max_length=MAX_TEXT)
_Id = msgspec.Meta(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:@+-]*$")

import typing as _t  # noqa: E402  (kept next to the aliases it builds)

JobId = _t.Annotated[str, _Id]
Text = _t.Annotated[str, _Text]
Count = _t.Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
#: A measured duration: finite, >= 0 (msgspec refuses NaN and -inf with ``ge``).
Seconds = _t.Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
#: A figure the daemon computed for a plan, shown to the user only: >= 0, may be inf
#: (a policy plugin's "never"), so refusing it would not drop the whole plan.
Figure = _t.Annotated[float, msgspec.Meta(ge=0)]
Every = _t.Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
AgreementKind = _t.Literal["none", "daemon", "coordination"]
#: What one agreement round changes: the plan from ``at_step`` on; one save at
#: ``at_step``; one save at ``at_step`` and then the job stops (a rank got SIGTERM).
Action = _t.Literal["plan", "save", "stop"]
#: Operator requests that travel to the host deciding a job's plan.
Operation = _t.Literal["set_policy", "pause", "resume", "save_now"]
#: Where a save went, or a run was restored from (two tiers, docs/tiers.md): "" is the
#: job's durable checkpoint directory (the only tier before), "local" its local tier.
Tier = _t.Literal["", "local"]


#: The tiers' names for people and metrics (:func:`tier_name`).
TIER_NAMES = ("local", "durable")


def tier_name(tier: str) -> str:
    """A save's tier as people and metrics name it: ``"local"``, or ``"durable"`` for the
    checkpoint directory (``""``)."""
    return "local" if tier == "local" else "durable"


class Message(
    msgspec.Struct, frozen=True, tag_field="kind", forbid_unknown_fields=True, omit_defaults=True
):
    """Base of every message: ``v`` is the protocol version.

    A field left at its default is not sent (``omit_defaults``): a message that needs
    none of the fields added since a daemon was built is the message it knows.
    """

    v: int


# ------------------------------------------------------------------ client -> daemon


class Hello(Message, frozen=True, tag="hello"):
    """A rank of a job announces itself; the daemon answers Welcome then Plan."""

    job: JobId
    rank: Count = 0
    world_size: _t.Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)] = 1
    pid: Count = 0
    checkpoint_dir: Text = ""
    state_bytes: Count = 0
    resumed_from: Count = 0  # the step this run continues from (0: fresh)
    gpus: _t.Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK_GPUS)] = 0  # 0: none/unknown
    policy: Text = ""  # a policy spec the job insists on ("" = the daemon's choice)
    hostname: Text = ""
    # the newest checkpoint was damaged and the run resumed from an older one: which,
    # and why ("" = resumed from the newest, or started fresh)
    restore_fallback: Text = ""
    # How the job's ranks agree on save steps: "none" (one rank), "daemon" (ranks
    # without a runtime of their own: the daemon runs Propose/Ack/Decide rounds) or
    # "coordination" (tf.distribute: the ranks agree among themselves, rank 0 leads)
    agreement: AgreementKind = "none"
    # Two tiers (docs/tiers.md): the job saves to a local tier beside its directory
    # ("memory": host memory, "disk": local disk; "" none), and which tier this run
    # restored from ("" durable, or fresh). Left out when unused, so an older daemon
    # reads the hello it knows.
    local_tier: _t.Literal["", "memory", "disk"] = ""
    resumed_tier: Tier = ""
    # the run found a local tier copy of the previous run on this host (a restart in
    # place after a process failure); False: it was gone, or the run is on a new host
    local_intact: bool = False


class Steps(Message, frozen=True, tag="steps"):
    """A batch of step timings since the previous report.

    ``max_s`` and ``max_steps`` name the batch's slowest ``step()`` call (its seconds
    and the steps it covered), so the daemon can leave one slow step (a retrace) out
    of the job's pace; ``warmup`` says the batch holds the run's first step (tracing,
    compiling), which is never the job's pace. Older clients send none of them.
    """

    job: JobId
    rank: Count
    step: Count  # newest completed step
    count: Count  # steps in this batch
    mean_s: Seconds
    max_s: Seconds = 0.0  # the slowest step() call of the batch (0: not measured)
    save_in_flight: bool = False
    max_steps: Count = 1  # steps that slowest call covered
    warmup: bool = False  # the batch holds the run's first step


class SaveReport(Message, frozen=True, tag="save_report"):
    """What one save really cost. ``ok=False`` carries the error text."""

    job: JobId
    rank: Count
    step: Count
    blocking_s: Seconds
    durable_s: Seconds  # from the save call until the write was durable
    bytes: Count
    extra_step_s: Seconds = 0.0  # extra step time caused by the save
    ok: bool = True
    error: Text = ""
    path: Text = ""
    reason: Text = ""  # why the save happened (the plan's reason)
    # The job's cost of this save when the ranks' costs are known (the chief's report
    # under coordination): the slowest rank's blocking + extra step time, and its rank.
    job_cost_s: Seconds | None = None
    slowest_rank: Count | None = None
    tier: Tier = ""  # "local": the save went to the local tier only, not made durable


class AskConfig(Message, frozen=True, tag="ask_config"):
    """Before its restore, a rank with no local tier of its own asks its daemon for
    the job's configured settings (``[jobs."ID"]``): answered by :class:`JobConfig`
    from any connection, hello or not. A daemon older than this message refuses it
    (an :class:`Error`, code ``invalid``): the rank then has none from its daemon. Only
    a hook that asks is answered with :class:`JobConfig`, so a hook that does not know
    that message never receives it."""

    job: JobId
    rank: Count = 0


class Beat(Message, frozen=True, tag="beat"):
    """A rank's heartbeat: a thread of its hook sends it about every second over a
    connection of its own, whatever its training loop does (blocked in a collective
    too), so the daemon tells a blocked-but-alive rank from a stopped or dead one.
    Accepted without a hello when the connection's credentials are those of the rank's
    hello (the same process). ``step``: the newest step its loop completed;
    ``holding``: what of the hook holds the loop now ("save": a save's blocking part,
    "round": an agreement round, "": nothing); ``stall_floor_s``/``stall_cap_s``: the
    hook's own limits of the threshold (None: the daemon's). Answered only by
    :class:`Abort`."""

    job: JobId
    rank: Count
    step: Count
    holding: _t.Literal["", "save", "round"] = ""
    stall_floor_s: _t.Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] | None = None
    stall_cap_s: _t.Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] | None = None


class Goodbye(Message, frozen=True, tag="goodbye"):
    """A clean exit: the job is not counted as failed."""

    job: JobId
    rank: Count
    step: Count
    reason: Text = ""


class Ack(Message, frozen=True, tag="ack"):
    """A rank's answer to :class:`Propose` round ``round``: ``ok`` when its step was
    still below the proposal's ``at_step``; it then holds at ``at_step`` (bounded)
    until the round is decided. ``step`` is where it was when it answered."""

    job: JobId
    rank: Count
    round: Count
    step: Count
    ok: bool


class JobPlan(Message, frozen=True, tag="job_plan"):
    """The plan a job's ranks agreed on, in force from ``at_step``; ``decided_by`` is
    the host whose daemon (``source="daemon"``) or embedded policy decided it. Ranks
    whose daemon does not decide the job send it, so every host shows the job's plan."""

    job: JobId
    rank: Count
    at_step: Count
    next_step: Count | None
    every_steps: Every | None = None
    policy: Text = ""
    reason: Text = ""
    decided_by: Text = ""
    source: Text = ""
    durable_every: Every | None = None  # two tiers: every k-th save made durable


class Request(Message, frozen=True, tag="request"):
    """An operator request relayed in-band from host ``origin`` (see :class:`Relay`),
    handed by the job's chief to the daemon that decides the job's plan."""

    job: JobId
    rank: Count
    op: Operation
    spec: Text = ""  # set_policy: the policy spec
    reason: Text = ""
    origin: Text = ""  # the host the operator typed it on
    auth: Text = ""  # the signature of the daemon it was typed at (adaptd.protocol.relay_auth)


# ------------------------------------------------------------------ daemon -> client


class Welcome(Message, frozen=True, tag="welcome"):
    job: JobId
    rank: Count
    daemon_version: Text = ""


class Plan(Message, frozen=True, tag="plan"):
    """Step-addressed save plan: save at ``next_step``, then every ``every_steps``."""

    job: JobId
    seq: Count  # increases with each plan the daemon sends the job
    next_step: Count | None
    every_steps: Every | None = None
    policy: Text = ""
    reason: Text = ""
    interval_s: Figure | None = None
    waste: Figure | None = None
    # two tiers: every save to the local tier, every k-th also durable (None: one tier)
    durable_every: Every | None = None
    # the bytes the job's memory tier may hold on this host, the daemon's share of the
    # host's available memory (None: not budgeted; left out, so older hooks decode it)
    memory_budget: Count | None = None


class JobConfig(Message, frozen=True, tag="job_config"):
    """The daemon's answer to :class:`AskConfig`: the job's local tier from the
    config (docs/tiers.md), ``""``: none configured; ``{job}`` and ``{rank}`` are
    left for the rank to replace. ``local_tier_memory``/``local_tier_disk``: the
    entry's memory share and fallback directory (None and "": not set there)."""

    job: JobId
    local_tier: Text = ""
    local_tier_memory: _t.Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    local_tier_disk: Text = ""


class Abort(Message, frozen=True, tag="abort"):
    """The deciding daemon found the job stalled (no rank completed a step for longer
    than its step-time model makes credible): every rank aborts its pending collectives,
    saves the last completed step just in time and exits. ``culprit``: the rank taken
    for the cause (its heartbeat or process stopped, or its GPU reported an XID; None:
    unknown), which saves nothing. ``incarnation``: the job's run the daemon judged.
    Sent in answer to a :class:`Beat`, so again to a rank that comes back later."""

    job: JobId
    reason: Text
    culprit: Count | None = None
    incarnation: Count = 0


class SaveNow(Message, frozen=True, tag="save_now"):
    """Save at the next step boundary (or at ``at_step`` if given and still ahead)."""

    job: JobId
    reason: Text
    at_step: Count | None = None


class Error(Message, frozen=True, tag="error"):
    """The daemon refused a message. ``code`` is machine-readable."""

    code: Text
    message: Text


class Propose(Message, frozen=True, tag="propose"):
    """Round ``round`` of a job's agreement: ``action`` at ``at_step`` (the plan's
    fields for ``"plan"``). Proposed by rank ``proposer`` (or, under the daemon's
    agreement, by the daemon: ``proposer`` is then the world size). Every rank
    answers :class:`Ack`; the round is committed only if every rank acknowledged
    before reaching ``at_step``, else it is aborted (:class:`Decide`)."""

    job: JobId
    round: Count
    action: Action
    at_step: Count
    proposer: Count
    reason: Text = ""
    next_step: Count | None = None
    every_steps: Every | None = None
    policy: Text = ""
    interval_s: Figure | None = None
    waste: Figure | None = None
    decided_by: Text = ""  # the host whose daemon or embedded policy made the plan
    source: Text = ""  # "daemon" or "embedded"
    durable_every: Every | None = None  # two tiers: every k-th save made durable


class Decide(Message, frozen=True, tag="decide"):
    """How round ``round`` ended. ``retry_from``: after an abort because a rank had
    passed ``at_step``, the newest step a rank reported; a new proposal must name a
    later step."""

    job: JobId
    round: Count
    commit: bool
    reason: Text = ""
    retry_from: Count | None = None


class Relay(Message, frozen=True, tag="relay"):
    """An operator request made on this host for a job whose plan another host's
    daemon decides: the rank forwards it in-band to the job's chief."""

    job: JobId
    op: Operation
    spec: Text = ""
    reason: Text = ""
    origin: Text = ""
    auth: Text = ""  # signed by this daemon (adaptd.protocol.relay_auth); the rank copies it


# ------------------------------------------------------------------ rank <-> rank

#: Most checkpoint steps one rank lists in a :class:`RestoreOffer`.
MAX_OFFERED = 256
_Steps = _t.Annotated[list[Count], msgspec.Meta(max_length=MAX_OFFERED)]


class RestoreOffer(Message, frozen=True, tag="restore_offer"):
    """The checkpoints one rank could restore, newest first: ``local`` are complete for
    the job (the replicated part and every rank's part, written by a job of this world
    size) in its ``directory``, ``pullable`` are so at its durable destination ``url``.

    For the choice's messages (:func:`adaptd.core.agreement.choose_restore`): ``replicated``
    are the steps whose replicated part is whole in its directory and ``own`` those
    whose part of this rank is, whatever the others'; ``other_world`` the complete steps
    written by a job of another number of ranks (``other_world_size``, the newest's).
    """

    job: JobId
    rank: Count
    local: _Steps
    pullable: _Steps = []
    directory: Text = ""
    url: Text = ""
    host: Text = ""
    replicated: _Steps = []
    own: _Steps = []
    other_world: _Steps = []
    other_world_size: Count = 0


class Restored(Message, frozen=True, tag="restored"):
    """A rank's outcome of the agreed restore: ``ok`` with the step it restored, or the
    error that stops the job."""

    job: JobId
    rank: Count
    step: Count
    ok: bool
    error: Text = ""


class SaveCost(Message, frozen=True, tag="save_cost"):
    """What one save at ``step`` cost a rank, for the job's chief (δ of a job is its
    slowest rank's: blocking time plus extra step time while the write ran). The
    chief may forward it to its daemon too (a client message since version 2)."""

    job: JobId
    rank: Count
    step: Count
    blocking_s: Seconds
    extra_step_s: Seconds = 0.0
    ok: bool = True


ClientMessage = _t.Union[  # noqa: UP007
    Hello, Steps, SaveReport, Goodbye, Ack, JobPlan, Request, SaveCost, AskConfig, Beat
]
DaemonMessage = _t.Union[  # noqa: UP007
    Welcome, Plan, SaveNow, Error, Propose, Decide, Relay, JobConfig, Abort
]
#: The records ranks exchange among themselves (on TensorFlow's coordination service).
RankMessage = _t.Union[  # noqa: UP007
    Propose, Ack, Decide, Request, RestoreOffer, Restored, SaveCost
]


class ProtocolError(ValueError):
    """A frame could not be accepted. ``code`` is what the Error reply carries."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_encoder = msgspec.msgpack.Encoder()
_client_decoder = msgspec.msgpack.Decoder(ClientMessage)
_daemon_decoder = msgspec.msgpack.Decoder(DaemonMessage)
_json_encoder = msgspec.json.Encoder()
_rank_decoder = msgspec.json.Decoder(RankMessage)


def encode(msg: Message) -> bytes:
    """Serialise a message to one msgpack frame."""
    return _encoder.encode(msg)


def _decode(frame: bytes, decoder: msgspec.msgpack.Decoder) -> Message:
    if len(frame) > MAX_MESSAGE_BYTES:
        raise ProtocolError(
            "too_large", f"frame of {len(frame)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte cap"
        )
    try:
        msg = decoder.decode(frame)
    except msgspec.ValidationError as exc:
        raise ProtocolError("invalid", f"invalid message: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError("malformed", f"not a msgpack message: {exc}") from None
    if msg.v != VERSION:
        raise ProtocolError(
            "version", f"protocol version {msg.v} is not supported (this side speaks {VERSION})"
        )
    if isinstance(msg, Steps):
        for name in ("mean_s", "max_s"):
            value = getattr(msg, name)
            if 0 < value < MIN_STEP_S:
                raise ProtocolError(
                    "invalid",
                    f"invalid message: {name} = {value!r} s is below {MIN_STEP_S:g} s "
                    "(0 means unmeasured) - at `$." + name + "`",
                )
    return msg


def decode_client(frame: bytes) -> ClientMessage:
    """Decode a frame sent by a client; raises :class:`ProtocolError`."""
    return _decode(frame, _client_decoder)  # type: ignore[return-value]


def decode_daemon(frame: bytes) -> DaemonMessage:
    """Decode a frame sent by the daemon; raises :class:`ProtocolError`."""
    return _decode(frame, _daemon_decoder)  # type: ignore[return-value]


def encode_json(msg: Message) -> str:
    """A message as JSON text, for stores that keep text (TensorFlow's coordination
    service decodes every value as UTF-8, so msgpack bytes would not survive)."""
    return _json_encoder.encode(msg).decode("utf-8")


def decode_rank(text: str) -> RankMessage:
    """Decode a record another rank stored (see :func:`encode_json`), as strictly as a
    frame; raises :class:`ProtocolError`."""
    return _decode(text.encode("utf-8"), _rank_decoder)  # type: ignore[return-value]
