"""The rank side of a multi-worker job's agreement, on a key-value store.

Every rank runs one :class:`Agreement`: a watcher thread that waits for each round's
proposal, acknowledges it and waits for its decision, and a few calls the training
thread makes at step boundaries (never per step). The rules are
:mod:`adaptd.core.agreement`'s; the store is TensorFlow's coordination service
(:class:`adaptd.client.agreement.coordination.Coordination`), whose first-writer-wins keys and
blocking gets with timeouts are all it needs.

The keys are :mod:`adaptd.client.agreement.kv`'s; the watcher thread's part of each round is
:class:`~adaptd.client.agreement.watcher.RoundWatcher`.

**Holding at a step.** A rank must not pass the step it acknowledged until the round
is decided. The training thread checks one integer per step (``step >= due``); the
watcher, on acknowledging, lowers the step it holds at (:attr:`Agreement.gate`) and
calls ``wake()`` (which makes the next step take the slow path) while holding
:attr:`Agreement.lock`, and only then reads the rank's step to answer. The hook
computes its ``due`` from :meth:`Agreement.bound` under the same lock, so a
lowering is never lost; a rank whose step had already reached the proposal's step
answers ``ok=False``. At a boundary at or past the gate the training thread waits
(bounded) for the decision: it never guesses.

Threads: the watcher does all the waiting on the store; the training thread writes
its own proposals (one ``put``, about half a millisecond) and, only when it reaches
an undecided step, waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from adaptd.client.agreement.coordination import CoordinationError
from adaptd.client.agreement.kv import TICK, Keys, Store, next_session
from adaptd.client.agreement.ledger import Applied, Ledger, Recorded, Round
from adaptd.client.agreement.mailbox import Mailbox
from adaptd.client.agreement.ranks import Identity
from adaptd.client.agreement.watcher import RoundWatcher
from adaptd.client.checks import check_seconds, check_seconds_or_zero
from adaptd.client.save.schedule import NEVER, SaveSchedule
from adaptd.core import agreement as rules
from adaptd.core.snapshot import Decision, same_saves
from adaptd.protocol import job as p

log = logging.getLogger("adaptd.client")

#: The chief reads the other ranks' mail at most this often, after a wait without a
#: proposal (at its tick, about once a second; on the watcher thread, once its listener
#: heard a ring: one get per doorbell, and the mail of the groups that rang, a bounded
#: share per call: :mod:`adaptd.client.agreement.mailbox`).
MAIL_S = 0.1
#: A proposer tries at most this many keys past the watcher's for its round (each one a
#: tick took): about a second each, so a proposer far behind gives up the round.
MAX_TICKS_BEHIND = 64


@dataclass(frozen=True)
class AgreementOptions:
    """The agreement's bounds.

    Attributes:
        timeout_s: bound on waiting for acknowledgements; a rank waits twice that for a
            decision before it aborts the round itself.
        slice_s: the watcher's longest single wait in a round (how soon close() is
            noticed; between rounds within a tick and a slice).
        lead_time_s: how far ahead, in wall time, a rank proposes (see
            :func:`adaptd.core.agreement.lead_steps`).

    Raises ValueError naming a bound that is not a number of seconds (> 0; the lead
    >= 0).
    """

    timeout_s: float = 30.0
    slice_s: float = 0.5
    lead_time_s: float = rules.LEAD_TIME_S

    def __post_init__(self) -> None:
        check_seconds("timeout_s", self.timeout_s)
        check_seconds("slice_s", self.slice_s)
        check_seconds_or_zero("lead_time_s", self.lead_time_s)


class Agreement(Recorded):
    """This rank's part of the job's agreement.

    Args:
        store: the key-value store all ranks share.
        who: this rank (its host is named in messages).
        position: returns this rank's newest completed step (read by the watcher).
        wake: makes the training thread take the slow path at its next step; called
            with :attr:`lock` held.
        session: the session number (default :func:`next_session`).
        options: the bounds on its waits and its lead.
    """

    def __init__(
        self,
        store: Store,
        who: Identity,
        *,
        position: Callable[[], int],
        wake: Callable[[], None],
        session: int | None = None,
        options: AgreementOptions = AgreementOptions(),
    ) -> None:
        self.store = store
        self.who = who
        self.job, self.rank, self.world_size = who.job, who.rank, who.world_size
        self.session = next_session(self.job) if session is None else session
        self.keys = Keys.of(self.job, self.session)
        self._position = position
        self._wake = wake
        self._timeout_s = float(options.timeout_s)
        self._slice_s = float(options.slice_s)
        self._lead_time_s = float(options.lead_time_s)

        #: Guards everything below that both threads touch.
        self.lock = threading.Lock()
        self._decided = threading.Condition(self.lock)
        #: The step this rank holds at until the current round is decided (set when
        #: it acknowledged the round's proposal).
        self.gate = NEVER
        # Where our own proposal holds us: (round, step); void once that round is over
        # (a proposal written too late for its round is never decided).
        self._hold: tuple[int, int] | None = None
        self._round = 0  # the round the watcher is in (or waits for)
        #: Decided rounds and committed changes waiting for their step.
        self.ledger = Ledger()
        self._mine: int | None = None  # the round of our own undecided proposal
        self._mine_key: tuple[int, str] | None = None  # (round, key) of our last proposal
        self._attempts = 0
        self._last_abort: p.Decide | None = None
        self._wish_plan: tuple[Decision, str, str, float] | None = None
        self._wish_save: tuple[str, int, bool] | None = None  # reason, since step, stop
        #: Why the agreement stopped working ("" while it works).
        self.broken = ""
        #: Times the training thread waited at an undecided step, and for how long.
        self.stalls = 0
        self.stall_s = 0.0
        #: The other ranks' messages to the chief (read by the chief's watcher).
        self.mailbox = Mailbox(store, self.keys, rank=self.rank, world_size=self.world_size)
        self._mail_at = 0.0
        self._reads_mail = who.chief and self.world_size > 1
        #: Plans committed since the training thread last took them (:meth:`take_plans`).
        self._committed_plans: deque[p.Propose] = deque()

        self._watcher = RoundWatcher(
            self,
            store,
            self.keys,
            rank=self.rank,
            world_size=self.world_size,
            timeout_s=self._timeout_s,
            slice_s=self._slice_s,
            between=self._read_mail if self._reads_mail else None,
        )
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Start the watcher thread (once), and the chief's mail listener."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watcher.run, name=f"adaptd-agreement-{self.rank}", daemon=True
            )
            self._thread.start()
            if self._reads_mail:
                self.mailbox.start_listening()
            elif self.world_size > 1:
                self.mailbox.open()  # its count, before any mail: the chief reads it

    def ending(self) -> None:
        """This rank's training loop is over: the watcher stops (within a slice, between
        rounds a tick and a slice, without waiting for it here) and no round is proposed
        or answered any more. From then on the store failing is the other ranks ending
        too (the chief's process, which holds the coordination service, exits while this
        rank still writes its last save), logged, never :attr:`broken`."""
        self._watcher.stop()
        if self._reads_mail:
            self.mailbox.stop_listening(timeout_s=0.0)  # rung to end its wait; not awaited

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the watcher (:meth:`ending`); waits for it at most ``timeout_s`` (default:
        two slices)."""
        self.ending()
        thread = self._thread
        if thread is not None:
            thread.join(2 * self._slice_s + 1.0 if timeout_s is None else timeout_s)
        if self._reads_mail:
            self.mailbox.stop_listening()
        with self.lock:
            self.gate = NEVER
            self._hold = None
            self._decided.notify_all()

    # ------------------------------------------------------------------ training thread

    def bound(self, due: int) -> int:
        """The step the training thread may run to before its next slow path: ``due``,
        lowered to the gate and to the next committed change. Call with :attr:`lock`
        held, and store the result while still holding it."""
        return min(due, self._limit(), self.ledger.next_step())

    def _limit(self) -> int:
        """The step not to pass before the current round is decided (lock held)."""
        hold = self._hold
        if hold is not None and hold[0] == self._round:
            return min(self.gate, hold[1])
        return self.gate

    def want_plan(
        self, decision: Decision, *, source: str = "", decided_by: str = "", tolerance: float = 0.0
    ) -> None:
        """(The deciding rank.) The job should follow ``decision``; proposed at the next
        boundary unless it saves at the same steps as the agreed plan (within
        ``tolerance`` of its interval: :func:`~adaptd.core.snapshot.same_saves`)."""
        with self.lock:
            self._wish_plan = (decision, source, decided_by, tolerance)
            self._wake()

    @property
    def plan_wanted(self) -> bool:
        """A plan :meth:`want_plan` asked for is not settled yet (neither committed nor
        found to save at the agreed plan's steps)."""
        with self.lock:
            return self._wish_plan is not None

    def want_save(self, reason: str, step: int, *, stop: bool = False) -> None:
        """The job should save soon (and stop after it, with ``stop``): an operator's
        save-now, a GPU health event, SIGTERM. Proposed at the next boundary."""
        with self.lock:
            old = self._wish_save
            if old is None or (stop and not old[2]):
                self._wish_save = (reason, step, stop)
            self._wake()

    def boundary(self, step: int, schedule: SaveSchedule, step_time_s: float | None) -> bool:
        """At a slow-path boundary: wait (bounded) if ``step`` reached an undecided
        round's step, apply the committed changes due by ``step`` to ``schedule``, and
        propose what this rank wants. Returns True when a committed stop applies at
        this step (save, then stop)."""
        self._settle(step)
        stop = self.ledger.apply_due(step, schedule, self.lock)
        self._propose(step, step_time_s)
        return stop

    def stop_committed(self) -> bool:
        """A stop the ranks committed to and this rank has not reached yet."""
        with self.lock:
            return self.ledger.stop_pending()

    def take_plans(self) -> list[p.Propose]:
        """The plan rounds committed since the last call, oldest first (for this host's
        daemon, which shows the job's plan)."""
        out = []
        while self._committed_plans:
            out.append(self._committed_plans.popleft())
        return out

    @property
    def round(self) -> int:
        """The round the watcher is in (or waits for)."""
        return self._round

    @property
    def agreed_plan(self) -> Decision | None:
        """The job's plan after every committed plan round (applied or not yet)."""
        return self.ledger.agreed_plan

    # ------------------------------------------------------------------ internals: training

    def _settle(self, step: int) -> None:
        with self.lock:
            if step < self._limit():
                return
            t0 = time.monotonic()
            deadline = t0 + 2 * self._timeout_s + 2 * self._slice_s
            while step >= self._limit() and not self.broken:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._decided.wait(left)
            waited = time.monotonic() - t0
            self.stalls += 1
            self.stall_s += waited
            stuck = step >= self._limit() and not self.broken
            k = self._round
        if stuck:  # the watcher did not settle it: end the round ourselves
            mine = self._mine_key
            self._watcher.force_abort(
                k,
                f"rank {self.rank} waited {waited:.1f}s at step {step}",
                key=mine[1] if mine is not None and mine[0] == k else None,
            )
            with self.lock:
                end = time.monotonic() + 2 * self._slice_s + 1.0
                while step >= self._limit() and not self.broken and time.monotonic() < end:
                    self._decided.wait(max(0.0, end - time.monotonic()))
                if step >= self._limit():
                    self.broken = self.broken or (
                        f"round {k} was not decided within {waited:.1f}s; "
                        "agreement stopped (the job's plan stays as it is)"
                    )
                    self.gate = NEVER
                    self._hold = None

    def _propose(self, step: int, step_time_s: float | None) -> None:
        with self.lock:
            if self._mine is not None or self.broken or self._watcher.stopping:
                return
            proposal = None
            k = self._round
            lead = rules.lead_steps(step_time_s, self._lead_time_s)
            at = rules.retry_step(step, lead, self._last_abort, self._attempts)
            if self._wish_save is not None:
                reason, _, stop = self._wish_save
                proposal = rules.save_proposal(self.job, k, at, self.rank, reason, stop=stop)
            elif self._wish_plan is not None:
                decision, source, by, tolerance = self._wish_plan
                # never before a committed plan still waiting for its step: plans
                # apply in round order at one boundary, so the newer one wins
                at = max(at, self.ledger.plan_floor())
                if same_saves(self.ledger.agreed_plan, decision, at - 1, tolerance):
                    self._wish_plan = None
                else:
                    proposal = rules.plan_proposal(
                        self.job, k, at, self.rank, decision, decided_by=by, source=source
                    )
            if proposal is None:
                return
            # hold at the step ourselves, so our own acknowledgement cannot come late
            self._hold = (k, at)
            self._mine = k
        try:
            won, key = self._put_proposal(k, p.encode_json(proposal))
        except CoordinationError as exc:
            self.stop_with(f"proposing failed: {exc}")
            return
        if won:
            self._mine_key = (k, key)
        if not won:
            with self.lock:  # another rank's proposal is round k: ours waits for a later one
                if self._mine == k:
                    self._mine = None
                    self._hold = None
        else:
            # (If round k ended before this put landed, e.g. the training thread was
            # descheduled, the key is a leftover of a finished round that nobody reads;
            # the watcher already cleared _mine and the hold when it recorded round k.)
            log.debug("rank %d proposed round %d: %s at step %d", self.rank, k, proposal.action, at)

    def _put_proposal(self, k: int, value: str) -> tuple[bool, str]:
        """Write round ``k``'s proposal at the key the ranks wait on now: the watcher's,
        or a later one where a tick took it (:mod:`~adaptd.client.agreement.watcher`,
        *Ticks*). Whether it won the round, and the key it was written at."""
        t = self._watcher.tick_of(k)
        for _ in range(MAX_TICKS_BEHIND):
            key = self.keys.proposal(k, t)
            if self.store.put(key, value):
                return True, key
            if self.store.get(key, self._slice_s) != TICK:
                return False, key  # another rank's proposal is round k
            t += 1
        return False, key

    def stop_with(self, why: str) -> None:
        """The agreement cannot go on (the store is gone, or a bug): release every hold.
        After :meth:`ending` it is the job ending, not a break: logged, not :attr:`broken`."""
        with self.lock:
            if self._watcher.stopping:
                log.info("adaptd agreement of job %s ended with the loop: %s", self.job, why)
            elif not self.broken:
                self.broken = why
                log.error("adaptd agreement of job %s stopped: %s", self.job, why)
            self.gate = NEVER
            self._hold = None
            self._decided.notify_all()

    # ------------------------------------------------------------------ internals: watcher

    def acknowledge(self, proposal: p.Propose) -> p.Ack:
        """(Watcher thread.) This rank's answer to ``proposal``; holds at its step if yes."""
        # Lower the gate and wake the training thread *before* reading its step: if
        # the step read is below at_step, the training thread's next check sees the
        # gate (see the module docstring).
        with self.lock:
            self.gate = proposal.at_step
            self._wake()
            ack = rules.acknowledge(proposal, self.rank, self._position())
            if not ack.ok:
                self.gate = NEVER
            return ack

    def record(self, k: int, proposal: p.Propose | None, decision: p.Decide | None) -> None:
        """(Watcher thread.) Round ``k`` ended: note it, release the gate, wake the
        training thread."""
        with self.lock:
            commit = proposal is not None and self.ledger.record(k, proposal, decision)
            if commit:
                assert proposal is not None
                self._settle_wishes(proposal)
                if proposal.action == "plan":
                    self._committed_plans.append(proposal)
            if self._mine == k:
                self._mine = None
                if proposal is None or proposal.proposer != self.rank:
                    pass  # the round went to another rank's proposal: ours is still due
                elif commit:
                    self._attempts, self._last_abort = 0, None
                else:
                    self._attempts += 1
                    self._last_abort = decision
            self._round = k + 1
            self.gate = NEVER
            if self._hold is not None and self._hold[0] <= k:
                self._hold = None
            self._wake()
            self._decided.notify_all()
        if proposal is not None:
            log.info(
                "job %s round %d %s: %s at step %d (rank %d)%s",
                self.job,
                k,
                "committed" if commit else "aborted",
                proposal.action,
                proposal.at_step,
                proposal.proposer,
                "" if commit or decision is None else f": {decision.reason}",
            )

    def _read_mail(self) -> bool:
        """(The chief's watcher thread, between rounds.) Read the other ranks' mail;
        True when some is left for the next call (the watcher then looks for a
        proposal only briefly before it reads on)."""
        now = time.monotonic()
        if now >= self._mail_at or self.mailbox.behind:
            self._mail_at = now + MAIL_S
            self.mailbox.collect()
        return self.mailbox.behind

    def _settle_wishes(self, committed: p.Propose) -> None:
        wish = self._wish_save
        if wish is not None:
            _, since, stop = wish
            if rules.satisfies(committed, "stop" if stop else "save", since):
                self._wish_save = None
        if self._wish_plan is not None and committed.action == "plan":
            decision, _, _, tolerance = self._wish_plan
            if same_saves(self.ledger.agreed_plan, decision, committed.at_step - 1, tolerance):
                self._wish_plan = None


__all__ = ["Agreement", "AgreementOptions", "Applied", "Keys", "Round", "Store", "next_session"]
