"""The deciding daemon's watch for hung jobs: progress and heartbeats in, an
:class:`~adaptd.protocol.job.Abort` out when a job stalled.

Each rank's hook beats about once a second from a thread of its own
(:class:`~adaptd.protocol.job.Beat`, :mod:`adaptd.client.daemon.heartbeat`), blocked
loop or not; its step reports say when the job last made progress. Once a second
(:meth:`StallWatch.tick`) the watch gathers the facts of each job of several ranks that
this daemon decides and asks the pure decision (:func:`adaptd.core.stall.decide`)
whether it stalled. When it did, the watch names the likely culprit (a local rank
whose process is gone, stopped ``T`` or in uninterruptible sleep ``D``, whose
heartbeat stopped while the others' went on, or whose GPU reported an XID) and
answers every beat of the job's ranks with an Abort, from then on (a rank that comes
back finds the job aborted). Ranks on other hosts are freed by the job's own runtime:
once the local survivors abort their collectives and exit, the remote ranks' next
collective fails as after a peer's death, and they save just in time the same way.

**Ranks on other hosts** are named through the *peers* (:class:`Peers`, the fleet's
etcd where ``[fleet]`` is configured): every daemon tells them what it sees wrong with
its own ranks of a job of several ranks (a :class:`~adaptd.core.stall.RankFact`, only
for a rank in trouble, taken back when it is well again), and the deciding daemon,
once a job with ranks elsewhere has been silent for :data:`PEERS_AT` of its threshold,
has the peers read that job's facts (off its loop), so that the abort names ``rank 1 on
host-b: its process (pid 4242) is stopped (T)``.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from adaptd import events as ev
from adaptd.core import stall
from adaptd.core.snapshot import Snapshot
from adaptd.daemon.jobs.table import Job, JobTable, Rank
from adaptd.protocol import job as p
from adaptd.telemetry.host import ProcessInfo, process_info

__all__ = [
    "BEAT_LOST_S",
    "PEERS_AT",
    "Limits",
    "Peers",
    "StallVerdicts",
    "StallWatch",
    "Watched",
    "no_limits",
    "unseen",
]

#: A rank whose heartbeat is this much older than the newest beat of its job stopped
#: beating (the hook beats every second).
BEAT_LOST_S = 5.0
#: A beat says what holds its rank's loop only this long (a stopped rank's last beat
#: may have been sent in a save's blocking part: it holds nothing now).
HOLD_FRESH_S = 2.5
#: The share of its threshold a job with ranks on other hosts is silent for before the
#: deciding daemon has the peers read their facts (so they are there at the abort).
PEERS_AT = 0.5
#: Process states that name a rank that cannot be the blocked-but-alive kind.
_STUCK = {"stopped": "stopped (T)", "tracing-stop": "stopped (T)", "disk-sleep": "in D state"}

#: A job's limits from the config (None: the defaults).
Limits = Callable[[str], "stall.StallLimits | None"]


#: A job id -> the newest verdict on it and the silence judged (None: not watched).
StallVerdicts = Callable[[str], "tuple[stall.StallVerdict, float] | None"]


class Peers(Protocol):
    """The daemons of a job's other hosts, as the stall watch sees them (the fleet's
    etcd: :class:`adaptd.fleet.part.RankPeers`). Every call returns at once: the I/O is
    done off the daemon's loop."""

    #: How the facts travel, for the reasons ("the fleet's etcd").
    channel: str

    def tell(self, job: str, rank: int, state: str | None) -> None:
        """This host's fact about its rank ``rank`` of ``job`` (None: nothing wrong now)."""

    def watch(self, jobs: frozenset[str]) -> None:
        """Read the facts of ``jobs`` from now on (the set replaces the last one)."""

    def facts(self, job: str) -> Sequence[stall.RankFact] | None:
        """The newest facts read for ``job`` (None: not read since it was watched)."""


def no_limits(job: str) -> stall.StallLimits | None:
    """No job has limits of its own: every job's are the defaults."""
    return None


@dataclass
class Watched:
    """What the watch keeps of one job's run (reset when a new incarnation starts)."""

    incarnation: int
    first_step: int
    step: int
    progress_at: float
    longest_s: float = 0.0
    #: rank -> (time of its newest beat, what holds its loop, its beat connection)
    beats: dict[int, tuple[float, str, bytes]] = field(default_factory=dict)
    verdict: stall.StallVerdict | None = None
    silent_s: float = 0.0
    aborted: p.Abort | None = None
    #: the hook's own limits (a rank's beat), which win over the config's
    floor_s: float | None = None
    cap_s: float | None = None


def unseen(world_size: int, here: Iterable[int], channel: str = "", read: bool = False) -> str:
    """Why no culprit is named when no rank connected here is gone, stopped, silent
    or on a GPU that reported an XID: with every rank here, the cause is not known (a
    rank asleep in its step looks like one waiting in its collective); with ranks on
    other hosts, the reason says which, and whether their daemons said nothing wrong
    through ``channel`` (``read``: their facts were read) or they cannot be seen from
    here (no channel: docs/multiworker.md, "Hangs"), rather than guessing either way."""
    seen = sorted(set(here))
    away = [rank for rank in range(world_size) if rank not in seen]
    if not away:
        return "every rank seen here is alive and beating: the cause is not known"
    if channel and read:
        there = f"the daemons of {_listed(away)} on other hosts see nothing wrong ({channel})"
    elif channel:
        there = f"{_listed(away)} on other hosts not heard of yet ({channel})"
    else:
        there = f"{_listed(away)} on other hosts cannot be seen from here"
    return (
        f"no rank on this host ({_listed(seen)}) is gone, stopped, silent or on a GPU "
        f"that reported an XID, and {there}: the cause is not known"
    )


def _listed(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 1, 2``, ``no rank``."""
    if not ranks:
        return "no rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class StallWatch:
    """Judges the jobs of ``table`` (see the module docstring).

    Args:
        table: the registry's jobs.
        send: sends a message to a job connection (the transport's).
        emit: the event bus.
        snapshot: the newest telemetry (the GPUs' XIDs).
        paused: whether an operator paused the job (``adaptd pause``).
        limits: the job's configured limits (None: the defaults).
        process: a pid's status (psutil's; tests may pass their own).
        peers: the daemons of the jobs' other hosts (None: none can be reached).
    """

    def __init__(
        self,
        table: JobTable,
        *,
        send: Callable[[bytes, p.Message], bool],
        emit: Callable[[ev.Event], None],
        snapshot: Callable[[], Snapshot | None] = lambda: None,
        paused: Callable[[str], bool] = lambda job: False,
        limits: Limits = no_limits,
        process: Callable[[int], ProcessInfo | None] = process_info,
        wall: Callable[[], float] = _time.time,
        peers: Peers | None = None,
    ) -> None:
        self.table, self.send, self.emit = table, send, emit
        self.snapshot, self.paused, self.limits = snapshot, paused, limits
        self.process, self.wall, self.peers = process, wall, peers
        self._jobs: dict[str, Watched] = {}
        self._told: dict[tuple[str, int], str] = {}  # what the peers were told, per rank
        self._suspects: frozenset[str] = frozenset()  # the jobs whose facts they read

    # ------------------------------------------------------------------ facts in

    def _watched(self, job: Job, now: float) -> Watched:
        w = self._jobs.get(job.id)
        if w is None or w.incarnation != job.incarnation:
            w = Watched(job.incarnation, job.step, job.step, now)
            self._jobs[job.id] = w
        return w

    def progress(self, job: Job, step: int, now: float, slowest_s: float = 0.0) -> None:
        """A rank of ``job`` reported ``step`` (its slowest step of the batch
        ``slowest_s``, a warm-up batch's left out by the caller)."""
        w = self._watched(job, now)
        if step > w.step:
            w.step, w.progress_at = step, now
        if w.step - w.first_step > stall.WARMUP_STEPS:
            w.longest_s = max(w.longest_s, slowest_s)

    def steps(self, job: Job, msg: p.Steps, now: float) -> None:
        """A step report."""
        self.progress(job, msg.step, now, 0.0 if msg.warmup else msg.max_s)

    def beat(self, job: Job, rank: Rank, identity: bytes, msg: p.Beat, now: float) -> None:
        """A heartbeat of ``rank`` from the connection ``identity``: answered with the
        job's Abort when the job was aborted."""
        w = self._watched(job, now)
        w.beats[rank.rank] = (now, msg.holding, identity)
        w.floor_s = msg.stall_floor_s if msg.stall_floor_s is not None else w.floor_s
        w.cap_s = msg.stall_cap_s if msg.stall_cap_s is not None else w.cap_s
        self.progress(job, msg.step, now)
        if w.aborted is not None:
            self.send(identity, w.aborted)

    def verdict(self, job_id: str) -> tuple[stall.StallVerdict, float] | None:
        """The newest verdict on ``job_id`` and the silence it judged (for status)."""
        w = self._jobs.get(job_id)
        return None if w is None or w.verdict is None else (w.verdict, w.silent_s)

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    # ------------------------------------------------------------------ judging

    def tick(self, now: float) -> None:
        """Judge every active job of several ranks that this daemon decides; tell the
        peers what is wrong with this host's ranks of every job of several ranks."""
        told: dict[tuple[str, int], str] = {}
        suspects: set[str] = set()
        for job in self.table:
            if job.state != "active" or job.world_size < 2:
                continue
            w = self._watched(job, now)
            if self.peers is not None:
                told.update(self._states(job, w, now))
            if not job.decides or w.aborted is not None:
                continue
            limits = self._limits(job.id, w)
            w.silent_s = now - w.progress_at
            w.verdict = stall.decide(self._facts(job, w, now), limits)
            if w.verdict.stalled:
                self._abort(job, w, now)
            elif self._suspect(job, w):
                suspects.add(job.id)
        if self.peers is not None:
            self._tell(told)
            if frozenset(suspects) != self._suspects:
                self._suspects = frozenset(suspects)
                self.peers.watch(self._suspects)

    @staticmethod
    def _suspect(job: Job, w: Watched) -> bool:
        """Whether ``job`` has ranks on other hosts (not connected here) and has been
        silent for :data:`PEERS_AT` of its threshold: their daemons' facts are read."""
        t = w.verdict.threshold_s if w.verdict is not None else None
        return len(job.ranks) < job.world_size and t is not None and w.silent_s >= PEERS_AT * t

    def _tell(self, told: dict[tuple[str, int], str]) -> None:
        """Tell the peers what changed since the last tick (a rank well again, or gone
        from the table, is taken back)."""
        assert self.peers is not None
        for (job, rank), state in told.items():
            if self._told.get((job, rank)) != state:
                self.peers.tell(job, rank, state)
        for job, rank in self._told.keys() - told.keys():
            self.peers.tell(job, rank, None)
        self._told = told

    def _limits(self, job_id: str, w: Watched) -> stall.StallLimits:
        """The config's limits, with the hook's own where its beats gave them (a pair
        that does not go together keeps the config's)."""
        limits = self.limits(job_id) or stall.StallLimits()
        floor = w.floor_s if w.floor_s is not None else limits.floor_s
        cap = w.cap_s if w.cap_s is not None else max(limits.cap_s, floor)
        try:
            return stall.StallLimits(floor, cap, limits.enabled)
        except ValueError:
            return limits

    def _held(self, job: Job, w: Watched, now: float) -> dict[int, str]:
        """What holds each rank's loop, from its fresh beats (a stale beat, or a rank
        whose process is stopped or gone, holds nothing: it may have stopped there)."""
        return {
            rank: holding
            for rank, (at, holding, _) in w.beats.items()
            if now - at <= HOLD_FRESH_S and not self._stuck(job.ranks.get(rank))
        }

    def _holding(self, job: Job, w: Watched, now: float) -> str:
        """What legitimately holds the job's ranks now ("": nothing). A rank in a save's
        blocking part holds the others (they wait in their collective), unless a rank's
        process is stopped or gone (then the hold may wait on it); a rank holding
        for an agreement round waits on the others' answers, which is legitimate only
        while every rank is in the hook: a rank outside it that the round waits for
        (a chief asleep in its step) is no round but a hang."""
        if self.paused(job.id):
            return "an operator's pause (adaptd pause)"
        if job.rounds is not None and job.rounds.open is not None:
            return "an agreement round of the daemon's holds the ranks"
        stuck = [rank.rank for rank in job.ranks.values() if self._stuck(rank)]
        if stuck:  # what the others hold may wait on it (a post to a stopped chief)
            return ""
        held = self._held(job, w, now)
        for rank, holding in sorted(held.items()):
            if holding == "save":
                return f"rank {rank} is in a save's blocking part"
        rounds = sorted(rank for rank, holding in held.items() if holding == "round")
        if rounds and all(held.get(rank) for rank in job.ranks):
            return f"rank(s) {', '.join(map(str, rounds))} hold for an agreement round"
        return ""

    def _facts(self, job: Job, w: Watched, now: float) -> stall.StallFacts:
        t = job.tracker
        since = t.last_save_time if t.last_save_time is not None else w.progress_at
        return stall.StallFacts(
            silent_s=now - w.progress_at,
            steps_done=w.step - w.first_step,
            step_s=t.step_time_s,
            longest_s=w.longest_s,
            gpus=t.gpus,
            restart_s=t.restore_s,
            unsaved_s=max(0.0, now - since),
            holding=self._holding(job, w, now),
        )

    def _stuck(self, rank: Rank | None) -> str:
        """Why ``rank``'s process (on this host) cannot be blocked-but-alive: gone,
        stopped (T) or uninterruptible (D); "" when it can, or cannot be seen."""
        if rank is None or not rank.checkable:
            return ""
        info = self.process(rank.pid)
        if info is None or not info.running:
            return "gone"
        return _STUCK.get(info.status, "")

    def _xids(self, job: Job) -> dict[int, str]:
        """This host's ranks of ``job`` on a GPU that reported an XID, and which."""
        snap = self.snapshot()
        pids = {r.pid: r.rank for r in job.ranks.values() if r.pid > 0}
        out: dict[int, str] = {}
        for gpu in snap.gpus if snap is not None else ():
            for pid in gpu.pids:
                if gpu.xid_events and pid in pids:
                    out.setdefault(pids[pid], f"GPU {gpu.index} reported XID {gpu.xid_events[0]}")
        return out

    def _states(self, job: Job, w: Watched, now: float) -> dict[tuple[str, int], str]:
        """What is wrong with each of this host's ranks of ``job`` (for the peers): its
        process stopped, in D state or gone, its heartbeat stopped (no beat for
        :data:`BEAT_LOST_S`, after it beat in this incarnation), its GPU's XID."""
        xids = self._xids(job)
        out: dict[tuple[str, int], str] = {}
        for rank in job.ranks.values():
            why = self._stuck(rank)
            at = w.beats.get(rank.rank, (None,))[0]
            if why:
                out[job.id, rank.rank] = f"its process (pid {rank.pid}) is {why}"
            elif at is not None and now - at > BEAT_LOST_S:
                out[job.id, rank.rank] = "its heartbeat stopped"
            elif rank.rank in xids:
                out[job.id, rank.rank] = f"its {xids[rank.rank]}"
        return out

    def culprit(self, job: Job, w: Watched, now: float) -> tuple[int | None, str]:
        """The rank taken for the cause of the stall, and why (None: unknown): a rank of
        this host first (its process, its heartbeat, its GPU), then what the peers
        said of the ranks on other hosts, then a rank outside a round the others hold for."""
        for rank in sorted(job.ranks.values(), key=lambda r: r.rank):
            why = self._stuck(rank)
            if why:
                return rank.rank, f"rank {rank.rank}'s process (pid {rank.pid}) is {why}"
        newest = max((at for at, _, _ in w.beats.values()), default=None)
        if newest is not None and now - newest < BEAT_LOST_S:
            for rank in sorted(job.ranks):
                at = w.beats.get(rank, (None,))[0]
                if at is None or newest - at > BEAT_LOST_S:
                    return rank, f"rank {rank}'s heartbeat stopped"
        xids = self._xids(job)
        if xids:
            rank = min(xids)
            return rank, f"rank {rank}'s {xids[rank]}"
        remote = self.peers.facts(job.id) if self.peers is not None else None
        for fact in sorted(remote or (), key=lambda f: f.rank):
            if fact.rank not in job.ranks and fact.rank < job.world_size:
                return fact.rank, (
                    f"rank {fact.rank} on {fact.host}: {fact.state} (seen by its daemon, "
                    f"through {self.peers.channel})"  # type: ignore[union-attr]
                )
        held = self._held(job, w, now)
        if "round" in held.values():
            out = [rank for rank in sorted(job.ranks) if not held.get(rank)]
            if len(out) == 1:
                return out[0], (
                    f"rank {out[0]} is alive but outside the hook while the others hold for "
                    "an agreement round it does not answer"
                )
        channel = self.peers.channel if self.peers is not None else ""
        return None, unseen(job.world_size, job.ranks, channel, read=remote is not None)

    def _abort(self, job: Job, w: Watched, now: float) -> None:
        verdict = w.verdict
        assert verdict is not None and verdict.threshold_s is not None
        culprit, why = self.culprit(job, w, now)
        reason = f"the job stalled: {verdict.reason}; {why}"
        w.aborted = p.Abort(v=p.VERSION, job=job.id, reason=reason[: p.MAX_TEXT],
                            culprit=culprit, incarnation=job.incarnation)  # fmt: skip
        for _, _, identity in w.beats.values():
            self.send(identity, w.aborted)
        self.emit(ev.JobStalled(now, self.wall(), job.id, step=w.step, silent_s=w.silent_s,
                                threshold_s=verdict.threshold_s, culprit=culprit,
                                reason=reason, gpus=job.tracker.gpus))  # fmt: skip
