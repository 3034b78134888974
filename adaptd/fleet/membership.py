"""Which daemons are up: one leased key per host.

A daemon registers ``{prefix}members/{host}`` under its session's lease, so the key
disappears by itself when the daemon stops renewing it (crash, SIGKILL, partition
longer than the TTL). The hosts up are the member keys present.

Roles: the member registered first (lowest create revision, the etcd election
recipe's rule) is the fleet's ``leader``, every other one a ``member``. The role is
shown in ``adaptd status``; no decision of the daemon depends on it (slots and
failure knowledge are symmetric), it names one host for operators and for jobs that
need a single authority (the multi-worker issue).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from adaptd.fleet.keys import KeySpace
from adaptd.fleet.session import Entry, EtcdSession

LEADER = "leader"
MEMBER = "member"
#: What a member's record says about how it takes write slots: a daemon of the
#: previous version compares its target's grant key (``grants/{target}``) alone; a
#: member that says nothing (a daemon from before issue 35's change) compares the whole
#: claims range and does not bump that key, so while one is up every daemon takes the
#: whole-range way too (:class:`~adaptd.fleet.slots.SlotTable`).
PER_TARGET_GRANTS = "per-target"
#: This version takes a numbered slot of its target (``grants/{target}/{k}``, k < cap)
#: by a transaction that compares that one key's absence, so takers of different slots
#: of one target never conflict. While any member up says less, every daemon also does
#: what the oldest rule up needs (:class:`~adaptd.fleet.slots.SlotTable`).
NUMBERED_SLOTS = "numbered"


@dataclass(frozen=True, slots=True)
class Member:
    """One daemon that is up, as it registered."""

    host: str
    pid: int = 0
    started: float = 0.0  # wall-clock time of the registration (seconds since the epoch)
    version: str = ""
    create_revision: int = 0
    grants: str = NUMBERED_SLOTS

    def record(self) -> bytes:
        return json.dumps(
            {
                "host": self.host,
                "pid": self.pid,
                "started": self.started,
                "version": self.version,
                "grants": self.grants,
            }
        ).encode()


@dataclass(frozen=True, slots=True)
class Members:
    """The hosts up, oldest registration first."""

    hosts: tuple[Member, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.host for m in self.hosts)

    @property
    def newest(self) -> int:
        """The newest registration's create revision (0 for none)."""
        return max((m.create_revision for m in self.hosts), default=0)

    @property
    def grant_per_target(self) -> bool:
        """Whether every member up takes slots by its target's grant key alone (or by
        the numbered slots, which rewrite that key while it is needed)."""
        return all(m.grants in (PER_TARGET_GRANTS, NUMBERED_SLOTS) for m in self.hosts)

    @property
    def grant_numbered(self) -> bool:
        """Whether every member up takes slots by their numbered keys alone."""
        return all(m.grants == NUMBERED_SLOTS for m in self.hosts)

    def role(self, host: str) -> str | None:
        """``leader``, ``member``, or ``None`` when ``host`` is not registered."""
        for i, m in enumerate(self.hosts):
            if m.host == host:
                return LEADER if i == 0 else MEMBER
        return None


def parse_members(entries: Iterable[Entry], keys: KeySpace) -> Members:
    """Members from the keys under ``keys.members``; malformed values are skipped."""
    out = []
    for e in entries:
        host = keys.member_host(e.key)
        if host is None:
            continue
        try:
            data = json.loads(e.value)
            pid, started, version = int(data["pid"]), float(data["started"]), str(data["version"])
            grants = str(data.get("grants", ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            pid, started, version, grants = 0, 0.0, "", ""
        out.append(Member(host, pid, started, version, e.create_revision, grants))
    out.sort(key=lambda m: (m.create_revision, m.host))
    return Members(tuple(out))


def register(session: EtcdSession, me: Member) -> None:
    """Put this host's member key under the session's lease."""
    session.put(session.keys.member(me.host), me.record(), leased=True)


def read_members(session: EtcdSession) -> Members:
    return parse_members(session.get_prefix(session.keys.members), session.keys)
