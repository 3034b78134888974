"""The training-loop hook (import name ``adaptd.client``).

``AdaptiveCheckpointer`` for custom loops, ``AdaptiveCheckpointCallback`` for
``model.fit``, ``HookOptions`` their settings as one object; ``NoIntactCheckpoint`` is
what a resume raises when every checkpoint is damaged, ``WorldSizeChanged`` when the
newest was written by a job of another number of workers, ``ForeignStateFile`` when
the directory's state file points outside it. The first two need TensorFlow, which is
imported only when one of them is first used, so the pure helpers
(``adaptd.client.save.schedule``, ``costs``, ``link``, ``files``, ``ranks``) import
without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adaptd.client.callback import AdaptiveCheckpointCallback
    from adaptd.client.checkpointer import AdaptiveCheckpointer
    from adaptd.client.options import HookOptions

from adaptd.client.restore.intact import ForeignStateFile, NoIntactCheckpoint, WorldSizeChanged

__all__ = [
    "AdaptiveCheckpointCallback",
    "AdaptiveCheckpointer",
    "ForeignStateFile",
    "HookOptions",
    "NoIntactCheckpoint",
    "WorldSizeChanged",
]


def __getattr__(name: str) -> Any:
    if name == "AdaptiveCheckpointer":
        from adaptd.client.checkpointer import AdaptiveCheckpointer

        return AdaptiveCheckpointer
    if name == "AdaptiveCheckpointCallback":
        from adaptd.client.callback import AdaptiveCheckpointCallback

        return AdaptiveCheckpointCallback
    if name == "HookOptions":
        from adaptd.client.options import HookOptions

        return HookOptions
    raise AttributeError(f"module 'adaptd.client' has no attribute {name!r}")
