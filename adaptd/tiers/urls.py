"""Destination URLs: which are accepted, which are object stores, which are mounted paths.

The one place that says it, for every module that takes a destination: the config's
``[destinations.NAME] url`` (:mod:`adaptd.config.kinds`), a :class:`~adaptd.tiers.replica.Replica`
(what ``adaptd restore`` and the daemon's uploads open), the hook's ``restore_from``
(:mod:`adaptd.client.restore.remote`) and the fleet, which names a shared object store
by its bucket (:func:`adaptd.fleet.targets.object_target`).

A destination is

- a **path** (an NFS mount, a second disk), or ``file:///PATH``: a mounted filesystem;
- ``s3://BUCKET[/PREFIX]`` (``s3a://`` too), through s3fs: ``pip install 'adaptd[s3]'``;
- any other protocol fsspec knows whose filesystem package is installed (``gs://``
  needs gcsfs, ``az://`` adlfs ...). One that is not installed is refused when the URL
  is checked, not at the first upload or restore.

Pure but for :func:`check`, which asks fsspec (imported there, not at import time)
which protocols exist and whether their packages are installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = [
    "LOCAL",
    "OBJECT_STORES",
    "S3",
    "UrlError",
    "check",
    "install_hint",
    "local_path",
    "scheme_of",
]

#: fsspec's protocols of a mounted (local) filesystem.
LOCAL = frozenset({"file", "local"})
#: Object stores: no rename, but a whole-object PUT (or a completed multipart upload) is
#: atomic, so files are written under their final key; a bucket several hosts write to
#: is one shared target of the fleet.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})
#: S3's schemes, served by s3fs (the ``s3`` extra); their URL names a bucket.
S3 = frozenset({"s3", "s3a"})


class UrlError(ValueError):
    """A destination URL that cannot be used. ``reason`` says why in words that follow the
    URL (``"needs a bucket: s3://BUCKET[/PREFIX]"``); the message is the URL and the reason."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url!r} {reason}")
        self.url = url
        self.reason = reason


def scheme_of(url: str) -> str | None:
    """The URL's protocol, lower case (``"s3"``), or ``None`` for a plain path."""
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else None


def local_path(url: str) -> str | None:
    """The path of a mounted destination (a plain path, or ``file://PATH``); ``None`` for
    one reached over a protocol (an object store, ``ssh://`` ...)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    return rest if scheme.lower() in LOCAL else None


def install_hint(scheme: str, module: str) -> str:
    """What to install for ``scheme``'s filesystem package ``module``."""
    return "pip install 'adaptd[s3]'" if scheme in S3 else f"install {module}"


def check(url: str, *, relative: bool = False) -> None:
    """Raise :class:`UrlError` unless ``url`` is a destination this host can open: an
    absolute path (``relative``: any path), ``file:///PATH``, or a protocol fsspec knows
    whose filesystem is installed (``s3://`` with a bucket)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        if not (relative or Path(url).expanduser().is_absolute()):
            raise UrlError(url, "is not an absolute path (a local destination must be one)")
        return
    scheme = scheme.lower()
    if scheme in LOCAL:
        if not (relative or rest.startswith("/")):
            raise UrlError(url, f"needs an absolute path after {scheme}:// ({scheme}:///...)")
        return
    from fsspec.registry import get_filesystem_class, known_implementations, registry

    known = known_implementations.get(scheme)
    if known is None and scheme not in registry:  # registry: classes registered at run time
        raise UrlError(
            url,
            f"has an unknown protocol {scheme!r} (fsspec knows no protocol {scheme!r}; use a "
            "path, file:///PATH, s3://BUCKET/PREFIX or another fsspec URL)",
        )
    if scheme in S3 and not rest.split("/", 1)[0]:
        raise UrlError(url, "needs a bucket: s3://BUCKET[/PREFIX]")
    module = known["class"].split(".")[0] if known is not None else "fsspec"
    why = ""
    if importlib.util.find_spec(module) is None:
        why = "not installed"
    else:
        try:
            get_filesystem_class(scheme)
        except ImportError as exc:  # a package it needs in turn (aiohttp for http://)
            why = f"not usable: {exc}"
    if why:
        raise UrlError(url, f"needs {module}, which is {why}; {install_hint(scheme, module)}")
