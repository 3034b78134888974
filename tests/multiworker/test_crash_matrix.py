"""The multi-worker crash matrix (issue 26, item 2): a real 2-worker
``MultiWorkerMirroredStrategy`` job (tests/multiworker/rank_worker.py, its plain input:
each rank its own shard of a shuffled pipeline and its own random generator; Adam; a
save every 10 of 50 steps; the collective timeout set with ``CommunicationOptions`` as
a user would) meets one fault per cell, is started again from its checkpoints, and
must end as the uninterrupted run did.

Each cell checks: **0 hangs** (after the fault every surviving worker ends by itself
within a deadline; one that does not is killed and the cell fails), **0 mixed
resumes** (every rank restores the same step) and **an exact resume** (weights,
optimizer variables, step and the next batches, i.e. the data order, equal to the
uninterrupted run's). The figures of every cell (seconds from the fault until the
last worker ended, the step resumed from) are printed with ``-s`` and recorded in
docs/reliability.md ("The multi-worker crash matrix").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.zygote import Zygote

from adaptd.checkpoints import rank_parts
from adaptd.commands._spawn import stop_daemon
from adaptd.protocol import admin
from adaptd.telemetry.storage import existing_ancestor, mount_of, parse_mountinfo
from multiworker.daemons import serve
from multiworker.forked import ForkedCluster
from multiworker.rank_jobs import COMPARED, EVERY, HERE, KEEP, REPO, STEPS

sys.path.insert(0, str(REPO / "scripts"))
from local_etcd import EtcdMissing, running

pytestmark = [pytest.mark.slow, pytest.mark.tf]

WORKERS = 2
#: The job's collective timeout (``CommunicationOptions(timeout_seconds=...)``).
COLLECTIVE_TIMEOUT_S = 5.0
#: After a fault, the longest a surviving worker may take to end by itself.
HANG_S = COLLECTIVE_TIMEOUT_S + 30.0
#: The longest any phase of a run may take (TensorFlow's start-up on a loaded box).
PHASE_S = 180.0
#: The step at which every rank waits while the test kills daemons or stops etcd.
HOLD_AT = 12
#: The job as every run of the matrix has it (the uninterrupted one too).
JOB = {
    "INPUTS": "plain",
    "COLLECTIVE_TIMEOUT": f"{COLLECTIVE_TIMEOUT_S:g}",
    "STEPS": str(STEPS),
    "EVERY": str(EVERY),
    "KEEP": str(KEEP),
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One fault: rank ``victim`` gets ``sig`` after step ``at`` (``how``: at that step,
    ``write`` at its first save from there on whose write is in flight, ``round`` as it
    reads the proposal of a round the other rank asks for then); with ``daemons``
    every rank talks to its own host's ``adaptd serve``, and ``kill_daemons`` of them
    are SIGKILLed (``stop_etcd``: their etcd is SIGSTOPped) at step :data:`HOLD_AT`."""

    victim: int
    at: int
    sig: str = "SIGKILL"
    how: str = "step"
    daemons: bool = False
    kill_daemons: tuple[int, ...] = ()
    stop_etcd: bool = False

    def env(self, mark: Path) -> dict[str, str]:
        env = {**JOB, "KILL_RANK": str(self.victim), "KILL_AT": str(self.at)}
        env.update(KILL_SIGNAL=self.sig, KILL_MARK=str(mark))
        if self.how == "write":
            env["KILL_IN_WRITE"] = "1"
        elif self.how == "round":
            env["KILL_IN_ROUND"] = "1"
        return env


CELLS = {
    "chief-sigkill": Cell(victim=0, at=23),
    "rank-sigkill": Cell(victim=1, at=27),
    "rank-sigstop": Cell(victim=1, at=23, sig="SIGSTOP"),
    "chief-killed-in-write": Cell(victim=0, at=20, how="write"),
    "rank-killed-in-write": Cell(victim=1, at=20, how="write"),
    "rank-killed-in-round": Cell(victim=1, at=23, how="round"),
    "chief-daemon-killed": Cell(victim=1, at=43, daemons=True, kill_daemons=(0,)),
    "every-daemon-killed": Cell(victim=1, at=43, daemons=True, kill_daemons=(0, 1)),
    "etcd-stopped": Cell(victim=1, at=43, daemons=True, stop_etcd=True),
}

#: What each cell measured, printed at the end of the module (``-s``).
OUTCOMES: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("crash")
    if OUTCOMES:
        print("\ncrash matrix:")
        for name, got in OUTCOMES.items():
            print(f"  {name:22s} {json.dumps(got)}")


def job(zygote: Zygote, work: Path, ckpt: Path, env: dict[str, str]) -> ForkedCluster:
    """The job of tests/multiworker/rank_worker.py on WORKERS workers (not started)."""
    env = {"CKPT": str(ckpt), **env}
    return ForkedCluster(zygote, work, WORKERS, HERE / "rank_worker.py", env=env)


def run(zygote: Zygote, work: Path, ckpt: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """The job to its end; its results."""
    with job(zygote, work, ckpt, env) as cluster:
        return cluster.wait_ok(PHASE_S)


@pytest.fixture(scope="module")
def uninterrupted(root: Path, zygote: Zygote) -> list[dict[str, Any]]:
    """The same job without a fault: what every cell must end with."""
    results = run(zygote, root / "reference", root / "reference" / "ckpt", JOB)
    OUTCOMES["uninterrupted"] = {"weights": results[0]["plain"]["weights"][:12]}
    return results


# ------------------------------------------------------------------ hosts and etcd


def storage_of(path: Path) -> str:
    """The mount point under ``path`` (the fleet's shared target)."""
    mount = mount_of(
        existing_ancestor(str(path)), parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    )
    assert mount is not None
    return mount.mountpoint


def fleet_config(url: str, ckpt: Path) -> str:
    """The daemons' fleet settings: etcd at ``url``, the checkpoint storage shared by
    both hosts with a fleet-wide cap of one write."""
    shared = json.dumps(storage_of(ckpt))
    return (
        f'[storage."shared"]\npath = {shared}\nmax_concurrent_saves = 1\n'
        f'[fleet]\netcd = [{json.dumps(url)}]\nhost = "host-{{host}}"\n'
        f'lease_ttl_s = 3\ncall_timeout_s = 0.5\n[fleet.shared]\n{shared} = "crash-matrix"\n'
    )


@dataclasses.dataclass
class Hosts:
    """Each rank's ``adaptd serve`` (``daemons``, sockets under ``root``) and the fleet's
    etcd (or None)."""

    root: Path
    daemons: list[Any]
    etcd: Any = None

    def sockets(self) -> str:
        return ",".join(f"ipc://{self.root / name / 'd.sock'}" for name in ("a", "b"))


@contextlib.contextmanager
def hosts(short: Path, cell: Cell, ckpt: Path) -> Iterator[Hosts]:
    """The hosts of ``cell`` (no daemon unless ``cell.daemons``, no etcd unless
    ``cell.stop_etcd``); every one ended on the way out."""
    with contextlib.ExitStack() as stack:
        got = Hosts(short, [])
        config = ""
        if cell.stop_etcd:
            pytest.importorskip("etcd3gw", reason="needs etcd3gw (pip install 'adaptd[fleet]')")
            try:
                got.etcd = stack.enter_context(running(short / "etcd"))
            except EtcdMissing as exc:
                pytest.skip(str(exc))
            stack.callback(got.etcd.resume)  # a stopped etcd is killed, not left stopped
            config = fleet_config(got.etcd.url, ckpt)
        for name in ("a", "b")[: WORKERS if cell.daemons else 0]:
            got.daemons.append(serve(short, name, f"fixed:steps={EVERY}", config))
            stack.callback(stop_daemon, got.daemons[-1])
        yield got


# ------------------------------------------------------------------ the run with the fault


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state ``T`` in /proc)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    return False


def wait_until(what: str, check: Any, cluster: ForkedCluster, timeout: float = PHASE_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            cluster.kill()
            raise AssertionError(f"no {what} within {timeout:g}s\n{cluster.tails()}")
        time.sleep(0.02)


def inject(cell: Cell, cluster: ForkedCluster, hosts: Hosts, hold: Path) -> None:
    """Every rank waits after step HOLD_AT (no collective in flight): kill the daemons
    (or stop etcd) the cell names, then let the ranks go on."""
    held = [Path(f"{hold}.{r}") for r in range(WORKERS)]
    wait_until(f"hold at step {HOLD_AT}", lambda: all(p.exists() for p in held), cluster)
    for i in cell.kill_daemons:
        hosts.daemons[i].kill()
        hosts.daemons[i].wait(10)
    if cell.stop_etcd:
        for sock in hosts.sockets().split(","):  # both daemons were in the fleet
            wait_until("fleet of both hosts", lambda s=sock: in_fleet(s[len("ipc://") :]), cluster)
        hosts.etcd.pause()
    Path(f"{hold}.go").write_text("go")


def in_fleet(sock: str) -> bool:
    """Whether the daemon at ``sock`` is in a fleet of both hosts, up."""
    reply = admin.request(Path(sock), admin.StatusRequest(), timeout_s=10.0)
    assert isinstance(reply, admin.StatusReply) and reply.telemetry is not None
    fleet = reply.telemetry["fleet"]
    return bool(fleet["up"]) and len(fleet["hosts"]) == WORKERS


def faulted_run(zygote: Zygote, cell: Cell, work: Path, ckpt: Path, hosts: Hosts) -> dict[str, Any]:
    """The job with its fault, until every worker ended: what it measured."""
    env = cell.env(work / "mark")
    if cell.daemons:
        env.update(SOCKETS=hosts.sockets(), STEP_S="0.04", HOLD_AT=str(HOLD_AT))
        env["HOLD_FILE"] = str(work / "hold")
    survivors = [r for r in range(WORKERS) if r != cell.victim]
    with job(zygote, work / "faulted", ckpt, env) as cluster:
        if cell.daemons:
            inject(cell, cluster, hosts, work / "hold")
        victim = cluster.procs[cell.victim]
        if cell.sig == "SIGSTOP":
            wait_until("stopped victim", lambda: stopped(victim.pid), cluster)
        else:
            wait_until("dead victim", lambda: victim.poll() is not None, cluster)
            assert victim.returncode == -signal.SIGKILL, cluster.tails()
        fault = time.monotonic()
        done = lambda: all(cluster.procs[r].poll() is not None for r in survivors)  # noqa: E731
        try:
            wait_until("end of the surviving workers (a hang)", done, cluster, HANG_S)
        finally:
            ended_s = time.monotonic() - fault
            if cell.sig == "SIGSTOP":  # the stopped rank is the fault, not a hang: reap it
                victim.kill()
        codes = [cluster.procs[r].returncode for r in survivors]
        tails = cluster.tails()
        why = [failure(cluster.procs[r].log.lines) for r in survivors]
    # a survivor ends with an error (its collective or its coordination service
    # failed): never 0, as if the job had finished
    assert all(c not in (0, None) for c in codes), tails
    return {"ended_s": round(ended_s, 2), "survivor_exit": codes, "why": why}


def failure(lines: list[str]) -> str:
    """The error a worker ended with (the last line naming one; else its last line)."""
    errors = [
        ln.strip()
        for ln in lines
        if ("Error" in ln or "abort" in ln) and not ln.startswith("WARNING")
    ]
    last = [ln.strip() for ln in lines if ln.strip()]
    return (errors or last or [""])[-1][:160]


def complete_steps(ckpt: Path) -> list[int]:
    """The steps whose replicated part and every rank's part are in ``ckpt``."""
    names = rank_parts.listing(ckpt)
    return sorted(s for s in rank_parts.steps(names) if rank_parts.status(names, s).complete)


@pytest.mark.parametrize("name", list(CELLS))
def test_the_job_resumes_from_one_step_exactly_after(
    name, root, zygote, uninterrupted, short_dir
) -> None:
    cell = CELLS[name]
    work = root / name
    ckpt = work / "ckpt"
    with hosts(short_dir, cell, ckpt) as on:
        outcome = faulted_run(zygote, cell, work, ckpt, on)
        saved = complete_steps(ckpt / "plain")
        env = {**JOB, "SOCKETS": on.sockets()} if cell.daemons else JOB
        resumed = run(zygote, work / "resumed", ckpt, env)
    starts = [r["plain"]["resumed_from"] for r in resumed]
    outcome.update(complete=saved, resumed_from=starts)
    skipped = {r["plain"]["skipped"] for r in resumed if "skipped" in r["plain"]["skipped"]}
    if skipped:  # why the newest step on disk was not resumed from (told the daemon)
        outcome["skipped"] = sorted(skipped)
    mark = work / "mark"
    last = json.loads(mark.read_text())["step"] if mark.exists() else cell.at
    exact = all(
        r["plain"][k] == u["plain"][k]
        for r, u in zip(resumed, uninterrupted, strict=True)
        for k in COMPARED
    )
    outcome["exact"] = exact
    OUTCOMES[name] = outcome
    assert len(set(starts)) == 1, f"a mixed resume: ranks restored steps {starts}"
    assert 0 < starts[0] <= last, outcome
    assert starts[0] == max(s for s in saved if s <= last), outcome
    if cell.daemons:  # the job saved on after its daemons (or etcd) went away
        assert starts[0] > HOLD_AT, outcome
    for rank, (got, want) in enumerate(zip(resumed, uninterrupted, strict=True)):
        for key in COMPARED:
            assert got["plain"][key] == want["plain"][key], f"rank {rank}: {key} differs"
