"""What operators set for a job at run time, written through at once.

A policy override (``adaptd set-policy``) and a pause (``adaptd pause``) are rare and
must survive a crash right after the command returned, so unlike the history they are
not queued: :meth:`SettingsTable.set_job_setting` commits (fsynced) before it returns.
The daemon reads them back at start (:meth:`SettingsTable.job_settings`).
"""

from __future__ import annotations

import enum

from adaptd.state.database import Database, build
from adaptd.state.records import JobSettings

__all__ = ["KEEP", "SettingsTable"]


class _Keep(enum.Enum):
    """Sentinel type: "leave this setting as stored"."""

    KEEP = 0


KEEP = _Keep.KEEP


class SettingsTable(Database):
    """The store's part that keeps the operators' per-job settings."""

    def set_job_setting(
        self,
        job: str,
        *,
        policy: str | _Keep | None = KEEP,
        paused: bool | _Keep = KEEP,
    ) -> JobSettings:
        """Set a job's policy override and/or pause flag, durably, before returning.

        Pass ``policy=None`` to clear an override; an argument left out keeps its
        stored value. The commit is fsynced (``synchronous=FULL`` for this one
        write), so a power cut right after the operator's command cannot undo it.
        Raises :class:`sqlite3.Error` if it cannot be written, so the command can
        report the failure.
        """
        with self._lock:
            old = self.job_setting(job) or JobSettings(job=job)
            new = JobSettings(
                job=job,
                policy=old.policy if isinstance(policy, _Keep) else policy,
                paused=old.paused if isinstance(paused, _Keep) else bool(paused),
                updated=self._clock(),
            )
            self._conn.execute("PRAGMA synchronous=FULL")
            try:
                self._conn.execute(
                    "INSERT INTO job_settings (job, policy, paused, updated) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (job) DO UPDATE SET policy=excluded.policy, "
                    "paused=excluded.paused, updated=excluded.updated",
                    (new.job, new.policy, int(new.paused), new.updated),
                )
            finally:
                self._conn.execute("PRAGMA synchronous=NORMAL")
            return new

    def clear_job_setting(self, job: str) -> bool:
        """Forget an operator's settings for ``job``; True when there were any."""
        with self._lock:
            return self._conn.execute("DELETE FROM job_settings WHERE job=?", (job,)).rowcount > 0

    def job_setting(self, job: str) -> JobSettings | None:
        """The operator's settings for ``job``, if any."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT job, policy, paused, updated FROM job_settings WHERE job=?", (job,)
            ).fetchall()
        return build(JobSettings, rows[0], bools=("paused",)) if rows else None

    def job_settings(self) -> dict[str, JobSettings]:
        """Every job's operator settings (the daemon reloads these at start)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT job, policy, paused, updated FROM job_settings ORDER BY job"
            ).fetchall()
        return {r[0]: build(JobSettings, r, bools=("paused",)) for r in rows}
