"""Which policy each job runs: chosen at its hello, changed by an operator.

:class:`PolicyChoice` gives a job its policy when a run first says hello (the
operator's setting, else the spec the job asked for, else the daemon's default), and
changes it on ``set-policy`` and ``set-policy --clear``. It only records the choice on
the job; the caller has the job decided afresh
(:meth:`~adaptd.daemon.jobs.planner.Planner.replan`) so the new plan is pushed at once.
"""

from __future__ import annotations

import logging

from adaptd.core.policy import Policy, PolicyCache, PolicyError
from adaptd.daemon.jobs.settings import OperatorSettings
from adaptd.daemon.jobs.table import HelloKind, Job
from adaptd.logfmt import logfmt

__all__ = ["PolicyChoice"]

log = logging.getLogger("adaptd.server")


class PolicyChoice:
    """The daemon's policies for its jobs. ``default_policy`` (the spec of jobs that name
    none) is parsed here: raises :class:`~adaptd.core.policy.PolicyError` when it does not."""

    def __init__(
        self, *, default_policy: str, policies: PolicyCache, settings: OperatorSettings
    ) -> None:
        self.default_policy = default_policy
        self._default = policies.get(default_policy)  # parsed once
        self.policies = policies
        self.settings = settings

    def at_hello(self, job: Job, asked: str, rank: int, kind: HelloKind) -> str | None:
        """A rank said hello, asking for policy ``asked`` ("": none): a job new to the
        registry takes the config's settings for it first (only then: what an operator
        changes later is not undone by another rank's hello). Returns why the asked
        spec was refused (the rank is told), else ``None``."""
        if kind == "new":
            self.settings.new_job(job.id)
        return self.choose(job, asked, rank)

    def choose(self, job: Job, asked: str, rank: int) -> str | None:
        """Give a job its policy at hello, if it has none yet: the operator's setting,
        else the spec the rank ``asked`` for, else the daemon's default. Returns why
        the asked spec was refused (the rank is told), else ``None``."""
        job.asks_for(asked)
        configured = self.settings.policy(job.id)
        if job.policy is None and configured is not None:
            job.use_policy(self.policies.get(configured), configured)  # parsed when set
        if job.policy is None:
            spec = asked or self.default_policy
            try:
                job.use_policy(self.policies.get(spec), spec)
            except PolicyError as exc:
                job.use_policy(self._default, self.default_policy)
                return f"policy {asked!r} refused, using {self.default_policy!r}: {exc}"
        elif asked and asked != job.policy_spec:
            log.warning(
                logfmt("policy_ignored", job=job.id, rank=rank, asked=asked, using=job.policy_spec)
            )
        return None

    def check(self, spec: str) -> Policy:
        """The policy ``spec`` names; raises :class:`PolicyError` when it names none."""
        return self.policies.get(spec)

    def set(self, job: Job, spec: str, now: float) -> str:
        """An operator's new policy for ``job``, kept in its settings. Returns the spec it
        replaces; raises :class:`PolicyError`."""
        policy = self.policies.get(spec)
        previous = job.use_policy(policy, spec)
        self.settings.change(job.id, now, policy=spec)
        return previous

    def clear(self, job: Job, now: float) -> tuple[str | None, str, str, bool]:
        """Take back an operator's policy: the job gets the config's for it, else the
        spec its ranks asked for, else the daemon's default (as at a first hello).
        Returns ``(operator's spec taken back or None when none was set, spec now,
        where it comes from: "config", "job" or "default", whether anything changed)``."""
        before, configured = self.settings.clear_policy(job.id, now)
        cleared = before if before != configured else None
        spec, source, policy = self._unset_policy(job, configured)
        if cleared is None and spec == job.policy_spec:
            return None, spec, source, False  # nothing to take back
        job.use_policy(policy, spec)
        return cleared, spec, source, True

    def _unset_policy(self, job: Job, configured: str | None) -> tuple[str, str, Policy]:
        """The job's policy when no operator set one: ``(spec, source, policy)``."""
        for spec, source in ((configured, "config"), (job.asked_spec, "job")):
            if spec:
                try:
                    return spec, source, self.policies.get(spec)
                except PolicyError:
                    continue  # refused at hello already: the default took over then too
        return self.default_policy, "default", self._default
