"""Bounded resources over a long run of a real ``adaptd serve``, driven fast.

4,000 job lifetimes (each: hello, step reports, three saves, then a clean goodbye or
a silent death that liveness turns into a lost job), then 16 jobs reporting an hour
of steps each (one report a simulated second) with a save a minute. The daemon's
memory must stop growing with the number of jobs it has seen, the registry must
forget finished and lost jobs beyond its cap, and the database must keep at most
``retention.rows`` rows per history table (plus one flush's worth) whatever the
inflow. The measured figures are printed (``pytest -s``) and recorded in
docs/reliability.md.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from adaptd.daemon.jobs.registry import MAX_INACTIVE_JOBS
from adaptd.state.store import Store

from ._abuse import Rank, Served, wait_until

pytestmark = pytest.mark.slow

LIFETIMES = 4000
WAVE = 100
ROWS = 2000  # retention.rows for this daemon: small, so the cap is reached many times over
HOUR_JOBS, HOUR_S = 16, 3600


@pytest.fixture
def where() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="adb-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def served_jobs_finished(status) -> int:
    return sum(j.state == "finished" for j in status.jobs)


def db_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.glob("adaptd.sqlite3*"))


def test_long_run_keeps_memory_registry_and_database_bounded(where: Path) -> None:
    served = Served(
        where,
        daemon={"liveness_timeout_s": 1.0, "sample_interval_s": 0.5, "log_level": "warning"},
        extra_toml=f"[retention]\nrows = {ROWS}\n",
    )
    ctx = zmq.Context()
    (where / "ck").mkdir()
    rss: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    try:
        for wave in range(LIFETIMES // WAVE):
            ranks = []
            for i in range(WAVE):
                r = Rank(ctx, served.endpoint, f"life-{wave}-{i}")
                r.hello(checkpoint_dir=str(where / "ck"), policy="fixed:steps=50", gpus=1)
                ranks.append(r)
            for step in (50, 100, 150):
                for r in ranks:
                    r.steps(step, count=50, mean_s=0.1)
                    r.saved(step)
            for i, r in enumerate(ranks):
                if i % 2 == 0:
                    r.goodbye(150)  # finished
                # the odd ones just vanish: silent for 1 s, they are lost
            # barrier: every report of this wave is in once a reconnect's reply is
            ranks[-1].hello(checkpoint_dir=str(where / "ck"), policy="fixed:steps=50")
            for r in ranks:
                r.close()
            rss.append(((wave + 1) * WAVE, served.rss() / 2**20))
        wait_until(lambda: served.status().daemon.jobs_active == 0, "all jobs ended", 30)
        lifetimes_s = time.perf_counter() - t0
        status = served.status()
        after_lifetimes = served.rss() / 2**20
        # an hour of reports from 16 jobs, as fast as they go
        t1 = time.perf_counter()
        jobs = [Rank(ctx, served.endpoint, f"hour-{j}") for j in range(HOUR_JOBS)]
        for r in jobs:
            r.hello(checkpoint_dir=str(where / "ck"), policy="fixed:steps=600")
        for second in range(1, HOUR_S + 1):
            for r in jobs:
                r.steps(second * 10, count=10, mean_s=0.1)
                if second % 60 == 0:
                    r.saved(second * 10, durable_s=2.0)
        for r in jobs:
            r.hello(checkpoint_dir=str(where / "ck"), policy="fixed:steps=600")  # barrier
            r.goodbye(HOUR_S * 10)
            r.close()
        wait_until(lambda: served.status().daemon.jobs_active == 0, "hour jobs finished", 30)
        hour_s = time.perf_counter() - t1
        end_rss = served.rss() / 2**20
        info = served.status().daemon
    finally:
        code = served.stop()
        ctx.destroy(linger=0)
    assert code == 0
    store = Store.open(where / "state" / "adaptd.sqlite3", readonly=True)
    counts = store.counts()
    store.close()
    size = db_bytes(where / "state") / 2**20
    # the registry is full (1,024 finished or lost jobs) after about 1,100 lifetimes and
    # the learned parameters (retention.rows = 2,000 jobs) after about 2,000; from then
    # on every new job evicts one of each, and memory must stay flat
    # compared as medians of ten waves each (2,100-3,000 and 3,100-4,000 lifetimes): one
    # reading of RSS moves by a few MiB with the allocator's arenas (a single reading 4.7 MiB
    # above its neighbours failed a run), a leak moves all ten
    full = statistics.median(m for n, m in rss if 2000 < n <= 3000)
    late = statistics.median(m for n, m in rss if n > 3000)
    print(
        f"\nbounds: {LIFETIMES} lifetimes in {lifetimes_s:.1f}s, RSS by lifetimes "
        f"{', '.join(f'{n}: {m:.1f}' for n, m in rss[::4])}, end {after_lifetimes:.1f} MiB; "
        f"registry {len(status.jobs)} jobs; {HOUR_JOBS} jobs x {HOUR_S} reports in "
        f"{hour_s:.1f}s, RSS {end_rss:.1f} MiB; messages {info.messages}; db rows {counts}, "
        f"db files {size:.2f} MiB"
    )
    # the registry forgets the oldest finished and lost jobs beyond its cap
    assert len(status.jobs) <= MAX_INACTIVE_JOBS
    assert status.daemon.jobs_lost > 0 and served_jobs_finished(status) > 0
    # memory: what the last 1,000 lifetimes and then 57,600 reports added
    assert late - full < 4, rss
    assert after_lifetimes - late < 6, (after_lifetimes, rss)
    assert end_rss - after_lifetimes < 4
    # the database: history capped per table (+ at most one flush's worth), params too
    for table in ("saves", "decisions", "failures"):
        assert counts[table] <= ROWS * 1.1, counts
    assert counts["params"] <= ROWS * 1.1, counts
    assert size < 8, f"database files {size:.1f} MiB"
    assert os.path.exists(where / "state" / "adaptd.sqlite3")


def test_learned_parameters_are_kept_for_at_most_retention_rows_jobs(tmp_path: Path) -> None:
    """Each job's learned costs are one params row; with jobs coming and going (unique
    ids, as schedulers make them) they are capped like the history, newest kept."""
    now = [1_000_000.0]
    store = Store.open(tmp_path / "s.db", retention_rows=100, clock=lambda: now[0])
    for i in range(300):
        now[0] += 1
        store.set_param(f"job:j{i}", "learned", {"saves": i})
        if i % 50 == 49:
            store.flush()
    store.set_param("global", "failure_rate", {"n": 1})
    store.prune()
    counts = store.counts()
    assert counts["params"] == 101  # 100 jobs and the global row
    assert store.params("job:j299") == {"learned": {"saves": 299}}
    assert store.params("job:j199") == {} and store.params("global") != {}
    store.close()
