"""A key-value store with the coordination service's semantics for the agreement's
unit tests: first writer wins, a missing key reads as None."""

from __future__ import annotations

import threading
import time


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def put(self, key: str, value: str) -> bool:
        if key in self.data:
            return False
        self.data[key] = value
        return True

    def get(self, key: str, timeout_s: float) -> str | None:
        return self.data.get(key)

    def try_get(self, key: str) -> str | None:
        return self.data.get(key)

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


class WaitingDictStore(DictStore):
    """A :class:`DictStore` whose ``get`` waits (up to its timeout) for the key to be
    written, as the coordination service's does: for the agreement's watcher threads
    in one process (tests/client/test_agreement_scale.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._written = threading.Condition()
        self._closed = False

    def close(self) -> None:
        """Every get waiting now or later returns None at once (to end watchers
        without waiting out their slices)."""
        with self._written:
            self._closed = True
            self._written.notify_all()

    def put(self, key: str, value: str) -> bool:
        with self._written:
            won = super().put(key, value)
            self._written.notify_all()
        return won

    def get(self, key: str, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        with self._written:
            while key not in self.data:
                if self._closed:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._written.wait(left)
            return self.data[key]

    def try_get(self, key: str) -> str | None:
        with self._written:
            return self.data.get(key)

    def delete(self, key: str) -> None:
        """Remove ``key`` and every key under ``key/`` (as the service does)."""
        with self._written:
            for k in [k for k in self.data if k == key or k.startswith(key + "/")]:
                del self.data[k]
