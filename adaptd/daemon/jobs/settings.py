"""Each job's operator settings in the daemon: a policy override and a pause.

Three sources, in order of strength: what an operator set at run time
(``adaptd set-policy``, ``pause``, ``resume``; kept by the store across restarts and
handed back at start), then the config's ``[jobs."ID"]`` entries (exact ids at
start, globs when a matching job first says hello), then nothing (the job's own
policy or the daemon's default). :class:`OperatorSettings` holds the result; a
change emits :class:`~adaptd.events.JobSettingsChanged` so the store can keep it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from adaptd import events as ev
from adaptd.core.policy import PolicyCache, PolicyError
from adaptd.logfmt import logfmt
from adaptd.protocol.admin import JobSettings

__all__ = ["ConfiguredSettings", "OperatorSettings"]

log = logging.getLogger("adaptd.server")

#: The config's settings for a job id (``None``: the config sets nothing for it).
ConfiguredSettings = Callable[[str], JobSettings | None]


class OperatorSettings:
    """Job id -> :class:`~adaptd.protocol.admin.JobSettings`, for the jobs that have any.

    ``initial``: restored and exact-id configured settings. ``configured``: looked
    up when the registry meets a job for the first time (glob entries of the
    config). A policy that no longer parses (a plugin uninstalled since it was set)
    is dropped with a warning; the pause is kept.
    """

    def __init__(
        self,
        *,
        policies: PolicyCache,
        emit: Callable[[ev.Event], None],
        initial: Mapping[str, JobSettings] | None = None,
        configured: ConfiguredSettings | None = None,
    ) -> None:
        self.policies = policies
        self.emit = emit
        self.configured = configured
        self._settings: dict[str, JobSettings] = {}
        for job_id, setting in (initial or {}).items():
            self._adopt(job_id, setting)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._settings

    def __iter__(self) -> Iterator[str]:
        return iter(self._settings)

    def get(self, job_id: str) -> JobSettings | None:
        return self._settings.get(job_id)

    def as_mapping(self) -> Mapping[str, JobSettings]:
        """Every job's settings, read-only (a live view)."""
        return MappingProxyType(self._settings)

    def paused(self, job_id: str) -> bool:
        s = self._settings.get(job_id)
        return s is not None and s.paused

    def policy(self, job_id: str) -> str | None:
        """The policy spec an operator (or the config) set for the job, if any."""
        s = self._settings.get(job_id)
        return s.policy if s is not None else None

    def paused_jobs(self) -> list[str]:
        return sorted(k for k, v in self._settings.items() if v.paused)

    def new_job(self, job_id: str) -> None:
        """A job new to the registry said hello: take the config's settings for it.

        Only then: what an operator changes later (resume, a new policy) is not undone
        by the hello of another rank or a reconnect.
        """
        if self.configured is None or job_id in self._settings:
            return
        configured = self.configured(job_id)
        if configured is not None:
            self._adopt(job_id, configured)

    def change(self, job_id: str, now: float, **change: Any) -> JobSettings:
        """Set the job's ``policy`` and/or ``paused`` (the other kept); emits the job's
        whole setting as :class:`~adaptd.events.JobSettingsChanged`."""
        old = self._settings.get(job_id, JobSettings())
        new = JobSettings(
            policy=change.get("policy", old.policy), paused=change.get("paused", old.paused)
        )
        if new.policy is None and not new.paused:
            self._settings.pop(job_id, None)
        else:
            self._settings[job_id] = new
        self.emit(ev.JobSettingsChanged(now, job_id, new.policy, new.paused))
        return new

    def clear_policy(self, job_id: str, now: float) -> tuple[str | None, str | None]:
        """Take back the policy an operator set for ``job_id``: the config's for the job
        (if it names one) is in force again. Returns the policy setting ``(before,
        after)``; emits :class:`~adaptd.events.JobSettingsChanged` only when it changed."""
        before = self.policy(job_id)
        configured = self.configured(job_id) if self.configured is not None else None
        after = configured.policy if configured is not None else None
        if before != after:
            self.change(job_id, now, policy=after)
        return before, after

    def _adopt(self, job_id: str, setting: JobSettings) -> None:
        if setting.policy is not None:
            try:
                self.policies.get(setting.policy)
            except PolicyError as exc:
                log.warning(logfmt("setting_ignored", job=job_id, policy=setting.policy, error=exc))
                setting = JobSettings(policy=None, paused=setting.paused)
        if setting.policy is not None or setting.paused:
            self._settings[job_id] = setting
