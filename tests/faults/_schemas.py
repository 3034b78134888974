"""The message schemas, read from the msgspec structs, and the contract their fields keep.

Two halves, kept apart on purpose:

- what the schema *declares*: every message kind, its fields and their types and
  constraints, by :func:`msgspec.inspect.type_info`; :func:`valid_frames` builds
  Hypothesis strategies from it, so generated frames are (mostly) valid and reach the
  checks behind msgspec's parser, and a field another engineer adds is fuzzed too;
- what the schema *must* declare: :func:`edges` gives each field's edge values and
  whether each must be accepted, from rules written here (durations finite and >= 0,
  counts within SQLite's INTEGER, ids by pattern...), not from the schema. A constraint
  dropped from ``adaptd/protocol/job.py`` therefore fails the tests instead of moving the
  expectation with it.

Used by tests/faults/test_validation_fuzz.py and the atheris harness fuzz_decoder.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import inspect as mi

from adaptd.protocol import admin
from adaptd.protocol import job as p


@dataclass(frozen=True)
class Kind:
    """One message type and the decoder the daemon (or the hook, or the CLI) runs on it."""

    cls: type
    decode: Callable[[bytes], Any]
    encode: Callable[[Any], bytes]
    refusal: type[Exception]
    version: int

    @property
    def info(self) -> mi.StructType:
        return mi.type_info(self.cls)  # type: ignore[return-value]

    @property
    def tag(self) -> tuple[str, str]:
        info = self.info
        return info.tag_field, info.tag  # type: ignore[return-value]


def _kinds() -> list[Kind]:
    def kinds(classes, decode, encode, refusal, version):  # type: ignore[no-untyped-def]
        return [Kind(c, decode, encode, refusal, version) for c in classes]

    client = (
        p.Hello, p.Steps, p.SaveReport, p.Goodbye, p.Ack, p.JobPlan, p.Request, p.AskConfig,
        p.Beat,
    )  # fmt: skip
    daemon = (
        p.Welcome, p.Plan, p.SaveNow, p.Error, p.Propose, p.Decide, p.Relay, p.JobConfig,
        p.Abort,
    )  # fmt: skip
    ops = (
        admin.StatusRequest,
        admin.SaveNowRequest,
        admin.DrainRequest,
        admin.SetPolicyRequest,
        admin.PauseRequest,
    )
    return [
        *kinds(client, p.decode_client, p.encode, p.ProtocolError, p.VERSION),
        *kinds(daemon, p.decode_daemon, p.encode, p.ProtocolError, p.VERSION),
        *kinds(ops, admin.decode_request, admin.encode, admin.AdminError, admin.ADMIN_VERSION),
    ]


KINDS = _kinds()
CLIENT_KINDS = [k for k in KINDS if k.decode is p.decode_client]
#: The only refusal codes a decoder may give.
CODES = {"malformed", "invalid", "version", "too_large"}


def fields(kind: Kind) -> Iterator[tuple[str, mi.Type, bool]]:
    """(wire name, type, required) of every field but the version ``v``."""
    for f in kind.info.fields:
        if f.name != "v":
            yield f.encode_name, f.type, f.required


def base_type(t: mi.Type) -> tuple[mi.Type, bool]:
    """The type inside ``X | None``, and whether ``None`` is allowed."""
    if isinstance(t, mi.UnionType):
        rest = [x for x in t.types if not isinstance(x, mi.NoneType)]
        if len(rest) == 1:
            return rest[0], len(rest) < len(t.types)
    return t, False


# ------------------------------------------------------------------ the contract

#: Plan figures the daemon computes for display; a policy plugin may say ``inf``.
FIGURES = {
    ("plan", "interval_s"),
    ("plan", "waste"),
    ("propose", "interval_s"),
    ("propose", "waste"),
}
#: Fields counting things that exist at least once.
AT_LEAST_ONE = {
    ("hello", "world_size"),
    ("plan", "every_steps"),
    ("propose", "every_steps"),
    ("job_plan", "every_steps"),
    ("plan", "durable_every"),
    ("propose", "durable_every"),
    ("job_plan", "durable_every"),
}
#: Fields naming one of a few words, and those words.
CHOICES = {
    ("hello", "agreement"): ("none", "daemon", "coordination"),
    ("propose", "action"): ("plan", "save", "stop"),
    ("request", "op"): ("set_policy", "pause", "resume", "save_now"),
    ("relay", "op"): ("set_policy", "pause", "resume", "save_now"),
    # two tiers (docs/tiers.md): "" is no local tier / the durable directory
    ("hello", "local_tier"): ("", "memory", "disk"),
    ("hello", "resumed_tier"): ("", "local"),
    ("save_report", "tier"): ("", "local"),
    # hang detection (docs/multiworker.md): what of the hook holds the loop
    ("beat", "holding"): ("", "save", "round"),
}
#: A hook's limits of the hang detection threshold: positive durations.
STALL_LIMITS = {("beat", "stall_floor_s"), ("beat", "stall_cap_s")}
#: Counts with a smaller ceiling: a job's GPUs weigh in the host's failure rate.
CEILING = {("hello", "world_size"): 2**20, ("hello", "gpus"): 1024}
#: Step times: 0 (unmeasured) or at least a nanosecond, since intervals divide by them.
STEP_TIMES = {("steps", "mean_s"), ("steps", "max_s")}
#: The drain an operator may ask for: (0, 1 day].
DRAIN = ("drain", "timeout_s")
#: A share of the host's memory (a configured local tier's): (0, 1].
SHARE = ("job_config", "local_tier_memory")
MAX_COUNT = 2**63 - 1  # SQLite's INTEGER; a bigger step or byte count breaks the store
MAX_SECONDS = 1e9  # about 32 years: no report carries a longer duration
MAX_ID = 256


@dataclass(frozen=True)
class Edge:
    """An edge value for one field and whether the decoder must accept it."""

    label: str
    value: object
    accept: bool


def _float_edges(lo: float, lo_open: bool, hi: float) -> list[Edge]:
    tiny = 1e-300
    out = [
        Edge("nan", math.nan, False),
        Edge("-inf", -math.inf, False),
        Edge("negative", -1.0, False),
        Edge("just below the lowest", lo - max(tiny, abs(lo) * 1e-12), False),
        Edge("the lowest", lo, not lo_open),
        Edge("just above the lowest", lo + max(tiny, abs(lo) * 1e-12), True),
        Edge("+inf", math.inf, hi == math.inf),
        Edge("huge", 1e308, hi >= 1e308),
        Edge("a string", "1.0", False),
        Edge("a bool", True, False),
        Edge("a list", [1.0], False),
    ]
    if hi < math.inf:
        out += [Edge("the highest", hi, True), Edge("just above the highest", hi * 1.000001, False)]
    return out


def _int_edges(lo: int, hi: int) -> list[Edge]:
    return [
        Edge("negative", -1, False),
        Edge("zero", 0, lo <= 0),
        Edge("the lowest", lo, True),
        Edge("the highest", hi, True),
        Edge("just above the highest", hi + 1, False),
        Edge("beyond int64", MAX_COUNT + 1, False),
        Edge("uint64 max", 2**64 - 1, False),
        Edge("a float", 1.5, False),
        Edge("a string", "1", False),
        Edge("a bool", True, False),
        Edge("nan", math.nan, False),
    ]


def _str_edges(name: str, max_length: int | None) -> list[Edge]:
    if name == "job":  # a job id: a file and metric label, so a strict pattern
        return [
            Edge("empty", "", False),
            Edge("longest", "j" * MAX_ID, True),
            Edge("too long", "j" * (MAX_ID + 1), False),
            Edge("path", "../../etc", False),
            Edge("space", "a b", False),
            Edge("NUL", "a\x00", False),
            Edge("an int", 7, False),
            Edge("bytes", b"j", False),
        ]
    limit = p.MAX_TEXT if max_length is None else max_length
    return [
        Edge("empty", "", True),
        Edge("longest", "x" * p.MAX_TEXT, limit >= p.MAX_TEXT),
        Edge("too long", "x" * (p.MAX_TEXT + 1), False),
        Edge("unicode", "é✓\U0001f600", True),
        Edge("an int", 7, False),
        Edge("bytes", b"x", False),
        Edge("none", None, False),
    ]


def edges(kind: Kind, name: str, t: mi.Type) -> list[Edge]:
    """The edge values of field ``name`` and, by the contract, whether each is accepted."""
    inner, optional = base_type(t)
    tag = kind.tag[1]
    if isinstance(inner, mi.FloatType):
        if (tag, name) in FIGURES:
            out = _float_edges(0.0, False, math.inf)
        elif (tag, name) == DRAIN:
            out = _float_edges(0.0, True, 86_400.0)
        elif (tag, name) == SHARE:
            out = _float_edges(0.0, True, 1.0)
        elif (tag, name) in STALL_LIMITS:
            out = _float_edges(0.0, True, MAX_SECONDS)
        else:  # a measured duration
            out = _float_edges(0.0, False, MAX_SECONDS)
        if (tag, name) in STEP_TIMES:
            out += [Edge("below a nanosecond", 1e-300, False), Edge("a nanosecond", 1e-9, True)]
            out = [e for e in out if e.label != "just above the lowest"]
    elif isinstance(inner, mi.IntType):
        lo = 1 if (tag, name) in AT_LEAST_ONE else 0
        out = _int_edges(lo, CEILING.get((tag, name), MAX_COUNT))
    elif isinstance(inner, mi.StrType):
        out = _str_edges(name, inner.max_length)
    elif isinstance(inner, mi.BoolType):
        out = [
            Edge("an int", 1, False),
            Edge("a string", "true", False),
            Edge("false", False, True),
        ]
    elif isinstance(inner, mi.LiteralType) and (tag, name) in CHOICES:
        words = CHOICES[(tag, name)]
        out = [Edge(f"{word!r}", word, True) for word in words]
        out += [Edge("another word", "other", False), Edge("an int", 1, False)]
        if "" not in words:
            out.append(Edge("empty", "", False))
    else:
        raise TypeError(
            f"{kind.cls.__name__}.{name} has a type the contract does not know ({t}): "
            "say in tests/faults/_schemas.py which values it must accept"
        )
    if optional:
        out = [e for e in out if e.value is not None] + [Edge("none", None, True)]
    elif not any(e.value is None for e in out):
        out.append(Edge("none", None, False))
    return out


def message_edges(kind: Kind, base: dict[str, object]) -> Iterator[tuple[str, dict, bool]]:
    """Whole-message edges: unknown field, each required field missing, wrong versions."""
    yield "an unknown field", {**base, "bogus": 1}, False
    for name, _, required in fields(kind):
        if required:
            yield f"{name} missing", {k: v for k, v in base.items() if k != name}, False
    for v in (kind.version + 1, -1, 2**64 - 1, "1", None):
        yield f"v={v!r}", {**base, "v": v}, False


# ------------------------------------------------------------------ valid messages


def minimal(kind: Kind) -> dict[str, object]:
    """A valid message of ``kind`` with only its required fields, set to plain values."""
    plain = {"job": "j", "code": "invalid", "message": "m", "reason": "r", "spec": "fixed:steps=5"}
    out: dict[str, object] = dict([kind.tag])
    out["v"] = kind.version
    for name, t, required in fields(kind):
        if not required:
            continue
        inner, optional = base_type(t)
        if optional:
            out[name] = None
        elif isinstance(inner, mi.StrType):
            out[name] = plain.get(name, "x")
        elif isinstance(inner, mi.IntType):
            out[name] = 1
        elif isinstance(inner, mi.FloatType):
            out[name] = 1.0
        elif isinstance(inner, mi.BoolType):
            out[name] = True
        elif isinstance(inner, mi.LiteralType):
            out[name] = inner.values[0]
        else:
            raise TypeError(f"{kind.cls.__name__}.{name}: no plain value for {t}")
    return out


def strategy(t: mi.Type):  # type: ignore[no-untyped-def]
    """Values the schema declares valid for type ``t`` (boundaries included)."""
    from hypothesis import strategies as st

    if isinstance(t, mi.UnionType):
        return st.one_of(*(strategy(x) for x in t.types))
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else -(2**63))
        hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else 2**64 - 1)
        return st.one_of(st.sampled_from([lo, hi]), st.integers(lo, hi))
    if isinstance(t, mi.FloatType):
        lo = t.ge if t.ge is not None else t.gt
        hi = t.le if t.le is not None else t.lt
        ends = [x for x in (t.ge, t.le) if x is not None]
        inner = st.floats(
            min_value=lo,
            max_value=hi,
            exclude_min=t.gt is not None,
            exclude_max=t.lt is not None,
            allow_nan=lo is None and hi is None,
            allow_infinity=hi is None or lo is None,
        )
        return st.one_of(st.sampled_from(ends), inner) if ends else inner
    if isinstance(t, mi.StrType):
        if t.pattern is not None:
            text = st.from_regex(t.pattern, fullmatch=True)
            return text.filter(
                lambda s: (t.min_length or 0) <= len(s) <= (t.max_length or math.inf)
            )
        top = t.max_length if t.max_length is not None else 10_000
        return st.one_of(
            st.text(min_size=t.min_length or 0, max_size=min(top, 64)),
            st.just("x" * top),
        )
    raise TypeError(f"no strategy for {t}: teach tests/faults/_schemas.py this type")


def messages(kind: Kind):  # type: ignore[no-untyped-def]
    """Valid messages of ``kind`` as dicts: every required field, a random subset of
    the optional ones, values anywhere in their declared domain."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):  # type: ignore[no-untyped-def]
        out: dict[str, object] = dict([kind.tag])
        if kind.decode is not admin.decode_request or draw(st.booleans()):
            out["v"] = kind.version
        for name, t, required in fields(kind):
            if (kind.tag[1], name) in STEP_TIMES:  # the one rule the schema cannot say
                values = st.one_of(st.just(0.0), st.floats(p.MIN_STEP_S, p.MAX_SECONDS))
            else:
                values = strategy(t)
            if required or draw(st.booleans()):
                out[name] = draw(values)
        return out

    return build()


def encode(message: dict[str, object]) -> bytes:
    return msgspec.msgpack.encode(message)
