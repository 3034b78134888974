"""Where the fleet keeps what in etcd: one place that spells every key.

Everything a host writes lives under prefixes that name the host, so an etcd role
per host (readwrite on its own prefixes, read on the rest) keeps each daemon to its
own keys (docs/fleet.md shows the ``etcdctl`` commands)::

    {prefix}members/{host}                    leased: the host's daemon is up
    {prefix}claims/{host}/{target}/{job}      leased: a job waits for / holds a write slot
    {prefix}failures/{host}/{gpu_model}       kept:   what the host learned about failures
    {prefix}grants/{target}                   leased: rewritten by every grant on target
    {prefix}grants/{target}/{k}               leased: slot k (< cap) of target is held
    {prefix}ranks/{host}/{job}/{rank}         leased: what is wrong with a rank of the host

The one exception is ``grants/``: a target's grant key and its numbered slot keys are
written by whichever host takes a slot on it, so that a grant compares its own slot's
key, not every claim of the fleet (issue 35). Every host's role needs readwrite on
``{prefix}grants/`` (docs/fleet.md); a slot key names the job that holds the slot, and
lives and goes with that job's holder claim.

``target``, ``job`` and ``gpu_model`` are percent-encoded (no ``/`` inside a part),
so a key splits back into its parts unambiguously. Host names may not contain ``/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

#: Where a fleet's keys live unless ``[fleet] prefix`` says otherwise.
DEFAULT_PREFIX = "/adaptd/"
MEMBERS = "members/"
CLAIMS = "claims/"
FAILURES = "failures/"
GRANTS = "grants/"
RANKS = "ranks/"


def _part(text: str) -> str:
    return quote(text, safe="")


def range_end(prefix: str) -> str:
    """The first key after every key that starts with ``prefix`` (etcd's ``range_end``)."""
    raw = prefix.encode()
    if not raw:
        raise ValueError("an empty prefix has no range end")
    return (raw[:-1] + bytes([raw[-1] + 1])).decode()


@dataclass(frozen=True)
class KeySpace:
    """The fleet's keys under ``prefix`` (e.g. ``/adaptd/``, ending in ``/``)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or not self.prefix.endswith("/"):
            raise ValueError(
                f"fleet key prefix must start and end with '/', got {self.prefix!r} "
                "(e.g. '/adaptd/' or '/adaptd/cluster-a/')"
            )

    @staticmethod
    def check_host(host: str) -> str:
        """``host`` if it can name keys; raises :class:`ValueError` otherwise."""
        if not host or "/" in host or host != host.strip() or len(host) > 253:
            raise ValueError(
                f"fleet host name {host!r} must be 1-253 characters without '/' or "
                "surrounding spaces; set [fleet] host"
            )
        return host

    # -------------------------------------------------------------- members

    @property
    def members(self) -> str:
        return self.prefix + MEMBERS

    def member(self, host: str) -> str:
        return self.members + self.check_host(host)

    def member_host(self, key: str) -> str | None:
        """The host a member key names, or ``None`` for a foreign key."""
        rest = _after(key, self.members)
        return rest if rest and "/" not in rest else None

    # -------------------------------------------------------------- claims

    @property
    def claims(self) -> str:
        return self.prefix + CLAIMS

    def host_claims(self, host: str) -> str:
        return f"{self.claims}{self.check_host(host)}/"

    def claim(self, host: str, target: str, job: str) -> str:
        return f"{self.host_claims(host)}{_part(target)}/{_part(job)}"

    def claim_parts(self, key: str) -> tuple[str, str, str] | None:
        """``(host, target, job)`` of a claim key, or ``None`` for a foreign key."""
        rest = _after(key, self.claims)
        parts = rest.split("/") if rest else []
        if len(parts) != 3 or not all(parts):
            return None
        return parts[0], unquote(parts[1]), unquote(parts[2])

    # -------------------------------------------------------------- failures

    @property
    def failures(self) -> str:
        return self.prefix + FAILURES

    def host_failures(self, host: str) -> str:
        return f"{self.failures}{self.check_host(host)}/"

    def failure(self, host: str, gpu_model: str) -> str:
        return f"{self.host_failures(host)}{_part(gpu_model)}"

    def failure_parts(self, key: str) -> tuple[str, str] | None:
        """``(host, gpu_model)`` of a failure-knowledge key, or ``None``."""
        rest = _after(key, self.failures)
        parts = rest.split("/") if rest else []
        if len(parts) != 2 or not all(parts):
            return None
        return parts[0], unquote(parts[1])

    # -------------------------------------------------------------- grants

    @property
    def grants(self) -> str:
        return self.prefix + GRANTS

    def grant(self, target: str) -> str:
        return self.grants + _part(target)

    def grant_target(self, key: str) -> str | None:
        """The target a grant key names, or ``None`` for a foreign key."""
        rest = _after(key, self.grants)
        return unquote(rest) if rest and "/" not in rest else None

    def slot(self, target: str, k: int) -> str:
        """The key of slot ``k`` (0 <= k < cap) of ``target``: present while held."""
        if k < 0:
            raise ValueError(f"a slot number is >= 0, got {k}")
        return f"{self.grant(target)}/{int(k)}"

    def slot_parts(self, key: str) -> tuple[str, int] | None:
        """``(target, k)`` of a slot key, or ``None`` for any other key."""
        rest = _after(key, self.grants)
        parts = rest.split("/") if rest else []
        if len(parts) != 2 or not parts[0] or not parts[1].isdigit():
            return None
        return unquote(parts[0]), int(parts[1])

    # -------------------------------------------------------------- ranks

    @property
    def ranks(self) -> str:
        return self.prefix + RANKS

    def host_ranks(self, host: str) -> str:
        return f"{self.ranks}{self.check_host(host)}/"

    def rank(self, host: str, job: str, rank: int) -> str:
        """The key of what ``host``'s daemon sees wrong with rank ``rank`` of ``job``."""
        return f"{self.host_ranks(host)}{_part(job)}/{int(rank)}"

    def rank_parts(self, key: str) -> tuple[str, str, int] | None:
        """``(host, job, rank)`` of a rank key, or ``None`` for a foreign key."""
        rest = _after(key, self.ranks)
        parts = rest.split("/") if rest else []
        if len(parts) != 3 or not all(parts) or not parts[2].isdigit():
            return None
        return parts[0], unquote(parts[1]), int(parts[2])


def _after(key: str, prefix: str) -> str | None:
    return key[len(prefix) :] if key.startswith(prefix) else None
