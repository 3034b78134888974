"""sd_notify against a real AF_UNIX datagram socket playing systemd."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptd.daemon.sdnotify import Notifier


class FakeSystemd:
    """The listening end of ``$NOTIFY_SOCKET``: a bound datagram socket."""

    def __init__(self, address: str) -> None:
        self.env_value = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        bind_to: str | bytes = b"\0" + address[1:].encode() if address.startswith("@") else address
        self.sock.bind(bind_to)
        self.sock.settimeout(5.0)  # a deadline, not a sleep: recv returns as soon as one arrives

    def receive(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n"))

    def nothing_pending(self) -> bool:
        self.sock.setblocking(False)
        try:
            self.sock.recv(4096)
        except BlockingIOError:
            return True
        finally:
            self.sock.settimeout(5.0)
        return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(params=["path", "abstract"])
def systemd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FakeSystemd]:
    if request.param == "path":
        address = str(tmp_path / "notify.sock")
    else:
        address = f"@adaptd-test-{uuid.uuid4().hex}"
    fake = FakeSystemd(address)
    yield fake
    fake.close()


def test_lifecycle_messages(systemd: FakeSystemd) -> None:
    n = Notifier({"NOTIFY_SOCKET": systemd.env_value})
    assert n.enabled
    assert n.ready("serving 0 jobs")
    assert systemd.receive() == {"READY": "1", "STATUS": "serving 0 jobs"}
    assert n.status("3 jobs; next save of llama at step 1200")
    assert systemd.receive() == {"STATUS": "3 jobs; next save of llama at step 1200"}
    assert n.watchdog()
    assert systemd.receive() == {"WATCHDOG": "1"}
    assert n.extend_timeout(42.5)
    assert systemd.receive() == {"EXTEND_TIMEOUT_USEC": "42500000"}
    assert n.stopping("draining 3 jobs")
    assert systemd.receive() == {"STOPPING": "1", "STATUS": "draining 3 jobs"}
    assert systemd.nothing_pending()
    n.close()


def test_a_newline_cannot_inject_another_assignment(systemd: FakeSystemd) -> None:
    n = Notifier({"NOTIFY_SOCKET": systemd.env_value})
    n.status("job x\nREADY=1")
    assert systemd.receive() == {"STATUS": "job x READY=1"}


def test_watchdog_interval_and_pacing(systemd: FakeSystemd) -> None:
    pid = os.getpid()
    env = {"NOTIFY_SOCKET": systemd.env_value, "WATCHDOG_USEC": "30000000"}
    n = Notifier({**env, "WATCHDOG_PID": str(pid)})
    assert n.watchdog_interval_s == 30.0
    # the loop calls tick() every iteration; keep-alives go out every 15 s
    sent = [t for t in (0.0, 1.0, 14.9, 15.0, 20.0, 29.9, 30.0) if n.tick(t)]
    assert sent == [0.0, 15.0, 30.0]
    assert [systemd.receive() for _ in sent] == [{"WATCHDOG": "1"}] * 3
    assert systemd.nothing_pending()
    # addressed to another process (a child that inherited the env): not ours
    assert Notifier({**env, "WATCHDOG_PID": str(pid + 1)}).watchdog_interval_s is None
    assert Notifier(env).watchdog_interval_s == 30.0  # no WATCHDOG_PID: ours
    assert Notifier({**env, "WATCHDOG_USEC": "soon"}).watchdog_interval_s is None
    assert Notifier({**env, "WATCHDOG_USEC": "0"}).watchdog_interval_s is None
    assert not Notifier({**env, "WATCHDOG_USEC": "0"}).tick(100.0)


def test_outside_systemd_everything_is_a_quiet_no_op() -> None:
    n = Notifier({})
    assert not n.enabled
    assert not n.ready() and not n.status("x") and not n.watchdog() and not n.stopping()
    assert not n.tick(0.0)
    assert Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled is False


def test_a_vanished_systemd_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.enabled
    assert n.ready() is False
    assert n.watchdog() is False
    warnings = [r for r in caplog.records if "sd_notify" in r.getMessage()]
    assert len(warnings) == 1


def test_a_real_child_process_notifies_from_its_environment(tmp_path: Path) -> None:
    fake = FakeSystemd(str(tmp_path / "notify.sock"))
    code = (
        "from adaptd.daemon.sdnotify import Notifier\n"
        "n = Notifier()\n"
        "assert n.watchdog_interval_s == 2.0, n.watchdog_interval_s\n"
        "n.ready('up')\n"
        "n.tick(0.0)\n"
    )
    env = {**os.environ, "NOTIFY_SOCKET": fake.env_value, "WATCHDOG_USEC": "2000000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert fake.receive() == {"READY": "1", "STATUS": "up"}
    assert fake.receive() == {"WATCHDOG": "1"}
    fake.close()
