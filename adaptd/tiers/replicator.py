"""The daemon's Replicator: copies each job's finished checkpoints from its local
staging directory to its durable destinations, in the background, staggered.

``adaptd serve`` owns one :class:`Replicator`, built from the config's
``[destinations.NAME]`` sections and each job's ``staging`` / ``replicate_to``
(:meth:`adaptd.config.loader.Config.replication_for`). It is an event sink of the daemon
(:mod:`adaptd.events`):

- a :class:`~adaptd.events.SaveReported` that is ``ok`` queues ``(job, step)`` for
  each of the job's destinations, unless the save went to the job's local tier only
  (two tiers, ``tier="local"``: only the durable saves are replicated). The hook
  reports only after TensorFlow finalised the write, and the files are read from the
  job's *configured* staging directory, never from a path in a message;
- a :class:`~adaptd.events.JobRegistered` (and the daemon's start) *catches up*: the
  staging directory's newest checkpoint (TF's ``checkpoint`` state file) is queued,
  and uploaded unless the destination's ``LATEST`` already has it;
- :class:`~adaptd.events.SaveInFlight` tells which jobs are writing right now: an
  upload whose staging directory is on the same device as a writing job's yields
  (``Replica.upload(should_yield=...)``) so the job's own save gets the disk.

The sink does no I/O: events go to an *intake* thread (local file sizes, catch-up),
which feeds one :class:`~adaptd.tiers.destination.DestinationQueue` per destination;
everything that touches a destination happens in that destination's workers, so a
slow one holds up nobody else. Each destination runs ``max_concurrent`` worker
threads sharing one :class:`~adaptd.tiers.throttle.Throttle` (its bandwidth cap).
Which upload runs next is the pure :func:`~adaptd.tiers.destination.next_upload`:
the job that has waited longest goes first, ties to the job that started an upload
least recently, so jobs sharing a destination take turns. A job has at most one
pending upload per destination: a newer checkpoint replaces the older pending one (it
would be superseded anyway).

After each upload the destination's retention runs (``Replica.prune``). A failure is
logged, counted, shown in ``adaptd status`` and retried with exponential backoff
(:func:`~adaptd.tiers.destination.retry_delay`); a checkpoint that TF's
``max_to_keep`` deleted before it was uploaded is skipped with a log line.

Orbax checkpoints are not replicated: a destination's layout is TensorFlow's files
(:mod:`adaptd.tiers.layout`), and an Orbax step is a directory tree. A job whose staging
directory holds Orbax steps (:func:`adaptd.checkpoints.orbax.holds_orbax`) has nothing
queued, finalized step or not, and the daemon says so once per job
(``replicate_unsupported``) instead of reporting its files missing.
:meth:`Replicator.stop` interrupts uploads at the next chunk; ``Replica.upload``
resumes them at the next start (files already complete at the destination are not
sent again). Nothing here raises into the daemon's loop, and nothing imports
TensorFlow.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adaptd import events as ev
from adaptd.checkpoints import rank_parts
from adaptd.checkpoints.files import STATE_FILE
from adaptd.checkpoints.files import state_file_step as parse_state_file
from adaptd.checkpoints.orbax import holds_orbax
from adaptd.config.loader import JOB_PLACEHOLDER, Config
from adaptd.logfmt import logfmt
from adaptd.protocol.admin import ReplicationInfo
from adaptd.tiers.destination import DestinationQueue, SlotGate, UploadInterrupted, resolved
from adaptd.tiers.replica import UploadResult
from adaptd.tiers.schedule import Pending, merge, next_upload, retry_delay

__all__ = [
    "STOP_TIMEOUT_S",
    "DestinationQueue",
    "Pending",
    "Replicator",
    "UploadInterrupted",
    "jobs_in_staging",
    "merge",
    "newest_local_step",
    "next_upload",
    "parse_state_file",
    "retry_delay",
]

log = logging.getLogger("adaptd.replicator")

#: How long stop() waits for workers to leave an upload.
STOP_TIMEOUT_S = 10.0


def newest_local_step(staging: Path) -> int | None:
    """The newest finished checkpoint in ``staging``: the one TF's ``checkpoint`` state
    file names (TF writes that file only after the checkpoint's files are complete),
    provided its index is there; in a multi-worker job's directory, the newest step
    up to that one that is complete for the job (every rank's part there too)."""
    try:
        step = parse_state_file((staging / STATE_FILE).read_text(errors="replace"))
    except OSError:
        return None
    if step is None or not (staging / f"ckpt-{step}.index").exists():
        return None
    names = rank_parts.listing(staging)
    for s in rank_parts.steps(names):
        if s <= step and rank_parts.status(names, s).complete:
            return s
    return step  # not whole: the upload says why


def jobs_in_staging(template: str, pattern: str) -> list[str]:
    """Job ids whose staging directories exist under a ``{job}`` ``template`` and match
    the glob ``pattern``: how the daemon finds, at start, jobs it only knows by glob."""
    parts = Path(template).parts
    at = next((i for i, part in enumerate(parts) if JOB_PLACEHOLDER in part), None)
    if at is None:
        return []
    parent = Path(*parts[:at])
    before, _, after = parts[at].partition(JOB_PLACEHOLDER)
    component = re.compile(re.escape(before) + "(.+)" + re.escape(after))
    out = []
    with contextlib.suppress(OSError), os.scandir(parent) as it:
        for entry in it:
            m = component.fullmatch(entry.name)
            if m and fnmatch.fnmatchcase(m.group(1), pattern) and entry.is_dir():
                out.append(m.group(1))
    return sorted(out)


# ---------------------------------------------------------------------- the replicator


class Replicator:
    """Every destination's queue and workers, fed by the daemon's events.

    :meth:`on_event` is the daemon sink (no I/O, never raises); :meth:`start` launches
    the intake and worker threads and catches up the jobs the config names;
    :meth:`stop` ends them. :meth:`status` is what ``adaptd status`` and the metrics
    show.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        on_upload: Callable[[str, str, UploadResult], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        slot_gate: SlotGate | None = None,
    ) -> None:
        """``slot_gate``: held around each upload (a fleet write slot, docs/fleet.md)."""
        self.cfg = cfg
        self.clock = clock
        self.wall = wall
        self.queues = {
            name: DestinationQueue(d, should_yield=self._busy_disk, on_upload=on_upload,
                                   clock=clock, wall=wall, slot_gate=slot_gate)
            for name, d in cfg.destinations.items()
        }  # fmt: skip
        self._intake: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        #: jobs with a save in flight (replaced whole, so workers read it without a lock)
        self._writing: frozenset[str] = frozenset()
        #: device of each job's save directory (written by the intake thread)
        self._devices: dict[str, int] = {}
        self._saves_to: dict[str, Path] = {}  # job -> the directory its hello named
        self._caught_up: set[tuple[str, int]] = set()
        self._orbax_told: set[str] = set()  # jobs told their Orbax steps are not copied
        self.errors = 0

    # -- the daemon's sink

    def on_event(self, event: ev.Event) -> None:
        """An :data:`adaptd.events.Sink`: queue work for the intake thread (no I/O here)."""
        if isinstance(event, ev.SaveInFlight):
            w = set(self._writing)
            (w.add if event.writing else w.discard)(event.job)
            self._writing = frozenset(w)
        elif isinstance(event, ev.JobLost | ev.JobFinished):
            self._writing = self._writing - {event.job}
        elif (
            (isinstance(event, ev.SaveReported) and event.report.ok and not event.report.tier)
            or isinstance(event, ev.JobRegistered)
        ) and self.cfg.replication_for(event.job) is not None:
            self._intake.put(event)

    # -- lifecycle

    def start(self) -> None:
        """Start the threads; catch up every job the config names (exact ids, and the
        ids found under a glob pattern's staging template)."""
        if self._thread is not None:
            return
        for q in self.queues.values():
            q.start()
        self._thread = threading.Thread(target=self._intake_loop, name="replicate-intake",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        for job in self.configured_jobs():
            self._intake.put(("catch_up", job))

    def configured_jobs(self) -> list[str]:
        """Job ids the config replicates that can be named without the job connecting."""
        out: list[str] = []
        for o in self.cfg.jobs:
            if not o.replicate_to or o.staging is None:
                continue
            if any(c in o.pattern for c in "*?["):
                out += jobs_in_staging(o.staging, o.pattern)
            else:
                out.append(o.pattern)
        seen: set[str] = set()
        return [j for j in out if not (j in seen or seen.add(j))]  # type: ignore[func-returns-value]

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop everything; uploads in progress end at their next chunk. True if all
        threads ended within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for q in self.queues.values():
            q.stop()
        self._intake.put(None)
        ok = all([q.join(deadline) for q in self.queues.values()])
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
            ok = ok and not self._thread.is_alive()
        return ok

    # -- intake

    def _intake_loop(self) -> None:
        while True:
            item = self._intake.get()
            if item is None:
                return
            try:
                if isinstance(item, ev.SaveReported):
                    self._saved(item.job, item.report.step, item.wall)
                elif isinstance(item, ev.JobRegistered):
                    self._registered(item)
                else:
                    self._catch_up(item[1])
            except Exception:
                self.errors += 1
                log.exception(logfmt("replicate_intake_error", item=repr(item)))

    def _saved(self, job: str, step: int, wall: float) -> None:
        found = self.cfg.replication_for(job)
        if found is None:
            return
        staging, dests = found
        if self._orbax(job, staging):
            return
        nbytes = rank_parts.step_bytes(staging, step)
        if nbytes == 0:
            log.warning(
                logfmt(
                    "replicate_missing",
                    job=job,
                    step=step,
                    staging=staging,
                    why="the job reported the save, but its files are not in the configured "
                    f"staging directory: does the job save to jobs.{job}.staging?",
                )
            )
        for d in dests:
            self.queues[d.name].add(
                job, staging, step, saved=wall, nbytes=nbytes, saves_to=self._saves_to.get(job)
            )

    def _registered(self, event: ev.JobRegistered) -> None:
        found = self.cfg.replication_for(event.job)
        if found is None:
            return
        staging = found[0]
        saves_to = Path(event.checkpoint_dir) if event.checkpoint_dir else None
        if saves_to is not None and saves_to.is_absolute():
            with contextlib.suppress(OSError):
                self._devices[event.job] = os.stat(saves_to).st_dev
            self._saves_to[event.job] = saves_to
            if resolved(saves_to) != resolved(staging):
                log.warning(
                    logfmt(
                        "replicate_staging_mismatch",
                        job=event.job,
                        saves_to=saves_to,
                        staging=staging,
                        why="nothing it saves will be replicated until "
                        'jobs."PATTERN".staging names its checkpoint directory',
                    )
                )
        key = (event.job, event.incarnation)
        if key not in self._caught_up:
            self._caught_up.add(key)
            self._catch_up(event.job)

    def _catch_up(self, job: str) -> None:
        found = self.cfg.replication_for(job)
        if found is None:
            return
        staging, dests = found
        with contextlib.suppress(OSError):
            self._devices.setdefault(job, os.stat(staging).st_dev)
        local = newest_local_step(staging)
        if local is None and self._orbax(job, staging):
            return
        saved = None
        if local is not None:
            with contextlib.suppress(OSError):
                saved = (staging / f"ckpt-{local}.index").stat().st_mtime
        for d in dests:
            q = self.queues[d.name]
            q.track(job, staging)
            if local is None or saved is None:
                continue
            # queued without reading the destination here (that could be slow, and would
            # hold up the intake): the worker compares with its LATEST before uploading
            log.info(
                logfmt(
                    "replicate_catch_up",
                    destination=d.name,
                    job=job,
                    step=local,
                    why="uploaded unless the destination has it",
                )
            )
            nbytes = rank_parts.step_bytes(staging, local)
            q.add(job, staging, local, saved=saved, nbytes=nbytes)

    def _orbax(self, job: str, staging: Path) -> bool:
        """Whether ``staging`` holds Orbax steps, which are not replicated (said once
        per job)."""
        if not holds_orbax(staging):
            return False
        if job not in self._orbax_told:
            self._orbax_told.add(job)
            log.warning(
                logfmt(
                    "replicate_unsupported",
                    job=job,
                    staging=staging,
                    why="it holds Orbax checkpoints: adaptd replicates TensorFlow "
                    "checkpoints only; nothing of this job is copied (docs/orbax.md)",
                )
            )
        return True

    # -- yielding

    def _busy_disk(self, staging: Path) -> bool:
        """True while a job whose save directory is on the same device as ``staging`` has
        a save in flight: that job's write has the disk first."""
        writing = self._writing
        if not writing:
            return False
        try:
            dev = os.stat(staging).st_dev
        except OSError:
            return False
        return any(self._devices.get(j) == dev for j in writing)

    # -- views

    def status(self) -> list[ReplicationInfo]:
        """One row per (destination, job) the replicator knows, by destination then job."""
        out: list[ReplicationInfo] = []
        for name in sorted(self.queues):
            out += self.queues[name].status()
        return out

    def throughput(self) -> dict[str, float]:
        """Bytes per second sent to each destination lately."""
        return {name: q.throughput() for name, q in self.queues.items()}
