"""One destination of the Replicator: its queue of uploads, its workers, its bandwidth cap.

:class:`DestinationQueue` holds, per job, the one pending upload (a newer checkpoint
replaces an older pending one) and what was replicated; ``max_concurrent`` worker
threads take uploads in the order of the pure :func:`~adaptd.tiers.schedule.next_upload`
(the job waiting longest first, ties round-robin) and share one
:class:`~adaptd.tiers.throttle.Throttle`. A failed upload is retried after
:func:`~adaptd.tiers.schedule.retry_delay`; a checkpoint deleted locally
before it was uploaded is skipped. A step of a multi-worker job waits until every
rank's part is in the staging directory (a rank may finish its write after the one
that reported; :mod:`adaptd.checkpoints.rank_parts`), checked again after each retry delay, and is
skipped with the reason after :data:`WAIT_FOR_PARTS` checks. Everything that touches
the destination happens in its own workers, so a slow destination holds up nobody else.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from adaptd.checkpoints import rank_parts
from adaptd.config.loader import Destination
from adaptd.logfmt import logfmt
from adaptd.protocol.admin import ReplicationInfo
from adaptd.tiers.replica import Replica, Throttle, UploadResult
from adaptd.tiers.schedule import Pending, merge, next_upload, retry_delay

__all__ = [
    "TAKE_PIECE",
    "THROUGHPUT_WINDOW_S",
    "WAIT_FOR_PARTS",
    "DestinationQueue",
    "SlotGate",
    "UploadInterrupted",
]

log = logging.getLogger("adaptd.replicator")

#: Throughput is the bytes sent over this window.
THROUGHPUT_WINDOW_S = 5.0
#: Throttle.take is asked for at most this much at a time, so a stop is prompt.
TAKE_PIECE = 256 * 1024
#: Checks (after 2, 4, 8 ... s) of a step that lacks a rank's part before it is skipped.
WAIT_FOR_PARTS = 8


#: ``slot_gate(destination, job, stopping)``: a context manager held around one upload
#: (a fleet write slot on a destination other hosts share; ``stopping()`` ends a wait).
SlotGate = Callable[[Destination, str, Callable[[], bool]], contextlib.AbstractContextManager[Any]]


class UploadInterrupted(Exception):
    """The replicator is stopping: the upload was abandoned (it resumes at the next start)."""


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
    saves_to: Path | None = None  # where the job says it saves (its hello), if known
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

    def add(
        self,
        job: str,
        staging: Path,
        step: int,
        *,
        saved: float,
        nbytes: int,
        saves_to: Path | None = None,
    ) -> None:
        """Queue ``job``'s checkpoint ``step`` (replacing an older pending one);
        ``saves_to`` is the directory the job said it saves to."""
        with self._cond:
            st = self._state(job, staging)
            if saves_to is not None:
                st.saves_to = saves_to
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
                    logfmt(
                        "replicate_bug", destination=self.dest.name, job=item.job, step=item.step
                    )
                )
                self._failed(item, st, "internal error (see the daemon's log)")
            finally:
                with self._cond:
                    st.upload = None
                    self._cond.notify_all()

    def _run(self, item: Pending, st: _JobState) -> None:
        name, job, step = self.dest.name, item.job, item.step
        index = st.staging / f"ckpt-{step}.index"
        if not index.exists():
            self._skipped(item, st, missing_reason(st.staging, st.saves_to))
            return
        whole = rank_parts.status(rank_parts.listing(st.staging), step)
        if not whole.complete:
            self._incomplete(item, st, whole.why)
            return
        try:
            replica = Replica(st.url, storage_options=self.dest.storage_options)
            remote = replica.latest()
            if remote is not None:
                self.track(job, st.staging, last_step=remote)
            if remote == step:  # there already (a catch-up after a restart, usually)
                self._say(logging.INFO, "replicate_current", job, step)
                return
            if remote is not None and remote > step:
                self._skipped(item, st, f"the destination's LATEST is already step {remote}")
                return
            self._say(logging.INFO, "replicate_start", job, step, bytes=item.nbytes, url=st.url)
            gate = (
                self._slot_gate(self.dest, job, self._stopping.is_set)
                if self._slot_gate is not None
                else contextlib.nullcontext()
            )
            with gate:  # a fleet write slot on a shared destination (docs/fleet.md)
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
        self._say(
            logging.INFO,
            "replicated",
            job,
            step,
            bytes_sent=result.bytes_sent,
            bytes=result.bytes_total,
            files=result.files,
            resumed_files=result.resumed_files,
            seconds=round(result.seconds, 3),
            yielded_s=round(result.yielded_s, 3),
        )
        if self._on_upload is not None:
            try:
                self._on_upload(name, job, result)
            except Exception:  # the upload itself succeeded; only the callback failed
                log.exception(logfmt("replicate_callback_failed", destination=name, job=job))
        self._prune(replica, job)

    def _prune(self, replica: Replica, job: str) -> None:
        d = self.dest
        keep_every = d.keep_every_hours * 3600.0 if d.keep_every_hours else None
        try:
            deleted = replica.prune(keep_last=d.keep_last, keep_every_s=keep_every, now=self.wall())
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._say(logging.WARNING, "replicate_prune_failed", job, error=error)
            return
        if deleted:
            steps = ",".join(map(str, deleted))
            self._say(logging.INFO, "replicate_pruned", job, steps=steps, keep_last=d.keep_last)

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
                    logfmt(
                        "replicate_yield",
                        destination=self.dest.name,
                        step=upload.step,
                        staging=st.staging,
                        why="a job is saving on the same disk",
                    )
                )
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
        self._say(logging.INFO, "replicate_skipped", item.job, item.step, reason=why)
        with self._cond:
            st.skipped += 1
            st.waiting = {s: t for s, t in st.waiting.items() if s > item.step}

    def _incomplete(self, item: Pending, st: _JobState, why: str) -> None:
        """A step not complete for the job yet: checked again later (not a failure of
        the destination), skipped after :data:`WAIT_FOR_PARTS` checks."""
        attempts = item.attempts + 1
        if attempts > WAIT_FOR_PARTS:
            self._skipped(item, st, f"{why} (still, after {WAIT_FOR_PARTS} checks)")
            return
        delay = retry_delay(attempts)
        self._say(
            logging.INFO, "replicate_waiting", item.job, item.step,
            attempt=attempts, retry_in_s=delay, reason=why,
        )  # fmt: skip
        self._retry(item, st, attempts, delay)

    def _retry(self, item: Pending, st: _JobState, attempts: int, delay: float) -> None:
        """Queue ``item`` again after ``delay`` seconds (its ``attempts``-th); a newer
        checkpoint queued meanwhile wins."""
        with self._cond:
            retry = replace(item, attempts=attempts, not_before=self.clock() + delay)
            st.pending = retry if st.pending is None else merge(retry, st.pending)

    def _interrupted(self, item: Pending, st: _JobState) -> None:
        why = "stopping; the upload resumes at the next start"
        self._say(logging.INFO, "replicate_interrupted", item.job, item.step, why=why)

    def _failed(self, item: Pending, st: _JobState, error: str) -> None:
        attempts = item.attempts + 1
        delay = retry_delay(attempts)
        self._say(
            logging.WARNING, "replicate_failed", item.job, item.step,
            attempt=attempts, retry_in_s=delay, error=error,
        )  # fmt: skip
        with self._cond:
            st.failures += 1
            st.last_error = error
            st.last_error_at = self.wall()
        self._retry(item, st, attempts, delay)

    def _say(self, level: int, event: str, job: str, step: int | None = None, **fields: Any):
        """One log line about ``job``'s upload (of ``step``) to this destination."""
        where: dict[str, Any] = {"destination": self.dest.name, "job": job}
        if step is not None:
            where["step"] = step
        log.log(level, logfmt(event, **where, **fields))

    # -- status

    def throughput(self) -> float:
        """Bytes per second sent to this destination over the last few seconds."""
        now = self.clock()
        with self._cond:
            recent = sum(n for t, n in self._sent if t >= now - THROUGHPUT_WINDOW_S)
        return recent / THROUGHPUT_WINDOW_S

    def status(self) -> list[ReplicationInfo]:
        now, wall = self.clock(), self.wall()
        with self._cond:
            return [
                _row(self.dest.name, job, st, now, wall) for job, st in sorted(self._jobs.items())
            ]


def _row(destination: str, job: str, st: _JobState, now: float, wall: float) -> ReplicationInfo:
    """What ``adaptd status`` shows of one job at one destination (``now``: monotonic)."""
    up, p = st.upload, st.pending
    behind = wall - min(st.waiting.values()) if st.waiting else 0.0
    rate = None
    if up is not None and now > up.started:
        rate = up.sent / (now - up.started)
    return ReplicationInfo(
        destination=destination,
        job=job,
        url=st.url,
        last_step=st.last_step,
        uploading_step=up.step if up is not None else None,
        pending_step=p.step if p is not None else None,
        pending_uploads=(up is not None) + (p is not None),
        pending_bytes=(max(0, up.nbytes - up.sent) if up else 0) + (p.nbytes if p else 0),
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
        next_retry_s=max(0.0, p.not_before - now) if p is not None and p.attempts else None,
    )


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


def missing_reason(staging: Path, saves_to: Path | None) -> str:
    """Why a checkpoint a job reported is not in its staging directory: the job saves
    somewhere else (its hello said so), or TF's ``max_to_keep`` deleted it already."""
    if saves_to is not None and resolved(saves_to) != resolved(staging):
        return (
            f"not in the staging directory {staging}: the job saves to {saves_to} "
            '(set jobs."PATTERN".staging to it)'
        )
    return "deleted locally before it was uploaded (max_to_keep)"


def resolved(p: Path) -> Path:
    """``p`` with links resolved where it can be, else as given."""
    with contextlib.suppress(OSError):
        return p.resolve()
    return p
