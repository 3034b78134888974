"""Fixtures of the fleet tests: a real etcd (see fleet_helpers.py).

- ``etcd``: one server for the test session; each test gets its own key prefix
  (``fleet_prefix``), so tests never see each other's keys;
- ``own_etcd``: a server of the test's own (tests that kill, stop or restart it);
- ``hosts_root``: a short folder for daemons' sockets (fleet_hosts.py's ``Host``);
- ``auth_etcd``: a server of the test module's own with authentication on: a ``root`` user,
  and a user and role per host (``host-a``, ``host-b``) that may write only that
  host's keys (the roles docs/fleet.md tells operators to create).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("etcd3gw", reason="needs etcd3gw (pip install 'adaptd[fleet]')")

from fleet_helpers import HOSTS, Etcd, running

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    with running(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[Etcd]:
    with running(tmp_path) as server:
        yield server


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    with running(tmp_path_factory.mktemp("etcd-auth")) as server:
        server.enable_auth("/adaptd/", HOSTS)
        yield server


@pytest.fixture
def fleet_prefix() -> str:
    """A key prefix of the test's own on the shared server."""
    return f"/adaptd-test-{next(_prefixes)}/"


@pytest.fixture
def hosts_root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="adf-", dir="/tmp"))  # ipc paths stay short
    yield d
    shutil.rmtree(d, ignore_errors=True)
