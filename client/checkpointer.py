"""The training-loop hook: :class:`AdaptiveCheckpointer`.

It owns a ``tf.train.Checkpoint`` of the user's trackables (plus the global step and
the Keras seed-generator states), a ``tf.train.CheckpointManager`` that numbers
checkpoints by the global step, a non-blocking ZeroMQ link to the daemon and an
embedded copy of the policy stack for when there is no daemon.

Threads: the training thread calls :meth:`step`; TensorFlow's async-checkpoint
thread writes; one watcher thread of ours waits for each write to end and records
its outcome. The training thread reads that outcome on its next tick, so every
report, log line and plan change happens on the training thread.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import signal
import socket as _socket
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from queue import SimpleQueue
from time import perf_counter
from typing import Any

import msgspec
import tensorflow as tf

from adaptd import paths, protocol
from adaptd.client import async_fixes, files, intact, ranks, remote
from adaptd.client.costs import Baseline, SaveWindow, StepClock
from adaptd.client.link import DaemonLink
from adaptd.client.schedule import NEVER, Due, SaveSchedule
from adaptd.client.writer import AUTO, Writer, WriterNice, WriterPriority
from adaptd.config import did_you_mean
from adaptd.estimators import JobTracker
from adaptd.policy import DEFAULT_SPEC, Policy, PolicyError, parse
from adaptd.snapshot import Snapshot

log = logging.getLogger("adaptd.client")

#: Checkpoint keys the hook adds next to the user's trackables.
STEP_KEY = "adaptd_global_step"
SEEDS_KEY = "adaptd_keras_seeds"
_RESERVED = {STEP_KEY, SEEDS_KEY, "save_counter"}
_INF = float("inf")
#: The reason of the save :meth:`AdaptiveCheckpointer.close` makes of the last step.
FINAL_SAVE_REASON = "end of run"
#: At most this long (or ``daemon_timeout``, if shorter) ``restore_or_initialize()``
#: waits for a daemon whose socket is there to answer: a live one does in milliseconds.
WELCOME_WAIT_S = 1.0
#: Default priority of TensorFlow's async-save thread (see ``writer_nice``): chosen
#: before each save from the planned interval and the measured durable latency
#: (:mod:`adaptd.client.writer`, measured in benchmarks/save_stall.py).
DEFAULT_WRITER_NICE: WriterNice = AUTO


class _Pending:
    """One save between the save call and its report."""

    __slots__ = (
        "blocking_s",
        "done",
        "error",
        "finished_at",
        "nbytes",
        "path",
        "reason",
        "started_at",
        "step",
        "window",
        "written_at",
    )

    def __init__(self, step: int, path: str, started_at: float, reason: str) -> None:
        self.step = step
        self.path = path
        self.started_at = started_at
        self.reason = reason
        self.blocking_s = 0.0
        self.window: SaveWindow | None = None
        self.written_at: float | None = None  # set by TF's write callback (TF's thread)
        self.finished_at: float | None = None  # set by the watcher when TF's thread is done
        self.error = ""
        self.nbytes = 0
        self.done = threading.Event()

    def written(self, save_path: str) -> None:  # TF calls this after a successful write
        self.written_at = perf_counter()


class AdaptiveCheckpointer:
    """Saves ``trackables`` asynchronously at the steps the daemon (or the embedded
    policy) plans, and reports what each save cost.

    Args:
        directory: where checkpoints go (created if missing).
        job: job id shared by all ranks (letters, digits, ``_.:@+-``).
        max_to_keep: checkpoints kept by the ``CheckpointManager`` (None: all).
        policy: a spec such as ``"fixed:steps=100"`` or a policy object; overrides
            the daemon's choice (sent in Hello) and drives the embedded fallback.
            Default: the daemon's choice, and :data:`adaptd.policy.DEFAULT_SPEC`
            embedded.
        socket: daemon endpoint or socket path (default :func:`adaptd.paths.endpoint`).
        curve_server_key, curve_client_key: for a ``tcp://`` socket, the daemon's public
            key file and this client's ``*.key_secret`` (default:
            ``$ADAPTD_CURVE_SERVER_KEY``/``$ADAPTD_CURVE_CLIENT_KEY``; see
            :class:`adaptd.client.link.DaemonLink`).
        rank, world_size: this process's place in the job (default: environment,
            see :mod:`adaptd.client.ranks`).
        daemon_timeout: seconds of silence after a send before the daemon counts
            as gone (also how long to wait for the first Welcome).
        handle_sigterm: on SIGTERM save at the next step, wait until durable, then
            let the signal take effect. Installed only from the main thread.
        poll_interval: wall seconds between socket polls in :meth:`step`.
        report_interval: wall seconds between step-time reports to the daemon.
        decide_interval: wall seconds between embedded re-decisions.
        writer_nice: priority of TensorFlow's async-save thread. ``"auto"`` (the
            default): nice 19 while the measured time until durable is at most a
            quarter of the planned interval and the host is not overloaded, the
            training thread's own priority once it exceeds half of it (see
            :mod:`adaptd.client.writer`); a :class:`~adaptd.client.writer.WriterPriority`:
            the same rule with other settings; an int 0-19: that nice value always;
            ``None`` or 0: left alone. Linux per-thread nice; elsewhere nothing changes.
        restore_from: a durable destination (fsspec URL or path: the job's folder
            there, ``{job}`` is replaced by the job id) to pull the newest verified
            checkpoint from when ``directory`` has none, e.g. on a new host (default
            ``$ADAPTD_RESTORE_FROM``; see :mod:`adaptd.client.remote`).
        storage_options: fsspec options for ``restore_from`` (e.g. ``endpoint_url``).
        save_on_close: :meth:`close` (and leaving a ``with`` block without an
            exception) saves the current step when the run advanced since its last
            save, so even a run shorter than the first planned interval leaves a
            checkpoint (as the Keras callback saves at the end of ``fit``). Default on.
        **trackables: what to checkpoint (``model=``, ``optimizer=``,
            ``data_iterator=``, ``rng=``, any ``tf`` trackable).

    Raises:
        ValueError: an argument is invalid (the message names it and the value).
        PolicyError: ``policy`` does not parse.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        job: str,
        max_to_keep: int | None = 5,
        policy: str | Policy | None = None,
        socket: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        daemon_timeout: float = 5.0,
        handle_sigterm: bool = True,
        poll_interval: float = 0.025,
        report_interval: float = 1.0,
        decide_interval: float = 5.0,
        writer_nice: WriterNice = DEFAULT_WRITER_NICE,
        restore_from: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        curve_server_key: str | os.PathLike[str] | None = None,
        curve_client_key: str | os.PathLike[str] | None = None,
        save_on_close: bool = True,
        **trackables: Any,
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise ValueError(f"directory must be a non-empty path, got {directory!r}")
        try:
            msgspec.convert(job, protocol.JobId)
        except msgspec.ValidationError:
            raise ValueError(
                f"job must be 1-256 characters of letters, digits and _.:@+- "
                f"(not starting with one of .:@+-), got {job!r}"
            ) from None
        if max_to_keep is not None and (
            isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1
        ):
            raise ValueError(f"max_to_keep must be an integer >= 1 or None, got {max_to_keep!r}")
        for name, value in (
            ("poll_interval", poll_interval),
            ("report_interval", report_interval),
            ("decide_interval", decide_interval),
        ):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if (
            writer_nice is not None
            and writer_nice != AUTO
            and not isinstance(writer_nice, WriterPriority)
            and (
                isinstance(writer_nice, bool)
                or not isinstance(writer_nice, int)
                or not 0 <= writer_nice <= 19
            )
        ):
            raise ValueError(
                f"writer_nice must be 'auto', a WriterPriority, an integer from 0 to 19, or "
                f"None to leave the writer's priority alone, got {writer_nice!r}"
            )
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ValueError(
                f"storage_options must be a mapping of fsspec options or None, "
                f"got {type(storage_options).__name__}"
            )
        if not trackables:
            raise ValueError(
                "nothing to checkpoint: pass the state as keywords, "
                "e.g. AdaptiveCheckpointer(dir, job=..., model=model, optimizer=opt)"
            )
        for key, value in trackables.items():
            if key in _RESERVED:
                raise ValueError(f"the checkpoint key {key!r} is reserved by adaptd; rename it")
            if not isinstance(value, tf.__internal__.tracking.Trackable):
                hint = did_you_mean(key, _OPTIONS)
                if hint:  # a misspelt option, not state: say which one was meant
                    raise ValueError(
                        f"{key}= is not an option of AdaptiveCheckpointer{hint} (other keywords "
                        "are state to checkpoint and must be TensorFlow trackables)"
                    )
                raise ValueError(
                    f"{key}= must be a TensorFlow trackable (model, optimizer, tf.Variable, "
                    f"tf.data iterator, tf.random.Generator, ...), got {type(value).__name__}"
                )
        self.directory = Path(directory)
        self.job = job
        #: Where an empty directory is filled from (None: nowhere), and what that did.
        self.restore_from = remote.source(restore_from, job)
        self._storage_options = dict(storage_options or {})
        self.pulled: remote.Pull | None = None
        self._max_to_keep = max_to_keep
        self.rank, self.world_size = ranks.resolve(rank, world_size)
        self.policy: Policy = parse(policy if policy is not None else DEFAULT_SPEC)
        self._policy_spec = _spec_of(policy)
        #: How the embedded policy is named in messages: the spec as given (the
        #: package default's is "default"), or a policy object's class name.
        self._policy_label = self._policy_spec or (
            DEFAULT_SPEC if policy is None else _name_of(self.policy)
        )
        # A policy object cannot be sent to the daemon, so it is run here and the
        # daemon's plans are ignored (its urgent SaveNow requests are still honoured).
        self._local_only = policy is not None and not isinstance(policy, str)
        self.endpoint = paths.endpoint(socket)
        self._poll_s = float(poll_interval)
        self._report_s = float(report_interval)
        self._decide_s = float(decide_interval)
        self._handle_sigterm = bool(handle_sigterm)
        self._save_on_close = bool(save_on_close)
        self._trackables = dict(trackables)
        self._step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name=STEP_KEY)
        extra: dict[str, Any] = {STEP_KEY: self._step_var}
        seeds = async_fixes.seed_states(trackables)
        if seeds:
            extra[SEEDS_KEY] = seeds
        self.checkpoint = tf.train.Checkpoint(**trackables, **extra)
        self._writer = Writer(self.checkpoint, writer_nice)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, str(self.directory), max_to_keep=max_to_keep
        )
        self._link = DaemonLink(
            self.endpoint,
            timeout_s=daemon_timeout,
            curve_server_key=curve_server_key,
            curve_client_key=curve_client_key,
        )

        # Hot-path state: step() reads these and nothing else.
        self._n = 0
        self._due = 0  # 0: the first step() runs the slow path, which starts the hook
        self._tick_at = 0.0
        self._last = 0.0  # when the previous step() (or the slow path) ended
        self._slowest = 0.0  # the slowest step() call since the last report...
        self._slowest_n = 1  # ...and the steps it covered

        self._started = False
        self._closed = False
        self._keras_fixed = False
        self._schedule = SaveSchedule()
        self._tracker: JobTracker | None = None
        self._clock: StepClock | None = None
        self._baseline: Baseline | None = None
        self._pending: _Pending | None = None
        self._watch_q: SimpleQueue[_Pending | None] = SimpleQueue()
        self._watcher: threading.Thread | None = None
        self._report_at = self._decide_at = self._hello_at = self._deadline_at = 0.0
        self._daemon_mode = False
        self._hello_sent = False
        self._warned = False
        self._fell_back = False
        self._error_codes: set[str] = set()
        self._preempt: int | None = None
        self._prev_handler: Any = None
        self._sigterm_installed = False
        self.resumed_from = 0
        self.restore_s: float | None = None
        #: What restore_or_initialize() restored and the damaged checkpoints it skipped.
        self.resume = intact.Resume(None)
        self.state_bytes = 0
        #: Every finished save, as sent to the daemon (failed ones too).
        self.history: list[protocol.SaveReport] = []
        self.failed_saves = 0
        self._atexit = _weak_close(self)
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ public API

    def restore_or_initialize(self) -> int:
        """Restore the newest intact checkpoint, if any; return the step to continue from.

        Removes leftovers of interrupted writes first. With ``restore_from`` and a
        directory without checkpoints, first pulls the newest verified checkpoint from
        there (a destination that cannot be read is a warning and a fresh start; the
        pull's time counts into ``restore_s``). Each checkpoint, newest first, gets
        ``adaptd verify``'s quick check before it is restored; a damaged one is
        skipped with a warning naming it and why, the next older one is restored, and
        the daemon is told (see :mod:`adaptd.client.intact`; :attr:`resume` holds
        what happened). Call once, before the first :meth:`step`.

        Raises:
            RuntimeError: called twice or after :meth:`step`.
            NoIntactCheckpoint: there are checkpoints, but every one is damaged (the
                message names each and what is wrong).
            AssertionError: (TensorFlow's) the checkpoint does not match the state.
        """
        if self._started:
            raise RuntimeError("restore_or_initialize() must be called once, before step()")
        files.remove_orphans(self.directory)
        t0 = perf_counter()
        if self.restore_from is not None:
            self.pulled = remote.pull_if_empty(
                self.directory, self.restore_from, storage_options=self._storage_options
            )
            if self.pulled.step is not None:  # the manager read the state file when empty
                self.manager = tf.train.CheckpointManager(
                    self.checkpoint, str(self.directory), max_to_keep=self._max_to_keep
                )
        self.resume = intact.restore_newest_intact(self.directory, self._restore)
        latest = self.resume.restored
        start = 0
        restore_s = None
        if latest:
            start = int(self._step_var.numpy())
            if start == 0:  # written without our step variable: trust the name ckpt-N
                start = _number_of(latest)
            restore_s = perf_counter() - t0
            log.info("restored %s: continuing from step %d (%.3fs)", latest, start, restore_s)
        if self.resume.skipped:
            text = f"adaptd: the newest checkpoint in {self.directory} is damaged: " + (
                self.resume.describe()
            )
            log.warning("%s", text)
            warnings.warn(text, RuntimeWarning, stacklevel=2)
        self._start(start, restore_s)
        self._await_daemon()
        return start

    def _await_daemon(self) -> None:
        """Wait briefly for a daemon that is there to answer the Hello with its plan,
        so that training starts under it (and :attr:`mode` says so) instead of under
        the embedded policy until the first poll. No socket file: no wait."""
        endpoint = self.endpoint
        if endpoint.startswith("ipc://") and not os.path.exists(endpoint[len("ipc://") :]):
            return
        link = self._link
        start = perf_counter()
        deadline = start + min(link.timeout_s, WELCOME_WAIT_S)
        retry_at = start + 0.02
        while self._schedule.source != "daemon" and not (self._local_only and link.welcomed):
            now = perf_counter()
            if now >= deadline:
                return
            until = deadline if self._hello_sent else min(deadline, retry_at)
            if link.poll(until - now):
                now = perf_counter()
                for msg in link.receive(now):
                    self._on_message(msg, self._n, now)
                self._due = self._schedule.due
            elif not self._hello_sent and perf_counter() >= retry_at:
                # the first Hello is refused while the connection is still being made
                self._hello_sent = self._send_hello(perf_counter())
                retry_at = perf_counter() + 0.02

    def _restore(self, prefix: str) -> None:
        """Load checkpoint ``prefix`` into the state (raises if it does not match)."""
        self._drop_seeds_missing_from(prefix)
        async_fixes.build_optimizers(self._trackables)
        self.checkpoint.restore(prefix).assert_existing_objects_matched()

    def _drop_seeds_missing_from(self, path: str) -> None:
        """Keras creates its global seed generator lazily, so an older checkpoint may
        lack it; it is then left as it is instead of failing the restore."""
        seeds = getattr(self.checkpoint, SEEDS_KEY, None)
        if seeds is None:
            return
        names = {name for name, _ in tf.train.list_variables(path)}
        for key in list(seeds):
            if f"{SEEDS_KEY}/{key}/.ATTRIBUTES/VARIABLE_VALUE" not in names:
                log.info("%s has no state for the Keras seed generator %r: left as is", path, key)
                del seeds[key]

    def step(self, steps: int = 1) -> None:
        """Call once per finished training step (``steps``: how many finished since
        the previous call, e.g. ``steps_per_execution``). Costs well under a
        microsecond unless a save is due or the socket's poll time has come."""
        now = perf_counter()
        dt = now - self._last
        self._last = now
        if dt > self._slowest:  # rare: kept so that a retrace stays out of the step time
            self._slowest = dt
            self._slowest_n = steps
        n = self._n + steps
        self._n = n
        if n >= self._due or now >= self._tick_at:
            self._boundary(n, now)
            self._last = perf_counter()  # the slow path's time is no step's time

    def save(self, reason: str = "requested") -> None:
        """Save the current step now (asynchronously), unless it is already saved.

        For a final save before :meth:`close`. Raises RuntimeError after close().
        """
        if self._closed:
            raise RuntimeError("save() after close(): the checkpointer is closed")
        if not self._started:
            self._start(0, None)
        n = self._n
        if self._schedule.last_saved_step != n:
            self._save(n, reason)
            self._due = self._schedule.due

    def request_save(self, reason: str = "requested") -> None:
        """Save at the next step boundary, whatever the plan says."""
        self._schedule.request(self._n + 1, reason, self._n)
        self._due = self._schedule.due

    def close(self, timeout: float | None = 300.0) -> None:
        """Save the current step if the run advanced since its last save (unless
        ``save_on_close=False``), wait up to ``timeout`` seconds for the save in
        flight, report it, say goodbye to the daemon and close the socket. Idempotent.

        A process that ends without calling it is closed at exit without that final
        save: the state at exit may be that of a step that raised.
        """
        self._finish(timeout, goodbye="closed", final_save=self._save_on_close)

    def __enter__(self) -> AdaptiveCheckpointer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._finish(300.0, goodbye="closed", final_save=self._save_on_close)
        else:  # the state may be that of a half-done step: not saved
            self._finish(300.0, goodbye=f"exception: {exc_type.__name__}")

    @property
    def step_count(self) -> int:
        """Completed steps (the global step)."""
        return self._n

    @property
    def writer_nice(self) -> int | None:
        """The nice value applied to TF's async-save thread (None: its creator's)."""
        return self._writer.nice

    @property
    def save_in_flight(self) -> bool:
        """True while a save's background write has not ended."""
        p = self._pending
        return p is not None and not p.done.is_set()

    @property
    def mode(self) -> str:
        """``"daemon"`` when the daemon's plan is in force, else ``"embedded"``."""
        return self._schedule.source

    @property
    def next_save(self) -> Due | None:
        """The step the next save is planned at, and why."""
        return self._schedule.next_due()

    @property
    def latest_checkpoint(self) -> str | None:
        return self.manager.latest_checkpoint

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages sent, dropped (no daemon), bad frames received, failed saves."""
        return {
            "sent": self._link.sent,
            "dropped": self._link.dropped,
            "bad_frames": self._link.bad_frames,
            "saves": len(self.history),
            "failed_saves": self.failed_saves,
        }

    # ------------------------------------------------------------------ start

    def _start(self, start: int, restore_s: float | None) -> None:
        now = perf_counter()
        self._started = True
        self.resumed_from = start
        self.restore_s = restore_s
        self._n = start
        self.state_bytes = _state_bytes(self.checkpoint)
        gpus = len(tf.config.list_physical_devices("GPU"))
        self._tracker = JobTracker(
            self.job,
            world_size=self.world_size,
            gpus=max(1, gpus),
            start_step=start,
            state_bytes=self.state_bytes,
        )
        if restore_s is not None:
            self._tracker.on_restart(restore_s)
        self._gpus = gpus
        self._clock = StepClock(start, now)
        self._last, self._slowest, self._slowest_n = now, 0.0, 1
        self._baseline = Baseline(start, now)
        self._schedule.last_saved_step = start if start else None
        self._watcher = threading.Thread(
            target=self._watch, name="adaptd-save-watcher", daemon=True
        )
        self._watcher.start()
        self._hello_sent = self._send_hello(now)
        self._deadline_at = now + self._link.timeout_s
        self._report_at = now + self._report_s
        self._decide(start, now)
        self._install_sigterm()
        self._due = self._schedule.due
        self._tick_at = now + self._poll_s

    def _send_hello(self, now: float) -> bool:
        """Say hello; False when the send was refused (no connection yet)."""
        sent = self._link.send(
            protocol.Hello(
                v=protocol.VERSION,
                job=self.job,
                rank=self.rank,
                world_size=self.world_size,
                pid=os.getpid(),
                checkpoint_dir=str(self.directory.resolve())[: protocol.MAX_TEXT],
                state_bytes=self.state_bytes,
                resumed_from=self.resumed_from,
                gpus=self._gpus,
                policy=self._policy_spec or "",
                hostname=_socket.gethostname()[: protocol.MAX_TEXT],
                restore_fallback=self.resume.describe()[: protocol.MAX_TEXT],
            ),
            now,
        )
        self._hello_at = now + 1.0
        return sent

    # ------------------------------------------------------------------ slow path

    def _boundary(self, n: int, now: float) -> None:
        if not self._started:
            if self._closed:
                self._due, self._tick_at = NEVER, _INF
                return
            self._start(0, None)
            self._n = n
        if now >= self._tick_at:
            self._tick(n, now)
        if self._preempt is not None:
            self._on_preempt(n)
            return
        if n >= self._schedule.due:
            self._save(n, self._schedule.due_reason)
        # Decide after the save check: a policy plans strictly after the step it is
        # shown, so deciding first would skip a save due at this very step.
        if (self._local_only or not self._daemon_mode) and now >= self._decide_at:
            self._decide(n, now)
        self._due = self._schedule.due

    def _tick(self, n: int, now: float) -> None:
        self._tick_at = now + self._poll_s
        link = self._link
        for msg in link.receive(now):
            self._on_message(msg, n, now)
        if self._daemon_mode and not link.alive(now):
            self._lost_daemon(n, now, f"no message for {link.timeout_s:g}s")
        elif not link.welcomed:
            if now >= self._hello_at:
                self._send_hello(now)
            if not self._warned and now >= self._deadline_at:
                self._lost_daemon(n, now, f"no answer within {link.timeout_s:g}s")
        pending = self._pending
        if pending is not None and pending.done.is_set() and n > pending.step:
            self._report(pending, n, now)
        if now >= self._report_at:
            self._report_at = now + self._report_s
            self._report_steps(n, now, self.save_in_flight)

    def _report_steps(self, n: int, now: float, in_flight: bool) -> None:
        """Close the step batch at ``n``: into the embedded tracker and to the daemon."""
        batch = self._clock.batch(n, now, self._slowest, self._slowest_n)
        self._slowest, self._slowest_n = 0.0, 1
        if batch is None:
            return
        self._tracker.on_steps(
            now,
            n,
            batch.count,
            batch.mean_s,
            in_flight,
            max_s=batch.max_s,
            max_steps=batch.max_steps,
            warmup=batch.warmup,
        )
        self._link.send(
            protocol.Steps(
                v=protocol.VERSION,
                job=self.job,
                rank=self.rank,
                step=n,
                count=batch.count,
                mean_s=batch.mean_s,
                max_s=min(batch.max_s, protocol.MAX_SECONDS),
                max_steps=batch.max_steps,
                warmup=batch.warmup,
                save_in_flight=in_flight,
            ),
            now,
        )

    def _on_message(self, msg: protocol.DaemonMessage, n: int, now: float) -> None:
        if isinstance(msg, protocol.Welcome):
            if not self._daemon_mode:
                self._daemon_mode = True
                if self._fell_back:
                    log.info("adaptd daemon at %s is back: its plan is in force", self.endpoint)
        elif isinstance(msg, protocol.Plan):
            if msg.job != self.job or not self._link.welcomed or self._local_only:
                return
            self._daemon_mode = True
            if self._schedule.apply_plan(msg, n):
                log.info("plan from the daemon: %s", _describe(self._schedule))
        elif isinstance(msg, protocol.SaveNow):
            if msg.job == self.job:
                log.info("daemon asks for a save now: %s", msg.reason)
                self._schedule.save_now(msg, n)
        elif isinstance(msg, protocol.Error):
            if msg.code == "unknown_peer":
                # The daemon is there (it answered) but restarted and lost us: say
                # hello again; its Welcome and Plan follow. Its current plan stays.
                log.info("the daemon does not know this job (restarted?): saying hello again")
                self._send_hello(now)
            elif msg.code not in self._error_codes:
                self._error_codes.add(msg.code)
                log.warning("the daemon refused a message (%s): %s", msg.code, msg.message)

    def _lost_daemon(self, n: int, now: float, why: str) -> None:
        self._daemon_mode = False
        self._fell_back = True
        self._link.forget()
        self._schedule.daemon_lost()
        text = (
            f"adaptd: no daemon at {self.endpoint} ({why}); deciding in-process with "
            f"policy {self._policy_label!r} until it answers"
        )
        if not self._warned:
            self._warned = True
            log.warning("%s", text)
            warnings.warn(text, RuntimeWarning, stacklevel=5)
        else:
            log.warning("%s", text)
        self._decide_at = 0.0  # re-decide in-process at this boundary

    def _decide(self, n: int, now: float) -> None:
        self._decide_at = now + self._decide_s
        state = self._tracker.state(
            step=n,
            time=now,
            save_in_flight=self.save_in_flight,
            last_save_step=self._schedule.last_saved_step,
        )
        try:
            decision = self.policy.decide(Snapshot(time=now), state)
        except Exception as exc:  # a broken plugin must not stop training
            log.error("policy %s failed: %s", self._policy_label, exc)
            return
        if self._schedule.set_embedded(decision, n):
            log.info("embedded plan: %s", _describe(self._schedule))

    # ------------------------------------------------------------------ saving

    def _save(self, n: int, reason: str) -> None:
        t0 = perf_counter()
        prev = self._pending
        if prev is not None:  # one save in flight at a time: TF would wait here too
            prev.done.wait()
            self._report(prev, n, t0)
        baseline = self._baseline.close(n, t0)
        self._schedule.saved(n)
        self._tracker.on_save_requested(t0, n)
        prefix = os.path.join(str(self.directory), f"ckpt-{n}")  # CheckpointManager's name
        pending = _Pending(n, prefix, t0, reason)
        self._writer.prepare(  # between writes: the previous one is done
            interval_s=self._planned_interval_s(),
            latency_s=self._tracker.save_latency_s,
            newest_s=self.history[-1].durable_s if self.history else None,
        )
        try:
            self._step_var.assign(n)
            if not self._keras_fixed:
                async_fixes.fix_async_copies(tf.train.TrackableView(self.checkpoint).descendants())
                self._keras_fixed = True
            options = tf.train.CheckpointOptions(
                enable_async=True, experimental_write_callbacks=[pending.written]
            )
            pending.path = self.manager.save(checkpoint_number=n, options=options)
            self._writer.apply()  # the first save created TF's writer thread
        except Exception as exc:  # reported, never raised into the training loop
            pending.error = f"{type(exc).__name__}: {exc}"
            _clear_async_error(self.checkpoint)
            pending.finished_at = perf_counter()
            pending.done.set()
        t1 = perf_counter()
        pending.blocking_s = t1 - t0
        pending.window = SaveWindow(baseline, n, t1)
        self._clock.blocked(pending.blocking_s)
        self._pending = pending
        if not pending.done.is_set():
            self._watch_q.put(pending)

    def _planned_interval_s(self) -> float | None:
        """Seconds between saves in the plan in force (the daemon's or the embedded)."""
        d = self._schedule.decision
        if d is None:
            return None
        if d.interval_s is not None:
            return d.interval_s
        step_s = self._tracker.step_time_s
        return d.every_steps * step_s if d.every_steps and step_s else None

    def _watch(self) -> None:
        """Watcher thread: wait for each write to end; record time, size and errors."""
        while True:
            pending = self._watch_q.get()
            if pending is None:
                return
            try:
                _wait_for_write(self.checkpoint)
            except Exception as exc:
                pending.error = f"{type(exc).__name__}: {exc}"
            pending.finished_at = perf_counter()
            err = _clear_async_error(self.checkpoint)
            if err is not None:
                pending.error = f"{type(err).__name__}: {err}"
            elif pending.written_at is None and not pending.error:
                pending.error = "the write ended without TensorFlow's completion callback"
            if pending.error:
                files.remove_checkpoint(pending.path)
            else:
                pending.nbytes = files.checkpoint_bytes(pending.path)
            pending.done.set()

    def _report(self, pending: _Pending, n: int, now: float) -> None:
        self._pending = None
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
        )
        self.history.append(report)
        self._tracker.on_save_report(
            now,
            pending.step,
            blocking_s=report.blocking_s,
            durable_s=report.durable_s,
            extra_step_s=extra,
            ok=ok,
        )
        self._baseline.restart(n, now)
        if ok:
            log.info(
                "saved step %d: blocking %.1f ms, durable %.1f ms, %.2f MB, extra step %.1f ms",
                pending.step,
                report.blocking_s * 1e3,
                report.durable_s * 1e3,
                report.bytes / 1e6,
                extra * 1e3,
            )
        else:
            self.failed_saves += 1
            log.error(
                "save at step %d failed (%s); latest stays %s",
                pending.step,
                pending.error,
                self.manager.latest_checkpoint,
            )
        self._link.send(report, now)
        self._decide_at = 0.0  # re-decide after each save (if the plan is ours)

    # ------------------------------------------------------------------ SIGTERM, close

    def _install_sigterm(self) -> None:
        if not self._handle_sigterm:
            return
        if threading.current_thread() is not threading.main_thread():
            log.info("not on the main thread: SIGTERM is not handled by the hook")
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev is signal.SIG_IGN or prev is None:
            return  # SIGTERM is ignored, or owned by non-Python code: leave it alone
        self._prev_handler = prev
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._sigterm_installed = True

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Runs between two bytecodes of the main thread: only flag; step() acts on it.
        self._preempt = signum
        self._due = 0

    def _restore_sigterm(self) -> None:
        if self._sigterm_installed:
            self._sigterm_installed = False
            try:
                signal.signal(signal.SIGTERM, self._prev_handler)
            except (ValueError, TypeError) as exc:  # not the main thread any more
                log.debug("could not restore the SIGTERM handler: %s", exc)

    def _on_preempt(self, n: int) -> None:
        log.warning("SIGTERM: saving step %d, then exiting", n)
        self._finish(None, goodbye="SIGTERM")

    def _finish(self, timeout: float | None, goodbye: str, final_save: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self._due, self._tick_at = NEVER, _INF
        signum = self._preempt
        try:
            if self._started:
                n = self._n
                now = perf_counter()
                last = self._schedule.last_saved_step
                if signum is not None and last != n:
                    self._save(n, "SIGTERM")
                elif final_save and n != (last or 0):
                    self._save(n, FINAL_SAVE_REASON)
                pending = self._pending
                if pending is not None:
                    if pending.done.wait(timeout):
                        self._report(pending, n, perf_counter())
                    else:
                        log.warning(
                            "the save of step %d was not durable after %ss; exiting anyway",
                            pending.step,
                            timeout,
                        )
                now = perf_counter()
                self._report_steps(n, now, False)
                self._link.send(
                    protocol.Goodbye(
                        v=protocol.VERSION, job=self.job, rank=self.rank, step=n, reason=goodbye
                    ),
                    now,
                )
                self._watch_q.put(None)
        finally:
            self._link.close(linger_ms=200)
            self._restore_sigterm()
            atexit.unregister(self._atexit)
        if signum is not None:
            log.warning("re-delivering signal %d", signum)
            os.kill(os.getpid(), signum)


# ---------------------------------------------------------------------- helpers


def _weak_close(ckptr: AdaptiveCheckpointer) -> Callable[[], None]:
    ref = weakref.ref(ckptr)

    def close_at_exit() -> None:
        obj = ref()
        if obj is not None:  # no final save: the process may be ending on an error
            obj._finish(60.0, goodbye="closed")

    return close_at_exit


def _wait_for_write(ckpt: tf.train.Checkpoint) -> None:
    """Wait until TF's async thread has finished the write it was given.

    ``checkpoint.sync()`` (``queue.join()``) never returns once TF's own atexit hook
    has run: it ends the thread by queueing ``False``, which is never marked done.
    So wait for the queue to drain *or* the thread to end, whichever comes first.
    """
    helper = getattr(ckpt, "_async_checkpointer_impl", None)
    q = getattr(helper, "_queue", None)
    thread = getattr(helper, "_async_save_thread", None)
    if q is None or thread is None or not hasattr(q, "all_tasks_done"):
        ckpt.sync()
        return
    with q.all_tasks_done:
        while q.unfinished_tasks and thread.is_alive():
            q.all_tasks_done.wait(0.1)


def _clear_async_error(ckpt: tf.train.Checkpoint) -> BaseException | None:
    """Take the error TF's async thread stored, so it is reported once by us instead of
    being raised into the next save (or at interpreter exit)."""
    helper = getattr(ckpt, "_async_checkpointer_impl", None)
    err = getattr(helper, "_async_error", None)
    if err is not None:
        helper._async_error = None
    return err


def _number_of(path: str) -> int:
    tail = path.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _state_bytes(ckpt: tf.train.Checkpoint) -> int:
    total = 0
    seen: set[int] = set()
    for obj in tf.train.TrackableView(ckpt).descendants():
        shape, dtype = getattr(obj, "shape", None), getattr(obj, "dtype", None)
        if shape is None or dtype is None or not hasattr(obj, "assign") or id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            total += int(tf.TensorShape(shape).num_elements() or 0) * tf.as_dtype(dtype).size
        except (TypeError, ValueError):
            continue
    return total


def _name_of(policy: Policy) -> str:
    return type(policy).__name__


def _spec_of(policy: str | Policy | None) -> str | None:
    """The spec to send in Hello: the string as given, or None for a policy object
    (the daemon cannot run an object it does not have; the hook runs it locally)."""
    if policy is None:
        return None
    if isinstance(policy, str):
        return policy
    return None


def _describe(schedule: SaveSchedule) -> str:
    d = schedule.decision
    due = schedule.next_due()
    if d is None:
        return "no save planned"
    where = f"next save at step {due.step}" if due else "no save planned"
    every = f", then every {d.every_steps}" if d.every_steps else ""
    return f"{where}{every} ({d.policy or '?'}: {d.reason})"


#: The constructor's options, for the did-you-mean of a misspelt one.
_OPTIONS = tuple(
    p.name
    for p in inspect.signature(AdaptiveCheckpointer.__init__).parameters.values()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
)

__all__ = ["AdaptiveCheckpointer", "PolicyError"]
