"""What each daemon sees wrong with its own ranks, for the deciding daemons of their jobs.

A job of several hosts is judged by one daemon (the chief's: :mod:`adaptd.daemon.jobs.stall_watch`),
but the facts that name the culprit of a hang (a rank's process stopped ``T`` or in ``D``
state, its heartbeat stopped, its GPU's XID) belong to the rank's own daemon. Neither
channel of the job carries them during a hang (the ranks' training threads are blocked:
docs/multiworker.md, "Hangs"); etcd reaches every daemon whatever the ranks do. So each
daemon puts, under its own host's prefix, one leased key per rank *in trouble*::

    {prefix}ranks/{host}/{job}/{rank}  ->  {"version": 1, "state": "its process ... is stopped (T)"}

and deletes it when the rank is well again (the lease takes them all when the daemon
goes). A healthy fleet holds no such key, so the deciding daemon reads the whole
``ranks/`` prefix (a handful of keys) while one of its jobs is suspect, and only then.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from adaptd.core.stall import RankFact
from adaptd.fleet.keys import KeySpace
from adaptd.fleet.session import EtcdSession

__all__ = ["FACT_VERSION", "MAX_STATE", "decode", "encode", "read_facts", "write"]

#: Version of the published fact.
FACT_VERSION = 1
#: The longest state kept (a reason's part, never a document).
MAX_STATE = 300


def encode(fact: RankFact) -> bytes:
    return json.dumps({"version": FACT_VERSION, "state": fact.state[:MAX_STATE]}).encode()


def decode(keys: KeySpace, key: str, value: bytes) -> RankFact:
    """The fact under ``key``; raises :class:`ValueError` naming what is wrong with it."""
    parts = keys.rank_parts(key)
    if parts is None:
        raise ValueError(f"{key}: not a rank key under {keys.ranks}")
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{key}: not JSON ({exc})") from None
    state = doc.get("state") if isinstance(doc, dict) else None
    if not isinstance(state, str) or not state:
        raise ValueError(f"{key}: no state (a non-empty string) in {value[:80]!r}")
    host, job, rank = parts
    return RankFact(job=job, rank=rank, host=host, state=state[:MAX_STATE])


def write(session: EtcdSession, keys: KeySpace, host: str, job: str, rank: int,
          fact: RankFact | None) -> None:  # fmt: skip
    """Put ``fact`` (leased) or, with None, delete what ``host`` said of that rank."""
    key = keys.rank(host, job, rank)
    if fact is None:
        session.delete(key)
    else:
        session.put(key, encode(fact), leased=True)


def read_facts(
    session: EtcdSession, keys: KeySpace, jobs: Iterable[str]
) -> tuple[Mapping[str, tuple[RankFact, ...]], list[str]]:
    """Every fact the fleet holds about a rank of ``jobs`` (each job present, with no
    fact or some), and a line per key that could not be read (skipped)."""
    wanted = set(jobs)
    out: dict[str, list[RankFact]] = {job: [] for job in wanted}
    skipped: list[str] = []
    for entry in session.get_prefix(keys.ranks):
        try:
            fact = decode(keys, entry.key, entry.value)
        except ValueError as exc:
            skipped.append(str(exc))
            continue
        if fact.job in wanted:
            out[fact.job].append(fact)
    return {job: tuple(sorted(facts, key=lambda f: f.rank)) for job, facts in out.items()}, skipped
