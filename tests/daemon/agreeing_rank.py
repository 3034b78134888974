"""A rank of a job without a runtime of its own, agreeing through a real daemon.

A thread with the client's own parts (:class:`DaemonLink`, :class:`DaemonRounds`,
:class:`SaveSchedule`) running the hook's loop in miniature: a slow path at a tick or
at a due step, where it reads the daemon's messages, answers proposals, holds at an
undecided step, applies committed changes and saves. It says hello again when the
daemon does not know it (a restarted daemon), reports steps and saves, and records
every save step, every applied change and any plain Plan or SaveNow (which a job
whose ranks agree through the daemon must never get).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from adaptd.client.agreement.daemon_rounds import DaemonRounds
from adaptd.client.daemon.link import DaemonLink
from adaptd.client.save.schedule import SaveSchedule
from adaptd.protocol import job as p


@dataclass
class RankRecord:
    saves: list[int] = field(default_factory=list)
    applied: list[tuple[str, int, int]] = field(default_factory=list)  # (action, at, step)
    plain: list[p.DaemonMessage] = field(default_factory=list)  # Plan/SaveNow received
    hellos: int = 0
    stalls: int = 0
    steps: int = 0


class AgreeingRank(threading.Thread):
    """Runs ``steps`` steps of ``pace_s`` (jittered) each, then stays connected until
    ``done`` is set (the job's ranks end together), then says goodbye."""

    def __init__(
        self,
        endpoint: str,
        job: str,
        rank: int,
        world_size: int,
        steps: int,
        *,
        pace_s: float = 0.001,
        hold_s: float = 3.0,
        done: threading.Event,
        deadline_s: float = 90.0,
    ) -> None:
        super().__init__(name=f"rank-{rank}", daemon=True)
        self.endpoint, self.job, self.rank, self.world = endpoint, job, rank, world_size
        self.total, self.pace_s, self.hold_s = steps, pace_s, hold_s
        self.done = done
        self.deadline = time.monotonic() + deadline_s
        self.record = RankRecord()
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced by the test
            self.error = exc
        finally:
            self.finished.set()

    def _hello(self, link: DaemonLink, now: float) -> None:
        self.record.hellos += 1
        link.send(p.Hello(v=p.VERSION, job=self.job, rank=self.rank, world_size=self.world,
                          agreement="daemon"), now)  # fmt: skip

    def _run(self) -> None:
        link = DaemonLink(self.endpoint, timeout_s=5.0)
        rounds = DaemonRounds(self.job, self.rank, timeout_s=self.hold_s)
        schedule = SaveSchedule()
        rec = self.record
        rng = random.Random(self.rank)
        n = 0

        def handle(now: float) -> None:
            for msg in link.receive(now):
                if isinstance(msg, p.Propose):
                    link.send(rounds.on_propose(msg, n), now)
                elif isinstance(msg, p.Decide):
                    rounds.on_decide(msg)
                elif isinstance(msg, p.Plan | p.SaveNow):
                    rec.plain.append(msg)
                elif isinstance(msg, p.Error) and msg.code == "unknown_peer":
                    self._hello(link, now)

        def wait(seconds: float) -> None:
            if link.poll(seconds):
                handle(time.monotonic())

        while not link.welcomed:
            assert time.monotonic() < self.deadline, f"rank {self.rank}: no Welcome"
            self._hello(link, time.monotonic())
            wait(0.05)
        tick, due, last_report, t_report = 0.0, 0, 0, time.monotonic()
        for _ in range(self.total):
            assert time.monotonic() < self.deadline, f"rank {self.rank} ran out of time"
            time.sleep(self.pace_s * (0.5 + rng.random()))
            n += 1
            now = time.monotonic()
            if now < tick and n < due:
                continue
            tick = now + 0.005
            handle(now)
            if now - t_report >= 0.1:  # the hook reports about once a second; faster here
                mean = (now - t_report) / max(1, n - last_report)
                link.send(p.Steps(v=p.VERSION, job=self.job, rank=self.rank, step=n,
                                  count=n - last_report, mean_s=mean), now)  # fmt: skip
                last_report, t_report = n, now
            rounds.settle(n, wait)
            for c in rounds.ledger.take(n):
                rounds.ledger.apply([c], n, schedule)
                rec.applied.append((c.action, c.at_step, n))
            if n >= schedule.due:
                rec.saves.append(n)
                schedule.saved(n)
                link.send(p.SaveReport(v=p.VERSION, job=self.job, rank=self.rank, step=n,
                                       blocking_s=0.01 * (1 + self.rank), durable_s=0.02,
                                       bytes=1), now)  # fmt: skip
            due = rounds.bound(schedule.due)
        rec.steps, rec.stalls = n, rounds.stalls
        # done: keep answering (proposals for steps passed are refused) until every
        # rank is done, as a job's ranks stay connected until they all end
        self.finished.set()
        while not self.done.is_set() and time.monotonic() < self.deadline:
            wait(0.01)
        link.send(p.Goodbye(v=p.VERSION, job=self.job, rank=self.rank, step=n), time.monotonic())
        link.close(linger_ms=200)
