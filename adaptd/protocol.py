"""The wire protocol between the training-loop hook and the daemon.

Messages are typed, versioned msgspec structs encoded as msgpack. Each is tagged
by its ``kind`` field; decoding is strict (wrong types, unknown kinds, missing
fields and oversized frames are rejected with :class:`ProtocolError`), so the
daemon validates every message before it looks at it. Nothing is ever unpickled.

Client -> daemon: :class:`Hello`, :class:`Steps`, :class:`SaveReport`, :class:`Goodbye`.
Daemon -> client: :class:`Welcome`, :class:`Plan`, :class:`SaveNow`, :class:`Error`.

A message whose ``v`` differs from :data:`VERSION` is refused with an error reply
naming both versions.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_TEXT",
    "VERSION",
    "ClientMessage",
    "Count",
    "DaemonMessage",
    "Error",
    "Goodbye",
    "Hello",
    "JobId",
    "Message",
    "Plan",
    "ProtocolError",
    "SaveNow",
    "SaveReport",
    "Seconds",
    "Steps",
    "Text",
    "Welcome",
    "decode_client",
    "decode_daemon",
    "encode",
]

#: Protocol version. Bump on any incompatible change.
VERSION = 1
#: Largest frame either side accepts. Real messages are a few hundred bytes.
MAX_MESSAGE_BYTES = 64 * 1024
#: Longest free-text field (reasons, error text, paths).
MAX_TEXT = 4096
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


class Message(msgspec.Struct, frozen=True, tag_field="kind", forbid_unknown_fields=True):
    """Base of every message: ``v`` is the protocol version."""

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


class Steps(Message, frozen=True, tag="steps"):
    """A batch of step timings since the previous report."""

    job: JobId
    rank: Count
    step: Count  # newest completed step
    count: Count  # steps in this batch
    mean_s: Seconds
    max_s: Seconds = 0.0
    save_in_flight: bool = False


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


class Goodbye(Message, frozen=True, tag="goodbye"):
    """A clean exit: the job is not counted as failed."""

    job: JobId
    rank: Count
    step: Count
    reason: Text = ""


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
    every_steps: _t.Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)] | None = None
    policy: Text = ""
    reason: Text = ""
    interval_s: Figure | None = None
    waste: Figure | None = None


class SaveNow(Message, frozen=True, tag="save_now"):
    """Save at the next step boundary (or at ``at_step`` if given and still ahead)."""

    job: JobId
    reason: Text
    at_step: Count | None = None


class Error(Message, frozen=True, tag="error"):
    """The daemon refused a message. ``code`` is machine-readable."""

    code: Text
    message: Text


ClientMessage = _t.Union[Hello, Steps, SaveReport, Goodbye]  # noqa: UP007
DaemonMessage = _t.Union[Welcome, Plan, SaveNow, Error]  # noqa: UP007


class ProtocolError(ValueError):
    """A frame could not be accepted. ``code`` is what the Error reply carries."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_encoder = msgspec.msgpack.Encoder()
_client_decoder = msgspec.msgpack.Decoder(ClientMessage)
_daemon_decoder = msgspec.msgpack.Decoder(DaemonMessage)


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
