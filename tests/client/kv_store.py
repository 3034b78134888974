"""A key-value store with the coordination service's semantics for the agreement's
unit tests: first writer wins, a missing key reads as None."""

from __future__ import annotations


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
