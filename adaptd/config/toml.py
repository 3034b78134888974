"""TOML, read the same way by every file adaptd reads (the config, simulator scenarios):
the standard library's ``tomllib``, or ``tomli`` (the same parser) before Python 3.11."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["TOMLDecodeError", "loads"]

loads = tomllib.loads
TOMLDecodeError = tomllib.TOMLDecodeError
