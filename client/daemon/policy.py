"""The policy a hook was given (``policy=``), as its daemon session uses it.

A spec (``"fixed:steps=100"``) is sent to the daemon in Hello, which then plans by it,
and drives the embedded fallback; no ``policy`` leaves the choice to the daemon and
runs :data:`adaptd.core.policy.DEFAULT_SPEC` embedded; a policy object cannot be sent,
so it is run in-process and the daemon's plans are ignored (its urgent save-now
requests are still honoured).
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptd.core.policy import DEFAULT_SPEC, Policy, parse

__all__ = ["PolicyChoice"]


@dataclass(frozen=True)
class PolicyChoice:
    """``spec``: what Hello asks the daemon for (None: its own choice); ``policy``: the
    embedded policy, named ``label`` in messages (the spec as given, or the object's
    class name); ``local_only``: the daemon's plans are ignored."""

    spec: str | None
    policy: Policy
    label: str
    local_only: bool = False

    @classmethod
    def of(cls, policy: str | Policy | None) -> PolicyChoice:
        """The choice a hook's ``policy`` argument makes. Raises PolicyError for a spec
        that does not parse."""
        if policy is None:
            return cls(None, parse(DEFAULT_SPEC), DEFAULT_SPEC)
        if isinstance(policy, str):
            return cls(policy, parse(policy), policy)
        return cls(None, parse(policy), type(policy).__name__, local_only=True)
