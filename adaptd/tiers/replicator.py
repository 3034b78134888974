"""The daemon's Replicator: copies each job's finished checkpoints from its local
staging directory to its durable destinations, in the background, staggered.

``adaptd serve`` owns one :class:`Replicator`, built from the config's
``[destinations.NAME]`` sections and each job's ``staging`` / ``replicate_to``
(:meth:`adaptd.config.Config.replication_for`). It is an event sink of the daemon
(:mod:`adaptd.events`):

- a :class:`~adaptd.events.SaveReported` that is ``ok`` queues ``(job, step)`` for
  each of the job's destinations. The hook reports only after TensorFlow finalised
  the write, and the files are read from the job's *configured* staging directory,
  never from a path in a message;
- a :class:`~adaptd.events.JobRegistered` (and the daemon's start) *catches up*: the
  staging directory's newest checkpoint (TF's ``checkpoint`` state file) is queued,
  and uploaded unless the destination's ``LATEST`` already has it;
- :class:`~adaptd.events.SaveInFlight` tells which jobs are writing right now: an
  upload whose staging directory is on the same device as a writing job's yields
  (``Replica.upload(should_yield=...)``) so the job's own save gets the disk.

With a fleet (``[fleet]``, docs/fleet.md) each upload to a destination several hosts
share first takes a fleet write slot (``slot_gate``, from
:meth:`adaptd.fleet.link.FleetLink.upload_slot`) and gives it back when it ends.

The sink does no I/O: events go to an *intake* thread (local file sizes, catch-up),
which feeds one :class:`DestinationQueue` per destination; everything that touches
a destination happens in that destination's workers, so a slow one holds up nobody
else. Each destination runs ``max_concurrent`` worker threads sharing one
:class:`~adaptd.tiers.replica.Throttle` (its bandwidth cap). Which upload runs next
is the pure :func:`next_upload`: the job that has waited longest goes first, ties
to the job that started an upload least recently, so jobs sharing a destination
take turns. A job has at most one pending upload per destination: a newer
checkpoint replaces the older pending one (it would be superseded anyway).

After each upload the destination's retention runs (``Replica.prune``). A failure is
logged, counted, shown in ``adaptd status`` and retried with exponential backoff
(:func:`retry_delay`); a checkpoint that TF's ``max_to_keep`` deleted before it was
uploaded is skipped with a log line. :meth:`Replicator.stop` interrupts uploads at
the next chunk; ``Replica.upload`` resumes them at the next start (files already
complete at the destination are not sent again). Nothing here raises into the
daemon's loop, and nothing imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import math
import os
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from adaptd import events as ev
from adaptd.admin import ReplicationInfo
from adaptd.config import JOB_PLACEHOLDER, Config, Destination
from adaptd.tiers.replica import Replica, Throttle, UploadResult

log = logging.getLogger("adaptd.replicator")

#: First retry after a failed upload waits this long; each further failure doubles it ...
RETRY_FIRST_S = 2.0
#: ... up to this.
RETRY_MAX_S = 300.0
#: Throughput is the bytes sent over this window.
THROUGHPUT_WINDOW_S = 5.0
#: Throttle.take is asked for at most this much at a time, so a stop is prompt.
TAKE_PIECE = 256 * 1024
#: How long stop() waits for workers to leave an upload.
STOP_TIMEOUT_S = 10.0

#: ``slot_gate(destination, job, stopping)``: a context manager held around one upload
#: (a fleet write slot on a shared destination; ``stopping()`` ends a wait for one).
SlotGate = Callable[[Destination, str, Callable[[], bool]], contextlib.AbstractContextManager[Any]]

_STATE_LINE = re.compile(r'^model_checkpoint_path:\s*"(?:.*/)?ckpt-(\d+)"\s*$', re.M)
_FILE = re.compile(r"^ckpt-(\d+)\.(?:index|data-\d{5}-of-\d{5})$")


class UploadInterrupted(Exception):
    """The replicator is stopping: the upload was abandoned (it resumes at the next start)."""


# ---------------------------------------------------------------------- pure scheduling


@dataclass(frozen=True)
class Pending:
    """One job's next upload to one destination.

    ``waiting_since`` is the wall time of the oldest save of the job still waiting for
    this destination (kept when a newer step replaces an older pending one), the key
    that orders jobs. ``not_before`` (monotonic) delays a retry; ``attempts`` counts
    failures of this step.
    """

    job: str
    step: int
    saved: float  # wall time the local checkpoint was saved
    waiting_since: float
    nbytes: int = 0
    not_before: float = 0.0
    attempts: int = 0


def next_upload(
    pending: Mapping[str, Pending],
    uploading: Collection[str],
    last_started: Mapping[str, float],
    now: float,
) -> Pending | None:
    """The upload to start now, or ``None``: among jobs not uploading to this destination
    already and not waiting out a retry delay, the one waiting longest; ties go to the job
    whose last upload started longest ago (round-robin), then by id."""
    ready = [p for p in pending.values() if p.job not in uploading and p.not_before <= now]
    if not ready:
        return None
    return min(ready, key=lambda p: (p.waiting_since, last_started.get(p.job, -math.inf), p.job))


def merge(old: Pending | None, new: Pending) -> Pending:
    """A newly saved checkpoint ``new`` joining the job's pending ``old``: the newer
    step wins (a retry delay and failures belong to the old step and are dropped), and
    the job keeps its place in line."""
    if old is None:
        return new
    if new.step <= old.step:
        return old
    return replace(new, waiting_since=min(old.waiting_since, new.waiting_since))


def retry_delay(attempts: int) -> float:
    """Seconds before retry number ``attempts`` (1, 2, ...): 2 s doubling up to 5 min."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, attempts - 1))


def parse_state_file(text: str) -> int | None:
    """The step TF's ``checkpoint`` state file names as latest (``ckpt-N``), or ``None``."""
    m = _STATE_LINE.search(text)
    return int(m.group(1)) if m else None


def newest_local_step(staging: Path) -> int | None:
    """The newest finished checkpoint in ``staging``: the one TF's ``checkpoint`` state
    file names (TF writes that file only after the checkpoint's files are complete),
    provided its index is there."""
    try:
        step = parse_state_file((staging / "checkpoint").read_text(errors="replace"))
    except OSError:
        return None
    if step is None or not (staging / f"ckpt-{step}.index").exists():
        return None
    return step


def checkpoint_bytes(staging: Path, step: int) -> int:
    """Total size of ``staging/ckpt-<step>.*`` (index and data shards); 0 if gone."""
    total = 0
    prefix = f"ckpt-{step}."
    with contextlib.suppress(OSError), os.scandir(staging) as it:
        for entry in it:
            m = _FILE.match(entry.name)
            if m and entry.name.startswith(prefix):
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
    return total


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


# ---------------------------------------------------------------------- per destination


@dataclass
class _Upload:
    step: int
    started: float  # monotonic
    nbytes: int
    sent: int = 0
    yielding: bool = False


@dataclass
class _JobState:
    """What one destination knows about one job (guarded by the queue's lock)."""

    url: str
    staging: Path
    last_step: int | None = None
    pending: Pending | None = None
    upload: _Upload | None = None
    waiting: dict[int, float] = field(default_factory=dict)  # unreplicated step -> saved
    last_started: float = -math.inf
    uploaded_bytes: int = 0
    uploads: int = 0
    failures: int = 0
    skipped: int = 0
    yields: int = 0
    last_error: str = ""
    last_error_at: float | None = None
    last_rate: float | None = None


class DestinationQueue:
    """One destination: its pending uploads, its workers and its shared throttle."""

    def __init__(
        self,
        dest: Destination,
        *,
        should_yield: Callable[[Path], bool],
        on_upload: Callable[[str, str, UploadResult], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        slot_gate: SlotGate | None = None,
    ) -> None:
        self.dest = dest
        self._slot_gate = slot_gate
        self.throttle = Throttle(dest.bandwidth_bytes_s)
        self._should_yield = should_yield
        self._on_upload = on_upload
        self.clock = clock
        self.wall = wall
        self._cond = threading.Condition()
        self._jobs: dict[str, _JobState] = {}
        self._sent: deque[tuple[float, int]] = deque()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- feeding (intake thread)

    def track(self, job: str, staging: Path, *, last_step: int | None = None) -> None:
        """Know ``job`` (for status) with what its destination holds, if read."""
        with self._cond:
            st = self._state(job, staging)
            if last_step is not None and (st.last_step is None or last_step > st.last_step):
                st.last_step = last_step
                st.waiting = {s: t for s, t in st.waiting.items() if s > last_step}

    def add(self, job: str, staging: Path, step: int, *, saved: float, nbytes: int) -> None:
        """Queue ``job``'s checkpoint ``step`` (replacing an older pending one)."""
        with self._cond:
            st = self._state(job, staging)
            if st.last_step is not None and step <= st.last_step:
                return
            if st.upload is not None and st.upload.step >= step:
                return
            st.waiting[step] = saved
            if len(st.waiting) > 1000:  # a destination down for days: keep the oldest
                st.waiting.pop(max(st.waiting))
            # the job's place in line: its oldest save the running upload does not cover
            running = st.upload.step if st.upload is not None else -1
            since = min((t for s, t in st.waiting.items() if s > running), default=saved)
            new = Pending(job, step, saved=saved, waiting_since=since, nbytes=nbytes)
            st.pending = merge(st.pending, new)
            self._cond.notify()

    def _state(self, job: str, staging: Path) -> _JobState:
        st = self._jobs.get(job)
        if st is None:
            st = self._jobs[job] = _JobState(url=self.dest.job_url(job), staging=staging)
        st.staging = staging
        return st

    # -- workers

    def start(self) -> None:
        for i in range(self.dest.max_concurrent):
            t = threading.Thread(
                target=self._work, name=f"replicate-{self.dest.name}-{i}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Ask the workers to stop (uploads in progress end at their next chunk)."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()

    def join(self, deadline: float) -> bool:
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _take(self) -> tuple[Pending, _JobState] | None:
        """Wait for the next upload this worker should run; ``None`` when stopping."""
        with self._cond:
            while not self._stopping.is_set():
                now = self.clock()
                pending = {j: st.pending for j, st in self._jobs.items() if st.pending is not None}
                busy = [j for j, st in self._jobs.items() if st.upload is not None]
                started = {j: st.last_started for j, st in self._jobs.items()}
                choice = next_upload(pending, busy, started, now)
                if choice is not None:
                    st = self._jobs[choice.job]
                    st.pending = None
                    st.upload = _Upload(choice.step, now, choice.nbytes)
                    st.last_started = now
                    return choice, st
                later = [p.not_before for p in pending.values() if p.not_before > now]
                self._cond.wait(min(later) - now if later else None)
        return None

    def _work(self) -> None:
        while True:
            got = self._take()
            if got is None:
                return
            item, st = got
            try:
                self._run(item, st)
            except Exception:  # never let a bug end the worker
                log.exception(
                    "event=replicate_bug destination=%s job=%s step=%d",
                    self.dest.name, item.job, item.step,
                )  # fmt: skip
                self._failed(item, st, "internal error (see the daemon's log)")
            finally:
                with self._cond:
                    st.upload = None
                    self._cond.notify_all()

    def _run(self, item: Pending, st: _JobState) -> None:
        name, job, step = self.dest.name, item.job, item.step
        index = st.staging / f"ckpt-{step}.index"
        if not index.exists():
            self._skipped(item, st, "deleted locally before it was uploaded (max_to_keep)")
            return
        try:
            replica = Replica(st.url, storage_options=self.dest.storage_options)
            remote = replica.latest()
            if remote is not None:
                self.track(job, st.staging, last_step=remote)
            if remote == step:  # there already (a catch-up after a restart, usually)
                log.info("event=replicate_current destination=%s job=%s step=%d", name, job, step)
                return
            if remote is not None and remote > step:
                self._skipped(item, st, f"the destination's LATEST is already step {remote}")
                return
            log.info(
                "event=replicate_start destination=%s job=%s step=%d bytes=%d url=%s",
                name, job, step, item.nbytes, st.url,
            )  # fmt: skip
            gate = (
                self._slot_gate(self.dest, job, self._stopping.is_set)
                if self._slot_gate is not None
                else contextlib.nullcontext()
            )
            with gate:
                if self._stopping.is_set():
                    raise UploadInterrupted
                result = replica.upload(
                    st.staging,
                    step,
                    job,
                    throttle=_Gate(self.throttle, self._stopping),  # type: ignore[arg-type]
                    should_yield=lambda: self._yield(st),
                    progress=lambda n: self._progress(st, n),
                )
        except UploadInterrupted:
            self._interrupted(item, st)
            return
        except FileNotFoundError as exc:
            if self._stopping.is_set():
                self._interrupted(item, st)
            elif not index.exists():
                self._skipped(item, st, "deleted locally during the upload (max_to_keep)")
            else:
                self._failed(item, st, f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # TierError, OSError, botocore's...: retried
            if self._stopping.is_set():
                self._interrupted(item, st)
            else:
                self._failed(item, st, f"{type(exc).__name__}: {exc}")
            return
        with self._cond:
            st.uploads += 1
            st.last_step = max(step, st.last_step or step)
            st.waiting = {s: t for s, t in st.waiting.items() if s > step}
            st.last_rate = result.bytes_sent / result.seconds if result.seconds > 0 else None
            st.last_error = ""
        log.info(
            "event=replicated destination=%s job=%s step=%d bytes_sent=%d bytes=%d files=%d "
            "resumed_files=%d seconds=%.3f yielded_s=%.3f",
            name, job, step, result.bytes_sent, result.bytes_total, result.files,
            result.resumed_files, result.seconds, result.yielded_s,
        )  # fmt: skip
        if self._on_upload is not None:
            try:
                self._on_upload(name, job, result)
            except Exception:  # the upload itself succeeded; only the callback failed
                log.exception("event=replicate_callback_failed destination=%s job=%s", name, job)
        self._prune(replica, job)

    def _prune(self, replica: Replica, job: str) -> None:
        d = self.dest
        keep_every = d.keep_every_hours * 3600.0 if d.keep_every_hours else None
        try:
            deleted = replica.prune(keep_last=d.keep_last, keep_every_s=keep_every, now=self.wall())
        except Exception as exc:
            log.warning(
                "event=replicate_prune_failed destination=%s job=%s error=%r",
                d.name, job, f"{type(exc).__name__}: {exc}",
            )  # fmt: skip
            return
        if deleted:
            log.info(
                "event=replicate_pruned destination=%s job=%s steps=%s keep_last=%d",
                d.name, job, ",".join(map(str, deleted)), d.keep_last,
            )  # fmt: skip

    def _yield(self, st: _JobState) -> bool:
        if self._stopping.is_set():
            raise UploadInterrupted
        yielding = self._should_yield(st.staging)
        upload = st.upload
        if upload is not None and yielding != upload.yielding:
            upload.yielding = yielding
            if yielding:
                with self._cond:
                    st.yields += 1
                log.info(
                    "event=replicate_yield destination=%s step=%d staging=%s "
                    "(a job is saving on the same disk)",
                    self.dest.name, upload.step, st.staging,
                )  # fmt: skip
        return yielding

    def _progress(self, st: _JobState, n: int) -> None:
        now = self.clock()
        with self._cond:
            st.uploaded_bytes += n
            if st.upload is not None:
                st.upload.sent += n
            self._sent.append((now, n))
            while self._sent and self._sent[0][0] < now - THROUGHPUT_WINDOW_S:
                self._sent.popleft()

    def _skipped(self, item: Pending, st: _JobState, why: str) -> None:
        log.info(
            "event=replicate_skipped destination=%s job=%s step=%d reason=%r",
            self.dest.name, item.job, item.step, why,
        )  # fmt: skip
        with self._cond:
            st.skipped += 1
            st.waiting = {s: t for s, t in st.waiting.items() if s > item.step}

    def _interrupted(self, item: Pending, st: _JobState) -> None:
        log.info(
            "event=replicate_interrupted destination=%s job=%s step=%d "
            "(stopping; the upload resumes at the next start)",
            self.dest.name, item.job, item.step,
        )  # fmt: skip

    def _failed(self, item: Pending, st: _JobState, error: str) -> None:
        attempts = item.attempts + 1
        delay = retry_delay(attempts)
        log.warning(
            "event=replicate_failed destination=%s job=%s step=%d attempt=%d retry_in_s=%g "
            "error=%r",
            self.dest.name, item.job, item.step, attempts, delay, error,
        )  # fmt: skip
        with self._cond:
            st.failures += 1
            st.last_error = error
            st.last_error_at = self.wall()
            retry = replace(item, attempts=attempts, not_before=self.clock() + delay)
            # a newer checkpoint queued meanwhile wins; otherwise this step is retried
            st.pending = retry if st.pending is None else merge(retry, st.pending)

    # -- status

    def throughput(self) -> float:
        """Bytes per second sent to this destination over the last few seconds."""
        now = self.clock()
        with self._cond:
            recent = sum(n for t, n in self._sent if t >= now - THROUGHPUT_WINDOW_S)
        return recent / THROUGHPUT_WINDOW_S

    def status(self) -> list[ReplicationInfo]:
        now, wall = self.clock(), self.wall()
        out = []
        with self._cond:
            for job, st in sorted(self._jobs.items()):
                up, p = st.upload, st.pending
                behind = wall - min(st.waiting.values()) if st.waiting else 0.0
                rate = None
                if up is not None and now > up.started:
                    rate = up.sent / (now - up.started)
                out.append(
                    ReplicationInfo(
                        destination=self.dest.name,
                        job=job,
                        url=st.url,
                        last_step=st.last_step,
                        uploading_step=up.step if up is not None else None,
                        pending_step=p.step if p is not None else None,
                        pending_uploads=(up is not None) + (p is not None),
                        pending_bytes=(max(0, up.nbytes - up.sent) if up else 0)
                        + (p.nbytes if p else 0),
                        seconds_behind=max(0.0, behind),
                        throughput_bytes_s=rate,
                        last_throughput_bytes_s=st.last_rate,
                        uploaded_bytes=st.uploaded_bytes,
                        uploads=st.uploads,
                        failures=st.failures,
                        skipped=st.skipped,
                        yields=st.yields,
                        yielding=bool(up and up.yielding),
                        last_error=st.last_error,
                        last_error_age_s=None
                        if st.last_error_at is None or not st.last_error
                        else max(0.0, wall - st.last_error_at),
                        next_retry_s=max(0.0, p.not_before - now)
                        if p is not None and p.attempts
                        else None,
                    )
                )
        return out


class _Gate:
    """The throttle handed to ``Replica.upload``: takes tokens in small pieces from the
    destination's shared :class:`Throttle`, and ends the upload when stopping."""

    def __init__(self, throttle: Throttle, stopping: threading.Event) -> None:
        self.throttle = throttle
        self.stopping = stopping

    def take(self, n: int) -> None:
        while True:
            if self.stopping.is_set():
                raise UploadInterrupted
            piece = min(n, TAKE_PIECE)
            self.throttle.take(piece)
            n -= piece
            if n <= 0:
                return


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
        self._caught_up: set[tuple[str, int]] = set()
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
            (isinstance(event, ev.SaveReported) and event.report.ok)
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
                log.exception("event=replicate_intake_error item=%r", item)

    def _saved(self, job: str, step: int, wall: float) -> None:
        found = self.cfg.replication_for(job)
        if found is None:
            return
        staging, dests = found
        nbytes = checkpoint_bytes(staging, step)
        if nbytes == 0:
            log.warning(
                "event=replicate_missing job=%s step=%d staging=%s (the job reported the save, "
                "but its files are not in the configured staging directory: does the job save "
                "to jobs.%s.staging?)",
                job, step, staging, job,
            )  # fmt: skip
        for d in dests:
            self.queues[d.name].add(job, staging, step, saved=wall, nbytes=nbytes)

    def _registered(self, event: ev.JobRegistered) -> None:
        found = self.cfg.replication_for(event.job)
        if found is None:
            return
        staging = found[0]
        saves_to = Path(event.checkpoint_dir) if event.checkpoint_dir else None
        if saves_to is not None and saves_to.is_absolute():
            with contextlib.suppress(OSError):
                self._devices[event.job] = os.stat(saves_to).st_dev
            if _resolved(saves_to) != _resolved(staging):
                log.warning(
                    "event=replicate_staging_mismatch job=%s saves_to=%s staging=%s (nothing "
                    "it saves will be replicated until jobs.\"PATTERN\".staging names its "
                    "checkpoint directory)",
                    event.job, saves_to, staging,
                )  # fmt: skip
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
                "event=replicate_catch_up destination=%s job=%s step=%d "
                "(uploaded unless the destination has it)",
                d.name, job, local,
            )  # fmt: skip
            q.add(job, staging, local, saved=saved, nbytes=checkpoint_bytes(staging, local))

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


def _resolved(p: Path) -> Path:
    with contextlib.suppress(OSError):
        return p.resolve()
    return p
