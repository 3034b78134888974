"""The hook's session with its daemon, and the embedded policy while there is none.

:class:`DaemonSession` says hello, reads the daemon's messages at each poll, judges
whether the daemon is alive, sends the batched step reports and the save reports, and
while the daemon is away runs the embedded policy every ``decide_interval``. What it
hears of plans goes to the rank's :class:`~adaptd.client.agreement.authority.Authority`, which
decides what the schedule becomes (at once for a job of one rank, after agreement for
a job of several).

Everything here runs on the training thread, at its slow-path boundaries.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from adaptd.client.agreement.authority import Authority
from adaptd.client.agreement.ranks import Identity
from adaptd.client.daemon.link import DaemonLink
from adaptd.client.daemon.policy import PolicyChoice
from adaptd.client.save.costs import StepClock
from adaptd.client.save.schedule import SaveSchedule
from adaptd.core.estimators import JobTracker
from adaptd.core.policy import PolicyError, parse
from adaptd.core.snapshot import Snapshot
from adaptd.protocol import job as protocol

log = logging.getLogger("adaptd.client")

#: At most this long (or ``daemon_timeout``, if shorter) ``restore_or_initialize()``
#: waits for a daemon whose socket is there to answer: a live one does in milliseconds.
WELCOME_WAIT_S = 1.0
#: A Hello the daemon has not answered is sent again this often (the first one may be
#: refused while the connection is still being made, or the daemon may be restarting).
HELLO_RETRY_S = 1.0


@dataclass(frozen=True)
class HelloFacts:
    """What the Hello says about the run, known once it started."""

    state_bytes: int
    resumed_from: int
    gpus: int
    restore_fallback: str
    #: Two tiers: the local tier's kind ("memory", "disk"; "" none), the tier the run
    #: restored from ("local", "" durable or fresh), and whether it found a copy of
    #: the previous run in its local tier (a restart in place).
    local_tier: str = ""
    resumed_tier: str = ""
    local_intact: bool = False


class DaemonSession:
    """One rank's conversation with its host's daemon.

    Args:
        link: the socket to the daemon.
        schedule: the rank's save schedule (read for reports and the mode).
        authority: where plans go.
        who: this rank (and its host, for the Hello).
        directory: the checkpoint directory (for the Hello; None: not told).
        policy: the policy the job was given: the spec the Hello asks for, the embedded
            policy, whether the daemon's plans are ignored
            (:class:`~adaptd.client.daemon.policy.PolicyChoice`).
        report_s, decide_s: seconds between step reports and between embedded decisions.
    """

    def __init__(
        self,
        link: DaemonLink,
        schedule: SaveSchedule,
        authority: Authority,
        who: Identity,
        directory: Path | None,
        policy: PolicyChoice,
        *,
        report_s: float,
        decide_s: float,
        memory_budget: Callable[[int | None], None] | None = None,
    ) -> None:
        self.link = link
        #: Told each plan's ``memory_budget`` (the job's memory tier, if any).
        self.memory_budget = memory_budget
        self.schedule = schedule
        self.authority = authority
        self.who = who
        self.job, self.rank, self.world_size = who.job, who.rank, who.world_size
        self.directory = directory
        self.policy_spec = policy.spec
        #: The embedded policy in force (an operator's set-policy may replace it).
        self.policy = policy.policy
        self.policy_label = policy.label
        self.local_only = policy.local_only
        self._report_s = report_s
        self._decide_s = decide_s
        self.daemon_mode = False
        self._facts = HelloFacts(0, 0, 0, "")
        self._hello_sent = False
        self._hello_unanswered = False  # a Hello went out; the next Welcome answers it
        self._warned = False
        self._fell_back = False
        self._error_codes: set[str] = set()
        self._report_at = self._decide_at = self._hello_at = self._deadline_at = 0.0
        #: The embedded policy took over or was replaced since its last decision.
        self._policy_news = True
        #: A peer failed (or the job was aborted as stalled): the ranks agree no more.
        self._peers_lost = False
        self._tracker: JobTracker | None = None
        self._clock: StepClock | None = None
        #: The newest plan the job's ranks agreed on, as told to this daemon (told
        #: again when the daemon welcomes us: it may have restarted).
        self.job_plan: protocol.JobPlan | None = None
        #: Requests relayed from other hosts that went to this daemon within the time
        #: its death could go unnoticed (:meth:`_unconfirmed_window`): redone by the
        #: embedded policy if it turns out dead, sent again if it restarted.
        self._relayed: list[tuple[float, protocol.Request]] = []

    @property
    def endpoint(self) -> str:
        return self.link.endpoint

    def start(
        self,
        facts: HelloFacts,
        tracker: JobTracker,
        clock: StepClock,
        now: float,
    ) -> None:
        """Say hello and begin the timers."""
        self._facts, self._tracker, self._clock = facts, tracker, clock
        self._hello_sent = self.send_hello(now)
        self._deadline_at = now + self.link.timeout_s
        self._report_at = now + self._report_s

    def send_hello(self, now: float) -> bool:
        """Say hello; False when the send was refused (no connection yet)."""
        facts = self._facts
        hello = protocol.Hello(
            v=protocol.VERSION,
            job=self.job,
            rank=self.rank,
            world_size=self.world_size,
            pid=os.getpid(),
            checkpoint_dir=str(self.directory.resolve())[: protocol.MAX_TEXT]
            if self.directory is not None
            else "",
            state_bytes=facts.state_bytes,
            resumed_from=facts.resumed_from,
            gpus=facts.gpus,
            policy=self.policy_spec or "",
            hostname=self.who.host[: protocol.MAX_TEXT],
            restore_fallback=facts.restore_fallback[: protocol.MAX_TEXT],
            agreement=self.authority.kind,  # type: ignore[arg-type]
            local_tier=facts.local_tier,  # type: ignore[arg-type]
            resumed_tier=facts.resumed_tier,  # type: ignore[arg-type]
            local_intact=facts.local_intact,
        )
        sent = self.link.send(hello, now)
        self._hello_at = now + HELLO_RETRY_S
        self._hello_unanswered = self._hello_unanswered or sent
        return sent

    def await_welcome(self, n: int, after: Callable[[], None]) -> None:
        """Wait briefly for a daemon that is there to answer the Hello with its plan,
        so that training starts under it (and the mode says so) instead of under the
        embedded policy until the first poll; ``after`` runs after each message. No
        socket file: no wait."""
        endpoint = self.endpoint
        if endpoint.startswith("ipc://") and not os.path.exists(endpoint[len("ipc://") :]):
            return
        link = self.link
        start = perf_counter()
        deadline = start + min(link.timeout_s, WELCOME_WAIT_S)
        retry_at = start + 0.02
        while not self._settled():
            now = perf_counter()
            if now >= deadline:
                return
            until = deadline if self._hello_sent else min(deadline, retry_at)
            if link.poll(until - now):
                now = perf_counter()
                for msg in link.receive(now):
                    self.on_message(msg, n, now)
                after()
            elif not self._hello_sent and perf_counter() >= retry_at:
                # the first Hello is refused while the connection is still being made
                self._hello_sent = self.send_hello(perf_counter())
                retry_at = perf_counter() + 0.02

    def _settled(self) -> bool:
        if self.schedule.source == "daemon":
            return True
        if self.local_only or self.authority.kind != "none":
            # no daemon plan to wait for here (the object policy's, or the job's
            # agreed one): the Welcome is enough
            return self.link.welcomed
        return False

    def pump(self, seconds: float, n: int) -> None:
        """Wait up to ``seconds`` for the daemon's messages and handle them (a rank held
        at a step until its daemon decides a round)."""
        if self.link.poll(seconds):
            now = perf_counter()
            for msg in self.link.receive(now):
                self.on_message(msg, n, now)

    def counters(self) -> dict[str, int]:
        """Messages sent, dropped (no daemon) and bad frames received."""
        link = self.link
        return {"sent": link.sent, "dropped": link.dropped, "bad_frames": link.bad_frames}

    def tick(self, n: int, now: float, in_flight: bool, slowest: tuple[float, int]) -> bool:
        """A poll: messages, liveness, the step report when due. Returns True when the
        step report was sent (``slowest`` was consumed)."""
        link = self.link
        for msg in link.receive(now):
            self.on_message(msg, n, now)
        for out in self.authority.outbox():
            self.forward(out, n, now)
        if self.daemon_mode and not link.alive(now):
            self._lost(now, f"no message for {link.timeout_s:g}s", n)
        elif not link.welcomed:
            if now >= self._hello_at:
                self.send_hello(now)
            if not self._warned and now >= self._deadline_at:
                self._lost(now, f"no answer within {link.timeout_s:g}s", n)
        if now >= self._report_at:
            self._report_at = now + self._report_s
            self.report_steps(n, now, in_flight, slowest)
            return True
        return False

    def report_steps(self, n: int, now: float, in_flight: bool, slowest: tuple[float, int]) -> None:
        """Close the step batch at ``n``: into the embedded tracker and to the daemon;
        ``slowest``: the slowest ``step()`` call since the last report and its steps."""
        assert self._clock is not None and self._tracker is not None
        batch = self._clock.batch(n, now, slowest[0], slowest[1])
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
        self.link.send(
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

    def peers_lost(self) -> None:
        """A peer failed: from now on nothing goes to the job's chief through the
        agreement (a SIGSTOPped chief's coordination service would hold the post for
        good, and with it the just-in-time save); the daemon still hears everything."""
        self._peers_lost = True

    def saved(self, report: protocol.SaveReport, now: float) -> None:
        """A save's report: to the daemon (and its cost to the job's chief, while the
        ranks still agree); the embedded policy re-decides after it."""
        self.link.send(report, now)
        if self._peers_lost:
            return
        self.authority.save_cost(
            protocol.SaveCost(
                v=protocol.VERSION,
                job=report.job,
                rank=report.rank,
                step=report.step,
                blocking_s=report.blocking_s,
                extra_step_s=report.extra_step_s,
                ok=report.ok,
            )
        )
        self._decide_at = 0.0

    def save_started(self, step: int, blocking_s: float, *, ok: bool = True) -> None:
        """The save of ``step`` was started and blocked the loop ``blocking_s`` (the
        wait for the previous write included): the job's chief hears it at once, not
        only with the report, which comes after the write, often after the chief's
        next save, too late to count toward this one (a slow rank's write outlasts
        the interval)."""
        cost = protocol.SaveCost(
            v=protocol.VERSION, job=self.job, rank=self.rank, step=step, blocking_s=blocking_s,
            ok=ok,
        )  # fmt: skip
        self.authority.save_cost(cost)

    def forward(self, msg: protocol.ClientMessage, n: int, now: float) -> None:
        """A message the authority has for this daemon on the job's behalf (see
        :meth:`~adaptd.client.agreement.agreed.Coordinated.outbox`). A request relayed from
        another host while this daemon is away is done by the embedded policy where
        it can be (:meth:`embedded_request`)."""
        if isinstance(msg, protocol.JobPlan):
            self.job_plan = msg
        elif isinstance(msg, protocol.Request):
            if not self.daemon_mode:
                self.embedded_request(msg, n)
                return
            window = self._unconfirmed_window()
            self._relayed = [(t, r) for t, r in self._relayed if now - t < window]
            self._relayed.append((now, msg))
        self.link.send(msg, now)

    def _unconfirmed_window(self) -> float:
        """How long a dead daemon can still look alive to this rank (see
        :mod:`adaptd.client.daemon.link`): a request relayed to it within that time may have
        died with it. The daemon does not acknowledge requests, so each is kept that
        long; a request it did take may then be done twice (a second save, the same
        policy again): at least once, never lost."""
        return self.link.timeout_s + protocol.KEEPALIVE_S + self._report_s

    def embedded_request(self, msg: protocol.Request, n: int) -> None:
        """An operator's request from host ``msg.origin`` while this daemon is away:
        save-now is one agreed save; set-policy replaces the embedded policy (the
        daemon, once back, plans by its own settings); pause and resume hold a
        daemon's plans and are not done (logged, with what to do)."""
        why = ""
        if msg.op == "save_now":
            self.authority.save_now(msg.reason or "save-now", None, n)
        elif msg.op == "set_policy" and self.local_only:
            why = "the job's policy is an object given to the hook, not a spec"
        elif msg.op == "set_policy":
            try:
                self.policy = parse(msg.spec)
            except PolicyError as exc:
                why = f"policy spec {msg.spec!r}: {exc}"
            else:
                self.policy_label = msg.spec
                self._decide_at = 0.0
                self._policy_news = True
        else:
            why = (
                "the embedded policy has no daemon plans to hold; type it again once the "
                "daemon is back"
            )
        if why:
            log.warning("operator request %s from host %s not done (no daemon at %s): %s",
                        msg.op, msg.origin, self.endpoint, why)  # fmt: skip
        else:
            log.info("operator request %s from host %s done by the embedded policy "
                     "(no daemon at %s)", msg.op, msg.origin, self.endpoint)  # fmt: skip

    def goodbye(self, n: int, reason: str, now: float) -> None:
        self.link.send(
            protocol.Goodbye(
                v=protocol.VERSION, job=self.job, rank=self.rank, step=n, reason=reason
            ),
            now,
        )

    def on_message(self, msg: protocol.DaemonMessage, n: int, now: float) -> None:
        if isinstance(msg, protocol.Welcome):
            # The answer to a Hello (a restarted daemon knows no plan of the job), not
            # the daemon's keep-alive Welcome: re-sending the plan on every Welcome
            # would be answered by another Welcome, and so on.
            if self._hello_unanswered and self.job_plan is not None:
                self.link.send(self.job_plan, now)
            if self._hello_unanswered:  # a restarted daemon refused what it got before
                for _, request in self._relayed:
                    self.link.send(request, now)
            self._hello_unanswered = False
            if not self.daemon_mode:
                self.daemon_mode = True
                if self._fell_back:
                    log.info("adaptd daemon at %s is back: its plan is in force", self.endpoint)
        elif isinstance(msg, protocol.Plan):
            if msg.job != self.job or not self.link.welcomed:
                return
            if self.memory_budget is not None:  # this host's, whoever plans the saves
                self.memory_budget(msg.memory_budget)
            if self.local_only:
                return
            self.daemon_mode = True
            self.authority.daemon_plan(msg, n)
        elif isinstance(msg, protocol.SaveNow):
            if msg.job == self.job:
                log.info("daemon asks for a save now: %s", msg.reason)
                self.authority.save_now(msg.reason or "save-now", msg.at_step, n)
        elif isinstance(msg, protocol.Error):
            if msg.code == "unknown_peer":
                # The daemon is there (it answered) but restarted and lost us: say
                # hello again; its Welcome and Plan follow. Its current plan stays.
                log.info("the daemon does not know this job (restarted?): saying hello again")
                self.send_hello(now)
            elif msg.code not in self._error_codes:
                self._error_codes.add(msg.code)
                log.warning("the daemon refused a message (%s): %s", msg.code, msg.message)
        elif isinstance(msg, protocol.JobConfig):
            pass  # a late answer to the hook's question: the run keeps the tier it began with
        else:  # the agreement's records (Propose, Decide, Relay)
            self.authority.message(msg, n, now)

    def _lost(self, now: float, why: str, n: int) -> None:
        self.daemon_mode = False
        self._fell_back = True
        self.link.forget()
        self.schedule.daemon_lost()
        relayed, self._relayed = self._relayed, []
        for _, request in relayed:  # they may have died with the daemon
            self.embedded_request(request, n)
        text = (
            f"adaptd: no daemon at {self.endpoint} ({why}); deciding in-process with "
            f"policy {self.policy_label!r} until it answers"
        )
        if not self._warned:
            self._warned = True
            log.warning("%s", text)
            warnings.warn(text, RuntimeWarning, stacklevel=6)
        else:
            log.warning("%s", text)
        self._decide_at = 0.0  # re-decide in-process at this boundary
        self._policy_news = True

    def decide_due(self, now: float) -> bool:
        """True when the embedded policy should decide now (its plan is in force)."""
        return (self.local_only or not self.daemon_mode) and now >= self._decide_at

    def decide(self, n: int, now: float, in_flight: bool) -> None:
        """Run the embedded policy and hand its decision to the authority."""
        assert self._tracker is not None
        self._decide_at = now + self._decide_s
        state = self._tracker.state(
            step=n,
            time=now,
            save_in_flight=in_flight,
            last_save_step=self.schedule.last_saved_step,
        )
        try:
            decision = self.policy.decide(Snapshot(time=now), state)
        except Exception as exc:  # a broken plugin must not stop training
            log.error("policy %s failed: %s", self.policy_label, exc)
            return
        self.authority.embedded_plan(decision, n, new_policy=self._policy_news)
        self._policy_news = False


__all__ = ["WELCOME_WAIT_S", "DaemonSession", "HelloFacts"]
