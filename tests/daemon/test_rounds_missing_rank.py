"""A rank that never says hello to a restarted daemon does not stop the job's rounds
(issue 26).

A daemon runs the agreement rounds of a job whose ranks have no runtime of their own
only once every rank said hello in this run: a rank it has not heard of could not
acknowledge. After a daemon restart the ranks come back one by one, and a rank that
died while the daemon was down never does; before the fix every later round waited
for it. The real registry and rounds, driven with the times passed in.
"""

from __future__ import annotations

import logging

import pytest

from adaptd.core.snapshot import Decision
from adaptd.daemon.jobs.registry import Registry
from adaptd.daemon.jobs.rounds import Agreements
from adaptd.daemon.stats import DaemonStats
from adaptd.protocol import job as p

WORLD = 3
TIMEOUT_S = 10.0


def hello(rank: int, step: int = 500) -> p.Hello:
    return p.Hello(v=p.VERSION, job="back", rank=rank, world_size=WORLD, resumed_from=step,
                   agreement="daemon")  # fmt: skip


@pytest.fixture
def daemon() -> tuple[Registry, Agreements, list[tuple[int, p.DaemonMessage]]]:
    """A daemon's registry and rounds that just (re)started: they know no job."""
    sent: list[tuple[int, p.DaemonMessage]] = []
    agreements = Agreements(
        send=lambda rank, msg, now: sent.append((rank.rank, msg)),
        stats=DaemonStats(),
        timeout_s=TIMEOUT_S,
    )
    return Registry(), agreements, sent


def come_back(registry: Registry, agreements: Agreements, ranks, now: float):
    job = None
    for r in ranks:
        job, rank, _ = registry.hello(f"id-{r}".encode(), hello(r), now)
        agreements.on_hello(job, rank, now)
    return job


def plan(every: int) -> Decision:
    return Decision(next_step=600, every_steps=every, reason="test", policy="fixed")


def test_rounds_go_on_without_a_rank_that_never_comes_back(daemon, caplog) -> None:
    registry, agreements, sent = daemon
    t0 = 1000.0
    job = come_back(registry, agreements, (0, 1), t0)  # rank 2 died while it was down
    agreements.want_plan(job, plan(50), t0)
    agreements.tick([job], t0 + TIMEOUT_S / 2)
    assert sent == []  # rank 2 may still be on its way back: waited for
    with caplog.at_level(logging.WARNING, logger="adaptd.server"):
        agreements.tick([job], t0 + TIMEOUT_S + 0.5)
    proposals = [(r, m) for r, m in sent if isinstance(m, p.Propose)]
    assert sorted(r for r, _ in proposals) == [0, 1], sent  # to the live ranks only
    assert proposals[0][1].every_steps == 50
    assert "round_without_ranks" in caplog.text and "missing=1" in caplog.text
    # the round is decided by the ranks that are there
    sent.clear()
    prop = proposals[0][1]
    for r in (0, 1):
        ack = p.Ack(v=p.VERSION, job="back", rank=r, round=prop.round, step=510, ok=True)
        agreements.on_ack(job, ack, t0 + TIMEOUT_S + 1)
    decides = [(r, m) for r, m in sent if isinstance(m, p.Decide)]
    assert sorted(r for r, _ in decides) == [0, 1] and all(m.commit for _, m in decides)


def test_a_rank_that_comes_back_late_gets_the_plan_in_the_next_round(daemon) -> None:
    registry, agreements, sent = daemon
    t0 = 1000.0
    job = come_back(registry, agreements, (0, 1), t0)
    job.plan = plan(50)
    agreements.want_plan(job, plan(50), t0)
    agreements.tick([job], t0 + TIMEOUT_S + 0.5)
    prop = next(m for _, m in sent if isinstance(m, p.Propose))
    for r in (0, 1):
        ack = p.Ack(v=p.VERSION, job="back", rank=r, round=prop.round, step=510, ok=True)
        agreements.on_ack(job, ack, t0 + TIMEOUT_S + 1)
    sent.clear()
    come_back(registry, agreements, (2,), t0 + 30)  # it was alive after all
    again = [(r, m) for r, m in sent if isinstance(m, p.Propose)]
    assert sorted(r for r, _ in again) == [0, 1, 2] and again[0][1].every_steps == 50
