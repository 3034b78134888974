"""Taking saves: one asynchronous save at a time, its watcher thread, its report.

:class:`Saves` starts a save with ``tf.train.CheckpointManager`` and
``CheckpointOptions(enable_async=True)``, measures the time the training thread was
blocked, hands the write to one watcher thread of ours that waits for it to end and
records its outcome (time until durable, bytes, errors), and turns the outcome into a
:class:`~adaptd.protocol.job.SaveReport` on the training thread, so every report, log line
and plan change happens there.

In a multi-worker job, every rank also writes its own part of each save (its data
position and other per-rank state, :class:`~adaptd.client.save.rank_state.RankPart`) into
the job's directory; the save is whole for this rank when both writes ended well. A
worker that is not the chief writes its (required) copy of the replicated state to
host-local scratch (:class:`~adaptd.client.save.scratch.Scratch`), never to the shared
directory, and the scratch copy is removed once its write ended.
"""

from __future__ import annotations

import logging
import threading
from queue import SimpleQueue
from time import perf_counter

import tensorflow as tf

from adaptd.client.save import files
from adaptd.client.save.async_writes import clear_async_error, wait_for_write
from adaptd.client.save.costs import Baseline, SaveWindow, StepClock
from adaptd.client.save.local_tier import LocalTier
from adaptd.client.save.rank_state import RankPart
from adaptd.client.save.scratch import Scratch
from adaptd.client.save.state import CheckpointState
from adaptd.client.save.targets import Durable, Target
from adaptd.client.save.writer import Writer
from adaptd.core.estimators import JobTracker
from adaptd.protocol import job as protocol

log = logging.getLogger("adaptd.client")


class Pending:
    """One save between the save call and its report."""

    __slots__ = (
        "blocking_s",
        "done",
        "error",
        "finished_at",
        "nbytes",
        "part",
        "path",
        "reason",
        "started_at",
        "step",
        "target",
        "window",
        "written_at",
    )

    def __init__(
        self, step: int, path: str, started_at: float, reason: str, target: Target | None = None
    ) -> None:
        self.step = step
        self.target = target  # where it is written (None: the durable side)
        self.path = path
        self.started_at = started_at
        self.reason = reason
        self.blocking_s = 0.0
        self.window: SaveWindow | None = None
        self.written_at: float | None = None  # set by TF's write callback (TF's thread)
        self.finished_at: float | None = None  # set by the watcher when TF's thread is done
        self.error = ""
        self.nbytes = 0
        self.part = False  # this rank's own part is being written too
        self.done = threading.Event()

    def written(self, save_path: str) -> None:  # TF calls this after a successful write
        self.written_at = perf_counter()


class Saves:
    """The saves of one checkpointer, and what each cost.

    Args:
        state: what is saved.
        durable: the job's checkpoint directory (:class:`~adaptd.client.save.targets.
            Durable`): where the saves go, and whose newest checkpoint a failed save
            leaves in force.
        writer: sets the priority of TensorFlow's async-save thread.
        job, rank: who saves (for the reports).
        scratch: where this rank's copies go instead of ``durable`` (a worker that is
            not the chief of a mirrored job), or None.
        part: this rank's own part of each save (a rank of a multi-worker job), or None.
        local: the job's local tier (two tiers), where a save that is not made durable
            goes (:meth:`save`'s ``durable``), or None.
        local_part: this rank's own part of each local save (in the local tier), or None.
    """

    def __init__(
        self,
        state: CheckpointState,
        durable: Durable,
        writer: Writer,
        *,
        job: str,
        rank: int,
        scratch: Scratch | None = None,
        part: RankPart | None = None,
        local: LocalTier | None = None,
        local_part: RankPart | None = None,
    ) -> None:
        self.state = state
        self.durable = durable
        #: Where the replicated state of each save is written.
        self.target: Target = scratch if scratch is not None else durable
        self._writer = writer
        self.job = job
        self.rank = rank
        self.part = part
        self.local = local
        self.local_part = local_part
        self.pending: Pending | None = None
        #: Every finished save, as sent to the daemon (failed ones too).
        self.history: list[protocol.SaveReport] = []
        self.failed = 0
        self._queue: SimpleQueue[Pending | None] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._tracker: JobTracker | None = None
        self._clock: StepClock | None = None
        self._baseline: Baseline | None = None

    def start(self, tracker: JobTracker, clock: StepClock, baseline: Baseline) -> None:
        """Begin measuring (the run starts) and start the watcher thread."""
        self._tracker, self._clock, self._baseline = tracker, clock, baseline
        self._thread = threading.Thread(target=self._watch, name="adaptd-save-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the watcher thread once the writes queued for it are done; with no write
        in flight, the local tier's emptied directories go now (not when the thread
        gets to it: the process may be exiting)."""
        if self._thread is not None:
            self._queue.put(None)
        if self.local is not None and not self.in_flight:
            self.local.close()

    @property
    def in_flight(self) -> bool:
        """True while a save's background write has not ended."""
        p = self.pending
        return p is not None and not p.done.is_set()

    def save(
        self, n: int, reason: str, interval_s: float | None, durable: bool = True
    ) -> protocol.SaveReport | None:
        """Start the save of step ``n`` (``interval_s``: the planned interval, for the
        writer's priority; ``durable`` False: to the local tier only, when there is
        one). One save is in flight at a time: the previous one is waited for first
        and its report returned (None when there was none)."""
        assert self._tracker is not None and self._baseline is not None
        assert self._clock is not None
        t0 = perf_counter()
        prev = self.pending
        report = None
        if prev is not None:  # one save in flight at a time: TF would wait here too
            prev.done.wait()
            report = self.report(prev, n, t0)
        baseline = self._baseline.close(n, t0)
        local = not durable and self.local is not None
        target: Target = self.local if local and self.local is not None else self.target
        part = self.local_part if local else self.part
        self._tracker.on_save_requested(t0, n, durable=not local)
        pending = Pending(n, target.prefix(n), t0, reason, target if local else None)
        self._writer.prepare(  # between writes: the previous one is done
            interval_s=interval_s,
            latency_s=self._tracker.save_latency_s,
            newest_s=self.history[-1].durable_s if self.history else None,
        )
        try:
            self.state.before_save(n)
            if part is not None:  # first: its marker must precede the chief's write
                part.start(n)
                pending.part = True
            options = tf.train.CheckpointOptions(
                enable_async=True, experimental_write_callbacks=[pending.written]
            )
            pending.path = target.write(self.state.checkpoint, n, options)
            self._writer.apply()  # the first save created TF's writer thread
        except Exception as exc:  # reported, never raised into the training loop
            pending.error = f"{type(exc).__name__}: {exc}"
            clear_async_error(self.state.checkpoint)
            if not pending.part:  # nothing is being written: done now
                pending.finished_at = perf_counter()
                pending.done.set()
                if part is not None:
                    part.abandon(n)
        t1 = perf_counter()
        pending.blocking_s = t1 - t0
        pending.window = SaveWindow(baseline, n, t1)
        self._clock.blocked(pending.blocking_s)
        self.pending = pending
        if not pending.done.is_set():
            self._queue.put(pending)
        return report

    def _watch(self) -> None:
        """Watcher thread: wait for each write to end; record time, size and errors."""
        ckpt = self.state.checkpoint
        while True:
            pending = self._queue.get()
            if pending is None:
                self.target.close()
                if self.local is not None:
                    self.local.close()
                return
            try:
                wait_for_write(ckpt)
            except Exception as exc:
                pending.error = f"{type(exc).__name__}: {exc}"
            err = clear_async_error(ckpt)
            if err is not None:
                pending.error = f"{type(err).__name__}: {err}"
            elif pending.written_at is None and not pending.error:
                pending.error = "the write ended without TensorFlow's completion callback"
            if pending.error:
                files.remove_checkpoint(pending.path)
            else:
                pending.nbytes = files.checkpoint_bytes(pending.path)
            part = self.local_part if pending.target is not None else self.part
            if pending.part and part is not None:  # a failed part fails the save
                part_error, part_bytes = part.finish()
                pending.error = "; ".join(e for e in (pending.error, part_error) if e)
                pending.nbytes += part_bytes
            pending.finished_at = perf_counter()
            target = pending.target if pending.target is not None else self.target
            target.ended(pending.path)  # e.g. a scratch copy: it served the collectives
            pending.done.set()

    def report_done(self, n: int, now: float) -> protocol.SaveReport | None:
        """The report of the save in flight if its write ended (and the run moved past
        its step, so that its extra step time is measured), else None."""
        p = self.pending
        if p is not None and p.done.is_set() and n > p.step:
            return self.report(p, n, now)
        return None

    def wait(self, n: int, timeout: float | None) -> protocol.SaveReport | None:
        """Wait up to ``timeout`` seconds (None: for good) for the save in flight; its
        report, or None when there was none or it did not end in time (logged)."""
        p = self.pending
        if p is None:
            return None
        if p.done.wait(timeout):
            return self.report(p, n, perf_counter())
        log.warning(
            "the save of step %d was not durable after %ss; exiting anyway", p.step, timeout
        )
        return None

    def record(
        self, step: int, reason: str, path: str, seconds: float, nbytes: int
    ) -> protocol.SaveReport:
        """The report of a save made synchronously outside this class (a just-in-time
        save, :mod:`adaptd.client.save.just_in_time`: it blocked the loop ``seconds`` and
        was durable then), recorded in :attr:`history`; not a sample of the periodic
        saves' cost, so the tracker does not hear of it."""
        report = protocol.SaveReport(
            v=protocol.VERSION, job=self.job, rank=self.rank, step=step, blocking_s=seconds,
            durable_s=seconds, bytes=nbytes, extra_step_s=0.0, ok=True,
            path=path[: protocol.MAX_TEXT], reason=reason[: protocol.MAX_TEXT],
        )  # fmt: skip
        self.history.append(report)
        return report

    def report(self, pending: Pending, n: int, now: float) -> protocol.SaveReport:
        """The report of ``pending`` (whose write ended), recorded in :attr:`history`
        and in the tracker; ``n`` and ``now``: where the training thread is."""
        assert self._tracker is not None and self._baseline is not None
        self.pending = None
        ok = not pending.error
        extra = pending.window.extra(n, now) if pending.window is not None else 0.0
        durable = (pending.finished_at or now) - pending.started_at
        report = protocol.SaveReport(
            v=protocol.VERSION,
            job=self.job,
            rank=self.rank,
            step=pending.step,
            blocking_s=pending.blocking_s,
            durable_s=max(0.0, durable),
            bytes=pending.nbytes,
            extra_step_s=extra,
            ok=ok,
            error=pending.error[: protocol.MAX_TEXT],
            path=pending.path[: protocol.MAX_TEXT],
            reason=pending.reason[: protocol.MAX_TEXT],
            tier="local" if pending.target is not None else "",
        )
        self.history.append(report)
        self._tracker.on_save_report(
            now,
            pending.step,
            blocking_s=report.blocking_s,
            durable_s=report.durable_s,
            extra_step_s=extra,
            ok=ok,
            tier="local" if pending.target is not None else "durable",
        )
        self._baseline.restart(n, now)
        if ok and pending.target is None and self.local is not None:
            self.local.superseded(pending.step)  # the older local copies are not needed
        if ok:
            log.info(
                "saved step %d%s: blocking %.1f ms, durable %.1f ms, %.2f MB, extra step %.1f ms",
                pending.step,
                " to the local tier" if report.tier else "",
                report.blocking_s * 1e3,
                report.durable_s * 1e3,
                report.bytes / 1e6,
                extra * 1e3,
            )
        else:
            self.failed += 1
            log.error(
                "save at step %d failed (%s); latest stays %s",
                pending.step,
                pending.error,
                self.durable.latest,
            )
        return report


__all__ = ["Pending", "Saves"]
