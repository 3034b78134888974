"""One answer to "is this destination URL usable?", wherever a URL is given.

The config's ``[destinations.NAME] url``, a destination folder (what ``adaptd restore``
and the daemon's uploads open) and the hook's ``restore_from`` used to check URLs
three ways, and the fleet named object stores from a list of its own: ``s3:///x`` (no
bucket) was refused by the config and taken by the hook, an ``adl://`` destination was
an object store to the uploads but not to the fleet. They all ask
:mod:`adaptd.tiers.urls` now; a path given relative is the one difference (the daemon's
config wants absolute paths; a process may name one relative to its directory).
"""

from __future__ import annotations

import importlib.util

import pytest

from adaptd.client.restore import remote
from adaptd.config import loader as config
from adaptd.fleet.targets import object_target
from adaptd.tiers import urls
from adaptd.tiers.layout import TierError
from adaptd.tiers.replica import Replica

MISSING = [m for m in ("gcsfs", "ossfs", "adlfs") if importlib.util.find_spec(m) is None]


def by_config(url: str) -> str | None:
    """What the config says of ``url`` as a destination: None (taken) or the error."""
    try:
        config.from_mapping({"destinations": {"d": {"url": url}}})
    except config.ConfigError as exc:
        assert exc.key == "destinations.d.url", exc
        return str(exc)
    return None


def by_folder(url: str) -> str | None:
    try:
        Replica(url)
    except TierError as exc:
        return str(exc)
    return None


def by_hook(url: str) -> str | None:
    try:
        remote.source(url, "job", environ={})
    except ValueError as exc:
        return str(exc)
    return None


REFUSED = [
    ("nosuchproto://bucket/x", "unknown protocol 'nosuchproto'"),
    ("s3:///no-bucket", "needs a bucket"),
    *[(f"{s}://bucket/x", "which is not installed") for s in ("gs", "oss") if MISSING],
]


@pytest.mark.parametrize(("url", "why"), REFUSED, ids=[u for u, _ in REFUSED])
def test_every_entry_refuses_the_same_urls_for_the_same_reason(url: str, why: str) -> None:
    answers = {"config": by_config(url), "folder": by_folder(url), "hook": by_hook(url)}
    assert all(a is not None and why in a for a in answers.values()), answers


@pytest.mark.parametrize("url", ["/mnt/nfs/ckpts/job", "file:///mnt/nfs/ckpts/job"])
def test_every_entry_takes_a_mounted_path(url: str) -> None:
    assert (by_config(url), by_folder(url), by_hook(url)) == (None, None, None)


def test_a_relative_path_is_for_a_process_not_for_the_daemons_config(tmp_path) -> None:
    assert "is not an absolute path" in (by_config("ckpts/job") or "")
    assert by_folder("ckpts/job") is None and by_hook("ckpts/job") is None


@pytest.mark.parametrize("scheme", sorted(urls.OBJECT_STORES))
def test_every_object_store_is_one_target_of_the_fleet(scheme: str) -> None:
    """The fleet names a bucket of each object store the uploads treat as one (atomic
    whole-object writes): the same list."""
    found = object_target(f"{scheme}://bucket/prefix/job")
    assert found is not None and found.name == f"{scheme}://default/bucket"


def test_a_path_is_local_and_a_protocol_is_not() -> None:
    assert urls.local_path("/mnt/x") == "/mnt/x"
    assert urls.local_path("file:///mnt/x") == "/mnt/x"
    assert urls.local_path("s3://b/x") is None and urls.scheme_of("S3://b/x") == "s3"
    assert urls.install_hint("s3a", "s3fs") == "pip install 'adaptd[s3]'"
    assert urls.install_hint("gs", "gcsfs") == "install gcsfs"
