"""The policy interface, composition, and the plugin registry.

A policy is a small frozen dataclass whose fields are its settings, with one
method, :meth:`Policy.decide`, a pure function of a :class:`~adaptd.core.snapshot.Snapshot`
and a :class:`~adaptd.core.snapshot.JobState` (no clock, no I/O). Composition
(:class:`AnyPolicy`) is itself a policy.

Policies are found by name through the ``adaptd.policies`` entry-point group, so
a third-party package can add one; a plugin imports what it needs from
:mod:`adaptd.policies`, which re-exports this module's interface and the facts of
:mod:`adaptd.core.snapshot` beside the built-in policies. A *spec* names a policy and its settings:
``"fixed:steps=100"``, ``"phased:warmup_steps=500,early_every=20"``; several
specs joined by ``+`` compose with :class:`AnyPolicy`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol, runtime_checkable

from adaptd.core.snapshot import Decision, JobState, Snapshot

__all__ = [
    "DEFAULT_SPEC",
    "ENTRY_POINT_GROUP",
    "AnyPolicy",
    "Policy",
    "PolicyCache",
    "PolicyError",
    "available",
    "build",
    "earliest",
    "next_multiple",
    "parse",
    "steps_for_seconds",
]

ENTRY_POINT_GROUP = "adaptd.policies"


class PolicyError(ValueError):
    """A policy spec or setting is invalid; the message says which and why."""


@runtime_checkable
class Policy(Protocol):
    """Decides when a job should next save."""

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        """Return the save plan for ``job`` given ``snapshot``. Must be pure."""
        ...


def earliest(decisions: Iterable[Decision]) -> Decision:
    """The decision that saves first: urgent beats planned, then the lower step.

    Ties keep the first decision's reason. With no planned save at all, the
    result plans none.
    """
    best: Decision | None = None
    for d in decisions:
        if best is None:
            best = d
            continue
        if d.urgent != best.urgent:
            if d.urgent:
                best = d
            continue
        if d.next_step is not None and (best.next_step is None or d.next_step < best.next_step):
            best = d
    if best is None:
        return Decision(next_step=None, reason="no policy")
    return best


@dataclass(frozen=True)
class AnyPolicy:
    """Saves when any of its policies would: the earliest planned step wins."""

    policies: tuple[Policy, ...]

    def __post_init__(self) -> None:
        if not self.policies:
            raise PolicyError("AnyPolicy needs at least one policy")

    def decide(self, snapshot: Snapshot, job: JobState) -> Decision:
        return earliest(p.decide(snapshot, job) for p in self.policies)


def next_multiple(step: int, every: int, origin: int = 0) -> int:
    """The first step after ``step`` on the grid ``origin + i * every``."""
    if every <= 0:
        raise PolicyError(f"interval must be a positive number of steps, got {every}")
    if step < origin:
        return origin
    return origin + ((step - origin) // every + 1) * every


def steps_for_seconds(seconds: float, step_time_s: float | None) -> int | None:
    """How many steps make ``seconds`` at the job's step time (at least 1)."""
    if step_time_s is None or step_time_s <= 0:
        return None
    return max(1, round(seconds / step_time_s))


# --------------------------------------------------------------------------- registry


def available() -> dict[str, str]:
    """Installed policies: name -> where it comes from (``module:attr (distribution)``)."""
    out: dict[str, str] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        origin = f" ({dist.name} {dist.version})" if dist is not None else ""
        out.setdefault(ep.name, f"{ep.value}{origin}")
    return dict(sorted(out.items()))


def _load_factory(name: str) -> Callable[..., Policy]:
    eps = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not eps:
        known = ", ".join(available()) or "none"
        raise PolicyError(f"unknown policy {name!r}; installed policies: {known}")
    try:
        return eps[0].load()
    except Exception as exc:  # a broken plugin must not take the caller down
        raise PolicyError(f"policy {name!r} ({eps[0].value}) failed to load: {exc}") from exc


def _convert(policy: str, key: str, raw: str, annotation: Any) -> Any:
    """Convert a spec value to the field's type (bool/int/float/str, optional)."""
    hint = annotation
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if raw.lower() in ("none", ""):
            return None
        hint = args[0] if len(args) == 1 else str
    try:
        if hint is bool:
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true/false")
        if hint is int:
            return int(raw)
        if hint is float:
            return float(raw)
    except ValueError as exc:
        raise PolicyError(
            f"policy {policy!r}: setting {key}={raw!r} is not a valid {hint.__name__} ({exc})"
        ) from None
    return raw


def _split_settings(policy: str, text: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PolicyError(f"policy {policy!r}: setting {item!r} must look like key=value")
        settings[key.strip()] = value.strip()
    return settings


def build(factory: Callable[..., Policy], name: str, settings: Mapping[str, str]) -> Policy:
    """Instantiate ``factory`` (a dataclass) from string settings, checking each key."""
    kwargs: dict[str, Any] = {}
    if dataclasses.is_dataclass(factory):
        hints = typing.get_type_hints(factory)
        fields = {f.name: f for f in dataclasses.fields(factory) if f.init}
        for key, raw in settings.items():
            if key not in fields:
                allowed = ", ".join(fields) or "none"
                raise PolicyError(f"policy {name!r} has no setting {key!r}; settings: {allowed}")
            kwargs[key] = _convert(name, key, raw, hints.get(key, str))
    else:
        kwargs = dict(settings)
    try:
        return factory(**kwargs)
    except PolicyError:
        raise
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from exc


def parse(spec: str | Policy) -> Policy:
    """Turn a spec such as ``"fixed:steps=100"`` or ``"fixed:steps=500+phased"`` into a policy.

    A policy object is returned unchanged. Raises :class:`PolicyError` naming the
    bad part of the spec.
    """
    if not isinstance(spec, str):
        if not isinstance(spec, Policy):
            raise PolicyError(f"expected a policy spec string or a policy object, got {spec!r}")
        return spec
    parts = [p.strip() for p in spec.split("+")]
    if not spec.strip() or any(not p for p in parts):
        raise PolicyError(f"empty policy spec in {spec!r}")
    built: list[Policy] = []
    for part in parts:
        name, _, rest = part.partition(":")
        name = name.strip()
        built.append(build(_load_factory(name), name, _split_settings(name, rest)))
    return built[0] if len(built) == 1 else AnyPolicy(tuple(built))


#: The policy a job gets when neither it nor the daemon's config names one.
DEFAULT_SPEC = "default"


class PolicyCache:
    """Policies parsed from their specs, the ``size`` most recently added kept.

    :func:`parse` reads the installed entry points' metadata, so a daemon that meets
    the same spec in every hello parses it once. Raises what :func:`parse` raises.
    """

    def __init__(self, size: int = 256) -> None:
        if size < 1:
            raise ValueError(f"PolicyCache size must be >= 1, got {size}")
        self.size = size
        self._policies: dict[str, Policy] = {}

    def get(self, spec: str) -> Policy:
        """The policy for ``spec``; raises :class:`PolicyError`."""
        cached = self._policies.get(spec)
        if cached is None:
            cached = parse(spec)
            if len(self._policies) >= self.size:
                self._policies.pop(next(iter(self._policies)))
            self._policies[spec] = cached
        return cached
