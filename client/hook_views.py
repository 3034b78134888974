"""What a script reads from a running hook: counters, the plan, the saves so far.

:class:`HookViews` is the read-only side of
:class:`~adaptd.client.checkpointer.AdaptiveCheckpointer`, kept apart from its hot
path and its life cycle; each view reads one of the hook's parts, never changes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adaptd.client.save.schedule import Due
from adaptd.protocol import job as protocol

if TYPE_CHECKING:
    import tensorflow as tf

    from adaptd.client.daemon.session import DaemonSession
    from adaptd.client.save.saves import Saves
    from adaptd.client.save.schedule import SaveSchedule
    from adaptd.client.save.targets import Durable
    from adaptd.client.save.writer import Writer

__all__ = ["HookViews"]


class HookViews:
    """The hook's read-only views (its parts are set by the hook's constructor)."""

    _n: int
    _writer: Writer
    _saves: Saves
    _schedule: SaveSchedule
    _session: DaemonSession
    _durable: Durable

    @property
    def manager(self) -> tf.train.CheckpointManager:
        """The ``CheckpointManager`` of the checkpoint directory (replaced when a
        restore changed its state file)."""
        return self._durable.manager

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
        return self._saves.in_flight

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
        """The newest checkpoint the directory's state file names (None: none)."""
        return self._durable.latest

    @property
    def history(self) -> list[protocol.SaveReport]:
        """Every finished save, as sent to the daemon (failed ones too)."""
        return self._saves.history

    @property
    def failed_saves(self) -> int:
        return self._saves.failed

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages sent, dropped (no daemon), bad frames received, failed saves."""
        saves = {"saves": len(self.history), "failed_saves": self.failed_saves}
        return {**self._session.counters(), **saves}
