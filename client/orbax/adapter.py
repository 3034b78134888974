"""What Orbax provides to the core (:class:`~adaptd.client.framework.FrameworkAdapter`),
read from the checkpoint directory Orbax writes and from JAX.

Orbax commits a step atomically: it writes ``<step>.orbax-checkpoint-tmp-<time>/`` and
renames it to ``<step>/`` once every process is done (on object stores, where a rename
is not atomic, it writes ``commit_success.txt`` into ``<step>/`` instead; recent
versions write it everywhere). A step directory under its final name is a finalized
step: :func:`~adaptd.checkpoints.orbax.finalized_steps` lists them (the reading lives
in :mod:`adaptd.checkpoints.orbax`, which the replicator uses too).
Nothing here imports TensorFlow; JAX only where a JAX answer is asked for.
"""

from __future__ import annotations

from pathlib import Path

from adaptd.checkpoints.orbax import (
    COMMIT_FILE,
    METADATA_FILE,
    TMP_MARK,
    finalized_steps,
    step_bytes,
)

__all__ = [
    "COMMIT_FILE",
    "METADATA_FILE",
    "TMP_MARK",
    "OrbaxAdapter",
    "finalized_steps",
    "step_bytes",
]


class OrbaxAdapter:
    """The Orbax side of the core, for the checkpoint ``directory`` a
    ``CheckpointManager`` writes (None: not told; then no save's bytes are known)."""

    framework = "orbax"

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    def accelerators(self) -> int:
        """The GPUs among this process's JAX devices."""
        import jax

        return sum(1 for d in jax.local_devices() if d.platform == "gpu")

    def finalized(self, step: int) -> int | None:
        """Bytes of ``step``'s finalized directory; None while it is not finalized (or
        no directory was given)."""
        if self.directory is None:
            return None
        path = finalized_steps(self.directory).get(step)
        return step_bytes(path) if path is not None else None

    def path(self, step: int) -> str:
        """Where ``step``'s directory is (for the report; "" unknown)."""
        path = finalized_steps(self.directory).get(step) if self.directory else None
        return str(path) if path is not None else ""

    def newest_durable(self) -> int | None:
        """The newest finalized step in the directory (None: none, or no directory)."""
        steps = finalized_steps(self.directory) if self.directory is not None else {}
        return max(steps) if steps else None

    def peer_failure(self, exc: BaseException) -> str | None:
        """None: a JAX job does not survive a peer's failure to save after it. JAX's
        coordination service ends every process of the job when one stops sending
        heartbeats, so there is no error to catch and no survivor to save."""
        return None
