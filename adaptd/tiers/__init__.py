"""Tiered checkpoint storage: replicate completed local checkpoints to durable destinations.

``Replica`` (one job's folder at a destination: upload, verify, prune), ``Throttle``
(a bandwidth cap shared by the uploads to one destination) and ``TierError`` are
imported on first use, so importing this package costs nothing;
``adaptd.tiers.restore.restore`` fetches the newest verified checkpoint into a
directory. See docs/tiers.md.

Modules: ``layout`` (the folder's files and the manifest), ``replica`` (one folder as
readers and the writer see it: its files, read, verify, the resumable write path,
retention), ``throttle``
(bandwidth cap and yielding), ``destination`` (one destination's queue and workers),
``replicator`` (the daemon's sink that feeds them), ``restore``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FileEntry": "layout",
    "Manifest": "layout",
    "Replica": "replica",
    "Throttle": "throttle",
    "TierError": "layout",
    "UploadResult": "replica",
    "RestoreResult": "restore",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"adaptd.tiers.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'adaptd.tiers' has no attribute {name!r}")
