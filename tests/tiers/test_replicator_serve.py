"""Replication by the daemon, end to end: a real ``adaptd serve`` with a config file.

Jobs are either a real TensorFlow training job (tests/client/train_script.py with the
hook, talking to the daemon) or a raw ZeroMQ peer speaking the protocol that reports
saves of checkpoint files the test writes into its staging directory (random bytes
under TF's file names: the replicator never looks inside them). Destinations are a
local directory standing for NFS and moto's S3 server on loopback (the ``s3`` fixture).
Every wait is on something the daemon says (a log line, a status row) or does (a file
at the destination), with a deadline; order, not timing, proves the staggering.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from adaptd.commands._spawn import LogWatch, start_daemon, stop_daemon
from adaptd.protocol import admin
from adaptd.protocol import job as p
from adaptd.tiers.replica import Replica

SCRIPT = Path(__file__).parents[1] / "client" / "train_script.py"
MIB = 2**20
DEADLINE = 60.0


# ---------------------------------------------------------------------- helpers


class Daemon:
    """``adaptd serve --config FILE`` in a subprocess, its log watched."""

    def __init__(self, root: Path, config: str) -> None:
        self.root = root
        self.socket = root / "adaptd.sock"
        self.config = root / "adaptd.toml"
        self.config.write_text(config)
        self.proc: subprocess.Popen | None = None
        self.log: LogWatch | None = None

    def start(self) -> Daemon:
        self.proc = start_daemon(
            self.socket, ["--config", str(self.config)], log=subprocess.PIPE, deadline_s=DEADLINE
        )
        self.log = LogWatch(self.proc.stderr, DEADLINE)
        return self

    def status(self) -> admin.StatusReply:
        reply = admin.request(self.socket, admin.StatusRequest(), timeout_s=10)
        assert isinstance(reply, admin.StatusReply)
        return reply

    def row(self, job: str, destination: str) -> admin.ReplicationInfo | None:
        rows = self.status().replication or []
        return next((r for r in rows if r.job == job and r.destination == destination), None)

    def wait_row(
        self, job: str, destination: str, ok: Callable[[admin.ReplicationInfo], bool]
    ) -> admin.ReplicationInfo:
        end = time.monotonic() + DEADLINE
        while True:
            r = self.row(job, destination)
            if r is not None and ok(r):
                return r
            if time.monotonic() > end:
                raise TimeoutError(f"status row {job}/{destination} never matched; last: {r}")
            assert self.proc is not None and self.proc.poll() is None, self.text()
            time.sleep(0.05)  # polling the daemon's status, not waiting for time to pass

    def text(self) -> str:
        return self.log.text() if self.log is not None else ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_daemon(self.proc)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for d in started:
        d.stop()


def config(root: Path, destinations: str, jobs: str, *, metrics: str = "off") -> str:
    return (
        f"[daemon]\nstate_dir = {json.dumps(str(root / 'state'))}\ndrain_grace_s = 0\n"
        f"[metrics]\nlisten = {json.dumps(metrics)}\n{destinations}\n{jobs}\n"
    )


def ckpt_bytes(nbytes: int, step: int) -> int:
    """What :func:`write_checkpoint` puts on disk for ``step``."""
    return nbytes + len(b"index of step %d" % step)


def write_checkpoint(staging: Path, step: int, nbytes: int) -> None:
    """A checkpoint as TF leaves it: data shard, index, then the state file naming it."""
    staging.mkdir(parents=True, exist_ok=True)
    data = random.Random(step).randbytes(nbytes)
    (staging / f"ckpt-{step}.data-00000-of-00001").write_bytes(data)
    (staging / f"ckpt-{step}.index").write_bytes(b"index of step %d" % step)
    (staging / "checkpoint").write_text(
        f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n'
    )


class Peer:
    """One rank of a job as a raw DEALER socket: hello with its checkpoint directory,
    then save reports for the steps the test wrote."""

    def __init__(self, daemon: Daemon, job: str, staging: Path) -> None:
        self.job = job
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"ipc://{daemon.socket}")
        self.send(p.Hello(v=p.VERSION, job=job, pid=os.getpid(), checkpoint_dir=str(staging)))
        end = time.monotonic() + DEADLINE
        while not isinstance(self.recv(end), p.Welcome):
            pass

    def recv(self, end: float) -> p.DaemonMessage:
        if not self.sock.poll(int(max(0.0, end - time.monotonic()) * 1000)):
            raise TimeoutError(f"{self.job}: no message from the daemon")
        return p.decode_daemon(self.sock.recv())

    def send(self, msg: p.Message) -> None:
        self.sock.send(p.encode(msg))

    def saved(self, step: int, nbytes: int) -> None:
        self.send(p.Steps(v=p.VERSION, job=self.job, rank=0, step=step, count=1, mean_s=0.1))
        self.send(
            p.SaveReport(v=p.VERSION, job=self.job, rank=0, step=step, blocking_s=0.01,
                         durable_s=0.1, bytes=nbytes)
        )  # fmt: skip

    def close(self) -> None:
        self.sock.close(0)


UPLOAD = re.compile(r"event=(replicate_start|replicated) destination=(\S+) job=(\S+) step=(\d+)")


def uploads(text: str, destination: str) -> list[tuple[str, str, int]]:
    """(start|done, job, step) for each upload log line of ``destination``, in order."""
    out = []
    for m in UPLOAD.finditer(text):
        if m.group(2) == destination:
            out.append(("start" if m.group(1) == "replicate_start" else "done", m.group(3),
                        int(m.group(4))))  # fmt: skip
    return out


def fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def scrape(d: Daemon) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The daemon's /metrics over HTTP: {(sample name, labels): value}."""
    assert d.log is not None
    url = fields(d.log.wait_for("event=metrics url="))["url"]
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


# ---------------------------------------------------------------------- staggering, cap


def test_two_jobs_share_a_destination_staggered_capped_and_pruned(tmp_path, daemons):
    """Two jobs, one destination with max_concurrent=1 and a 2 MiB/s cap. Both report
    two saves at once: uploads never overlap (start/done alternate in the log), the
    job that waited longest goes next, a queued older checkpoint is replaced by the
    newer one, each upload keeps under the cap, status and metrics show what is
    pending meanwhile, and keep_last=1 leaves one verified step per job."""
    dest = tmp_path / "nfs"
    staging = tmp_path / "local"
    d = Daemon(tmp_path, config(
        tmp_path,
        f'[destinations.nfs]\nurl = "{dest}"\nbandwidth_mib_s = 2\nmax_concurrent = 1\n'
        "keep_last = 1\n",
        f'[jobs."job-*"]\nstaging = "{staging}/{{job}}"\nreplicate_to = ["nfs"]\n',
        metrics="127.0.0.1:0",
    ))  # fmt: skip
    daemons.append(d.start())
    size = 3 * MIB  # 1.5 s per upload at the cap
    a, b = (Peer(d, j, staging / j) for j in ("job-a", "job-b"))
    for step in (1, 2):
        for peer in (a, b):
            write_checkpoint(staging / peer.job, step, size)
    a.saved(1, size)
    d.log.wait_for("event=replicate_start", "job=job-a", "step=1")
    b.saved(1, size)
    d.wait_row("job-b", "nfs", lambda r: r.pending_step == 1)  # b is in line before a's 2
    a.saved(2, size)
    b.saved(2, size)  # replaces b's queued step 1, keeping b's place

    # while a's first upload runs: b waits with its newer checkpoint, a with step 2
    row_b = d.wait_row("job-b", "nfs", lambda r: r.pending_step == 2)
    assert row_b.pending_bytes == ckpt_bytes(size, 2)
    assert row_b.seconds_behind > 0 and row_b.last_step is None
    m = scrape(d)
    labels = {"destination": "nfs", "job_id": "job-b"}
    assert sample(m, "adaptd_replication_pending_bytes", **labels) == ckpt_bytes(size, 2)
    assert sample(m, "adaptd_replication_pending_uploads", **labels) == 1
    assert sample(m, "adaptd_replication_lag_seconds", **labels) > 0

    d.wait_row("job-a", "nfs", lambda r: r.last_step == 2 and r.pending_uploads == 0)
    d.wait_row("job-b", "nfs", lambda r: r.last_step == 2 and r.pending_uploads == 0)
    events = uploads(d.text(), "nfs")
    assert events == [
        ("start", "job-a", 1), ("done", "job-a", 1),
        ("start", "job-b", 2), ("done", "job-b", 2),  # b waited longest; its 1 was replaced
        ("start", "job-a", 2), ("done", "job-a", 2),
    ], d.text()  # fmt: skip

    # the cap, measured per upload by the daemon: bytes sent <= 2 MiB/s x (seconds + the
    # throttle's 0.25 s burst), and not starved either (>= a quarter of the cap)
    done = [fields(ln) for ln in d.text().splitlines() if "event=replicated " in ln]
    assert len(done) == 3
    for f in done:
        sent, seconds = int(f["bytes_sent"]), float(f["seconds"])
        assert sent == ckpt_bytes(size, int(f["step"]))
        assert sent <= 2 * MIB * (seconds + 0.25) * 1.02, f
        assert sent / seconds >= 0.25 * 2 * MIB, f

    for job in ("job-a", "job-b"):
        replica = Replica(str(dest / job))
        assert replica.latest() == 2
        assert replica.steps() == [2]  # keep_last = 1: step 1 of job-a was pruned
        assert replica.verify(2).bytes == ckpt_bytes(size, 2)
    assert "event=replicate_pruned destination=nfs job=job-a steps=1" in d.text()

    row = d.row("job-b", "nfs")
    assert row is not None and row.seconds_behind == 0 and row.uploads == 1
    assert row.uploaded_bytes == ckpt_bytes(size, 2) and row.failures == 0
    m = scrape(d)
    ok = {"destination": "nfs", "job_id": "job-a", "result": "ok"}
    assert sample(m, "adaptd_replication_uploads_total", **ok) == 2
    assert sample(m, "adaptd_replication_upload_seconds_count", destination="nfs") == 3
    assert sample(m, "adaptd_replication_last_step", destination="nfs", job_id="job-b") == 2
    a.close()
    b.close()


def test_concurrent_uploads_share_the_destinations_cap(tmp_path, daemons):
    """max_concurrent = 2: two jobs' uploads run at the same time, and together they
    stay under the destination's one 2 MiB/s cap (measured from the daemon's log)."""
    dest = tmp_path / "nfs"
    staging = tmp_path / "local"
    d = Daemon(tmp_path, config(
        tmp_path,
        f'[destinations.nfs]\nurl = "{dest}"\nbandwidth_mib_s = 2\nmax_concurrent = 2\n',
        f'[jobs."job-*"]\nstaging = "{staging}/{{job}}"\nreplicate_to = ["nfs"]\n',
    ))  # fmt: skip
    daemons.append(d.start())
    size = 3 * MIB
    peers = [Peer(d, j, staging / j) for j in ("job-a", "job-b")]
    for peer in peers:
        write_checkpoint(staging / peer.job, 1, size)
        peer.saved(1, size)
    for peer in peers:
        d.wait_row(peer.job, "nfs", lambda r: r.last_step == 1)
    events = uploads(d.text(), "nfs")
    assert [kind for kind, _, _ in events][:2] == ["start", "start"]  # they overlapped
    stamps = [_time(ln) for ln in d.text().splitlines() if "destination=nfs" in ln and
              ("event=replicate_start" in ln or "event=replicated " in ln)]  # fmt: skip
    span = max((t - stamps[0]) % 86400 for t in stamps)  # a run across midnight too
    sent = 2 * ckpt_bytes(size, 1)
    # one bucket for both: at most 2 MiB/s x (span + 0.25 s burst), 1 ms log resolution
    assert sent <= 2 * MIB * (span + 0.25 + 0.002) * 1.02, span
    assert sent / span >= 0.25 * 2 * MIB, span  # and not starved
    for peer in peers:
        assert Replica(str(dest / peer.job)).verify(1).bytes == ckpt_bytes(size, 1)
        peer.close()


def _time(line: str) -> float:
    """Seconds of the log line's timestamp (``2026-12-03 07:08:38,413 INFO ...``)."""
    clock = line.split()[1]
    h, m, rest = clock.split(":")
    sec, ms = rest.split(",")
    return int(h) * 3600 + int(m) * 60 + int(sec) + int(ms) / 1000


# ---------------------------------------------------------------------- resume after SIGKILL


def test_an_upload_stopped_by_sigterm_then_sigkill_resumes_after_each_restart(tmp_path, daemons):
    """SIGTERM mid-upload: the daemon stops at once (the upload is abandoned, not
    failed). Restarted with no job connected, it catches up from the staging directory
    and resumes; SIGKILLed mid-way through that, restarted again, it completes. Only
    what was missing is sent, and the result verifies byte for byte."""
    dest = tmp_path / "nfs"
    staging = tmp_path / "local" / "big"
    text = config(
        tmp_path,
        f'[destinations.nfs]\nurl = "{dest}"\nbandwidth_mib_s = 4\n',
        # a glob entry: after a restart the daemon finds "big" by listing local/
        f'[jobs."b*"]\nstaging = "{staging.parent}/{{job}}"\nreplicate_to = ["nfs"]\n',
    )
    size = 12 * MIB  # 3 s at the cap
    write_checkpoint(staging, 5, size)
    part = dest / "big" / ".ckpt-5.data-00000-of-00001.part"

    def wait_partial(d: Daemon, nbytes: int) -> None:
        end = time.monotonic() + DEADLINE
        while not (part.exists() and part.stat().st_size >= nbytes):  # a real partial upload
            assert time.monotonic() < end and d.proc.poll() is None, d.text()
            time.sleep(0.02)  # polling the destination's file, not waiting for time

    d = Daemon(tmp_path, text)
    daemons.append(d.start())
    peer = Peer(d, "big", staging)
    peer.saved(5, size)
    wait_partial(d, 2 * MIB)
    peer.close()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=10) == 0  # well before the upload could have finished
    assert "event=replicate_interrupted destination=nfs job=big step=5" in d.text()
    assert "event=replicate_failed" not in d.text()
    assert Replica(str(dest / "big")).latest() is None  # nothing half-published

    again = Daemon(tmp_path, text)
    daemons.append(again.start())  # no job connects: the daemon catches up by itself
    again.log.wait_for("event=replicate_catch_up destination=nfs job=big step=5")
    wait_partial(again, part.stat().st_size + 2 * MIB)
    again.proc.send_signal(signal.SIGKILL)
    again.proc.wait(10)
    assert Replica(str(dest / "big")).latest() is None
    kept = part.stat().st_size

    third = Daemon(tmp_path, text)
    daemons.append(third.start())
    f = fields(third.log.wait_for("event=replicated ", "job=big", "step=5"))
    assert int(f["bytes"]) == ckpt_bytes(size, 5)
    assert int(f["bytes_sent"]) <= ckpt_bytes(size, 5) - kept + 1 * MIB  # prefix kept
    replica = Replica(str(dest / "big"))
    assert replica.latest() == 5
    manifest = replica.verify(5)
    assert {e.name for e in manifest.files} == {"ckpt-5.index", "ckpt-5.data-00000-of-00001"}
    assert (dest / "big" / "ckpt-5.data-00000-of-00001").read_bytes() == (
        staging / "ckpt-5.data-00000-of-00001"
    ).read_bytes()

    # a fourth start finds the destination current: nothing is sent, nothing skipped
    third.stop()
    fourth = Daemon(tmp_path, text)
    daemons.append(fourth.start())
    fourth.log.wait_for("event=replicate_current destination=nfs job=big step=5")
    row = fourth.wait_row("big", "nfs", lambda r: r.last_step == 5)
    assert (row.uploads, row.skipped, row.uploaded_bytes, row.seconds_behind) == (0, 0, 0, 0)


# ---------------------------------------------------------------------- failures, skips


def test_failures_are_retried_and_shown_deleted_checkpoints_skipped(tmp_path, daemons):
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the destination's folder should be")
    staging = tmp_path / "local" / "j"
    d = Daemon(tmp_path, config(
        tmp_path,
        f'[destinations.nfs]\nurl = "{blocker}/dest"\n',
        f'[jobs."j"]\nstaging = "{staging}"\nreplicate_to = ["nfs"]\n',
    ))  # fmt: skip
    daemons.append(d.start())
    write_checkpoint(staging, 1, 1000)
    peer = Peer(d, "j", staging)
    peer.saved(1, 1000)
    d.log.wait_for("event=replicate_failed", "job=j", "step=1", "attempt=1")
    row = d.wait_row("j", "nfs", lambda r: r.failures >= 1)
    assert row.last_error and "blocked" in row.last_error
    assert row.pending_step == 1 and row.next_retry_s is not None
    assert d.proc.poll() is None  # the daemon carries on

    cli = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "status", "--socket", str(d.socket)],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert "REPLICATION" in cli.stdout and "j -> nfs: last error, retry in" in cli.stdout

    blocker.unlink()  # the destination comes back: the retry succeeds
    d.wait_row("j", "nfs", lambda r: r.last_step == 1 and r.last_error == "")
    assert Replica(f"{blocker}/dest/j").verify(1).step == 1

    # a checkpoint TF's max_to_keep deleted before its upload is skipped, not an error
    write_checkpoint(staging, 2, 1000)
    for f in staging.glob("ckpt-2.*"):
        f.unlink()
    peer.saved(2, 1000)
    d.log.wait_for("event=replicate_skipped", "job=j", "step=2", "deleted locally")
    row = d.wait_row("j", "nfs", lambda r: r.skipped == 1)
    assert row.last_step == 1 and row.seconds_behind == 0
    peer.close()


def test_a_job_saving_outside_its_staging_directory_is_skipped_for_that_reason(tmp_path, daemons):
    """It was skipped as "deleted locally before it was uploaded (max_to_keep)", which
    is not what happened."""
    staging, elsewhere = tmp_path / "local" / "k", tmp_path / "elsewhere" / "k"
    d = Daemon(tmp_path, config(
        tmp_path,
        f'[destinations.nfs]\nurl = "{tmp_path / "dest"}"\n',
        f'[jobs."k"]\nstaging = "{staging}"\nreplicate_to = ["nfs"]\n',
    ))  # fmt: skip
    daemons.append(d.start())
    write_checkpoint(elsewhere, 1, 1000)
    peer = Peer(d, "k", elsewhere)  # its hello names where it really saves
    d.log.wait_for("event=replicate_staging_mismatch", "job=k")
    peer.saved(1, 1000)
    line = d.log.wait_for("event=replicate_skipped", "job=k", "step=1")
    assert f"the job saves to {elsewhere}" in line and "max_to_keep" not in line, line
    assert d.wait_row("k", "nfs", lambda r: r.skipped == 1).last_step is None
    peer.close()


# ---------------------------------------------------------------------- yielding


def test_an_upload_yields_while_a_job_saves_on_the_same_disk(tmp_path, daemons):
    """While the job's next save is in flight (its step reports say so, the daemon
    emits SaveInFlight), the upload reading from the same disk pauses; it goes on
    when the save is done, and the checkpoint still verifies."""
    dest = tmp_path / "nfs"
    staging = tmp_path / "local" / "j"
    d = Daemon(tmp_path, config(
        tmp_path,
        f'[destinations.nfs]\nurl = "{dest}"\nbandwidth_mib_s = 2\n',
        f'[jobs."j"]\nstaging = "{staging}"\nreplicate_to = ["nfs"]\n',
    ))  # fmt: skip
    daemons.append(d.start())
    size = 6 * MIB
    write_checkpoint(staging, 1, size)
    peer = Peer(d, "j", staging)
    peer.saved(1, size)
    d.wait_row("j", "nfs", lambda r: r.uploading_step == 1 and r.uploaded_bytes > 0)
    peer.send(p.Steps(v=p.VERSION, job="j", rank=0, step=2, count=1, mean_s=0.1,
                      save_in_flight=True))  # fmt: skip
    row = d.wait_row("j", "nfs", lambda r: r.yielding)
    assert row.yields == 1 and row.uploading_step == 1
    assert "event=replicate_yield destination=nfs step=1" in d.log.wait_for("replicate_yield")
    held = row.uploaded_bytes
    peer.send(p.Steps(v=p.VERSION, job="j", rank=0, step=3, count=1, mean_s=0.1))
    f = fields(d.log.wait_for("event=replicated ", "job=j", "step=1"))
    assert float(f["yielded_s"]) > 0 and held < ckpt_bytes(size, 1)
    assert Replica(str(dest / "j")).verify(1).bytes == ckpt_bytes(size, 1)
    peer.close()


# ---------------------------------------------------------------------- a real TF job


@pytest.mark.slow
@pytest.mark.tf
def test_real_training_job_replicated_to_a_directory_and_s3(tmp_path, daemons, s3):
    pytest.importorskip("tensorflow")
    dest = tmp_path / "nfs"
    staging = tmp_path / "local"
    options = ", ".join(
        f"{k} = {json.dumps(v)}" for k, v in s3.options.items() if k != "client_kwargs"
    )
    d = Daemon(tmp_path, config(
        tmp_path,
        f'[destinations.nfs]\nurl = "{dest}"\n'
        f'[destinations.s3]\nurl = "{s3.url("ckpts")}"\nkeep_last = 5\n'
        f'storage_options = {{ {options}, client_kwargs = {{ region_name = "us-east-1" }} }}\n',
        f'[jobs."train-*"]\nstaging = "{staging}/{{job}}"\nreplicate_to = ["nfs", "s3"]\n',
    ))  # fmt: skip
    daemons.append(d.start())
    job = "train-tiers"
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("ADAPTD_RESTORE_FROM", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(staging / job), str(tmp_path / "out.bin"),
         "--steps", "30", "--policy", "fixed:steps=10", "--socket", f"ipc://{d.socket}",
         "--job", job],
        capture_output=True, text=True, timeout=240, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = [int(m) for m in re.findall(r"^saved (\d+) ok=True$", proc.stdout, re.M)]
    assert saved[:2] == [10, 20], proc.stdout  # 30's report goes out as the job closes
    assert (staging / job / "ckpt-30.index").exists()

    for name, url, opts in (("nfs", str(dest / job), None),
                            ("s3", s3.url("ckpts", job), s3.options)):  # fmt: skip
        row = d.wait_row(job, name, lambda r: r.last_step == 30 and r.pending_uploads == 0)
        assert row.failures == 0 and row.seconds_behind == 0
        replica = Replica(url, storage_options=opts)
        assert replica.latest() == 30
        replicated = replica.steps()
        assert 30 in replicated
        for step in replicated:
            m = replica.verify(step)
            local = {f.name: f.size for f in m.files}
            assert local == {n: (staging / job / n).stat().st_size for n in local}
        done = [s for kind, j, s in uploads(d.text(), name) if kind == "done" and j == job]
        assert done == sorted(done) and done[-1] == 30  # LATEST followed each upload
        assert set(replicated) <= {10, 20, 30}  # a step queued behind a newer one is skipped
