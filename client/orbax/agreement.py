"""Every process of a multi-process JAX job gives Orbax the same answer for a step.

Orbax's save is collective: one process answering yes alone would wait in the save's
barrier for ever. So the processes meet at *agreement steps* only, never per step:
at each, the primary process (process 0, as Orbax's own
``ContinuousCheckpointingPolicy`` does it) publishes its answer under a key of JAX's
coordination service (the key-value store ``jax.distributed`` runs; through the
:class:`~adaptd.client.agreement.kv.Store` interface the TensorFlow agreement uses) and
every other process reads it: save now or not, why, and the next agreement step (the
primary's next due save, or sooner, so that a new plan or a save-now is heard within
about ``interval_s``). Between agreement steps every process answers no without
asking anyone. The primary decides with its own daemon's plan (or its embedded
policy); the other processes report their steps and saves to theirs.

Why not the TensorFlow hook's rounds (:mod:`adaptd.client.agreement.rounds`): those
let every rank propose and hold the others at a step; here Orbax calls in at each
step on every process, so one writer and a blocking read at steps all processes
know in advance is all it takes, and costs one key per agreement step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from adaptd.client.agreement.kv import Keys, Store, next_session

__all__ = ["Answer", "JaxStore", "PrimaryAnswer"]

log = logging.getLogger("adaptd.client")

#: Keys older than this many agreement steps are deleted by the primary (every process
#: has read them: processes of one job are within a few steps of each other).
KEEP_KEYS = 64


class JaxStore:
    """JAX's coordination-service key-value store as a :class:`~adaptd.client.agreement.kv.Store`
    (the client ``jax.distributed.initialize()`` made; the one Orbax's own signaling
    uses). Raises RuntimeError when ``jax.distributed`` is not initialized."""

    def __init__(self) -> None:
        from jax._src import distributed  # the client has no public accessor

        client = distributed.global_state.client
        if client is None:
            raise RuntimeError(
                "several JAX processes but no jax.distributed client: call "
                "jax.distributed.initialize() before the first manager.save()"
            )
        self._client = client

    def put(self, key: str, value: str) -> bool:
        """Set ``key`` unless it is set (first writer wins); False when it was."""
        import jax

        try:
            self._client.key_value_set(key, value)
        except jax.errors.JaxRuntimeError as exc:
            if "ALREADY_EXISTS" in str(exc):
                return False
            raise
        return True

    def get(self, key: str, timeout_s: float) -> str | None:
        """``key``'s value, waiting up to ``timeout_s``; None when it did not come."""
        import jax

        try:
            return str(self._client.blocking_key_value_get(key, max(1, int(timeout_s * 1000))))
        except jax.errors.JaxRuntimeError as exc:
            if "DEADLINE_EXCEEDED" in str(exc) or "timed out" in str(exc).lower():
                return None
            raise

    def try_get(self, key: str) -> str | None:
        import jax

        try:
            return str(self._client.key_value_try_get(key))
        except jax.errors.JaxRuntimeError:
            return None

    def delete(self, key: str) -> None:
        self._client.key_value_delete(key)


@dataclass(frozen=True, slots=True)
class Answer:
    """The job's answer at an agreement step: ``save`` now (for ``reason``); the next
    agreement step is ``next_step``."""

    save: bool
    reason: str
    next_step: int

    def encode(self) -> str:
        return f"{int(self.save)} {self.next_step} {self.reason}"

    @classmethod
    def decode(cls, text: str) -> Answer:
        save, nxt, reason = [*text.split(" ", 2), ""][:3]
        return cls(save == "1", reason, int(nxt))


class PrimaryAnswer:
    """Process ``rank``'s side of the agreement of job ``job``'s ``world_size``
    processes on ``store``; the k-th agreement step of every process reads the same key
    (the policies of one job are numbered per process, :func:`next_session`, so each
    process's N-th policy meets the others' N-th).

    Args:
        timeout_s: how long a process waits for the primary's answer; past it
            :meth:`agree` raises RuntimeError (the primary is gone: the job cannot save).
    """

    def __init__(
        self, store: Store, job: str, rank: int, world_size: int, *, timeout_s: float = 300.0
    ) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout_s = timeout_s
        self._prefix = Keys.of(job, next_session(job)).prefix + "/orbax"
        self._k = 0

    @property
    def primary(self) -> bool:
        return self.rank == 0

    def agree(self, step: int, mine: Answer | None) -> Answer:
        """The job's answer at this agreement step. The primary passes its own
        (``mine``) and publishes it; every other process passes None and waits for it.

        Raises:
            RuntimeError: no answer from the primary within ``timeout_s`` (the message
                names the key and the step).
        """
        key = f"{self._prefix}/{self._k}"
        self._k += 1
        if self.primary:
            assert mine is not None
            self.store.put(key, mine.encode())
            if self._k > KEEP_KEYS:
                self.store.delete(f"{self._prefix}/{self._k - 1 - KEEP_KEYS}")
            return mine
        text = self.store.get(key, self.timeout_s)
        if text is None:
            raise RuntimeError(
                f"adaptd: no save decision from the primary process (process 0) for step "
                f"{step} within {self.timeout_s:g}s (key {key}): it is gone or stuck, and "
                "Orbax's collective save cannot go on without it"
            )
        return Answer.decode(text)
