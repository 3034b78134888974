"""Socket and state path resolution, shared by the daemon and the client."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptd.protocol import paths


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ADAPTD_SOCKET", "RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR", "STATE_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)


def test_explicit_beats_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ADAPTD_SOCKET", str(tmp_path / "env.sock"))
    assert paths.socket_path(tmp_path / "x.sock") == tmp_path / "x.sock"
    assert paths.socket_path() == tmp_path / "env.sock"
    assert paths.endpoint() == f"ipc://{tmp_path / 'env.sock'}"
    assert paths.endpoint("tcp://127.0.0.1:5555") == "tcp://127.0.0.1:5555"


def test_systemd_runtime_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RUNTIME_DIRECTORY", f"{tmp_path}:/other")
    assert paths.socket_path() == tmp_path / paths.SOCKET_NAME


def test_search_only_system_dir_is_used_when_the_socket_is_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    system = tmp_path / "run-adaptd"
    system.mkdir()
    monkeypatch.setattr(paths, "SYSTEM_RUNTIME_DIR", system)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    monkeypatch.setattr(
        paths.os, "access", lambda p, mode: not (mode & paths.os.W_OK)
    )  # a job user: may search /run/adaptd, not write it
    assert paths.runtime_dir() == tmp_path / "xdg" / "adaptd"  # no daemon socket there yet
    (system / paths.SOCKET_NAME).touch()
    assert paths.runtime_dir() == system


def test_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert paths.state_dir() == tmp_path / "adaptd"
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "sd"))
    assert paths.state_dir() == tmp_path / "sd"


def test_an_ipc_endpoint_means_its_path(tmp_path: Path) -> None:
    """Operator commands take ``--socket ipc:///x.sock`` as serve and ADAPTD_SOCKET do."""
    assert paths.socket_path(f"ipc://{tmp_path}/x.sock") == tmp_path / "x.sock"
    assert paths.endpoint(f"ipc://{tmp_path}/x.sock") == f"ipc://{tmp_path}/x.sock"
