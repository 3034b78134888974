"""scripts/install-test-deps.sh, which `make test` runs first: on a machine missing the
programs the suite needs it installs their packages (root or passwordless sudo), says
what to install where it cannot, and does nothing when everything is there.

The script runs for real with a PATH that holds only the few programs it uses itself,
so the suite's programs (promtool, systemd-analyze, ...) are missing there, and with
a stand-in ``apt-get`` (and ``id``/``sudo`` where a test needs another user): this
machine's real packages are not touched.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from ._tools import ROOT, packages, run

SCRIPT = ROOT / "scripts" / "install-test-deps.sh"
BASH = shutil.which("bash") or "/bin/bash"


def _exe(path: Path, text: str) -> None:
    path.write_text("#!" + BASH + "\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def machine(tmp_path: Path):
    """A bin directory without the suite's programs, and an apt-get that "installs"
    a package by creating its programs there and logs every call."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("dirname", "id", "mktemp", "tail", "rm"):
        (bin_ / name).symlink_to(shutil.which(name))
    log = tmp_path / "apt.log"
    by_package: dict[str, list[str]] = {}
    for program, package in packages().items():
        by_package.setdefault(package, []).append(program)
    touch, chmod = shutil.which("touch"), shutil.which("chmod")
    creates = "\n".join(
        f"    {pkg}) {touch} {' '.join(str(bin_ / p) for p in progs)}; "
        f"{chmod} +x {' '.join(str(bin_ / p) for p in progs)} ;;"
        for pkg, progs in by_package.items()
    )
    _exe(
        bin_ / "apt-get",
        f'echo "apt-get $*" >> {log}\n'
        f'[ -e {tmp_path}/apt-fails ] && {{ echo "E: no network" >&2; exit 100; }}\n'
        'if [ "$1" = install ]; then\n'
        '  for p in "$@"; do case "$p" in\n'
        f"{creates}\n"
        "  esac; done\n"
        "fi\n",
    )

    class Machine:
        def run(self, *args: str, env: dict[str, str] | None = None):
            return run(BASH, SCRIPT, *args, env={"PATH": str(bin_), **(env or {})}, timeout=30)

        def calls(self) -> list[str]:
            return log.read_text().splitlines() if log.exists() else []

        def as_user(self, sudo: bool) -> None:
            (bin_ / "id").unlink()
            _exe(bin_ / "id", "echo 1000\n")
            if sudo:  # passwordless: runs the command (here as ourselves)
                _exe(bin_ / "sudo", f'echo "sudo $*" >> {log}\n[ "$1" = -n ] && shift\n"$@"\n')

        def apt_fails(self) -> None:
            (tmp_path / "apt-fails").touch()

    m = Machine()
    m.bin = bin_
    return m


def test_as_root_it_installs_each_missing_package_once_then_does_nothing(machine) -> None:
    wanted = list(dict.fromkeys(packages().values()))  # file order, each once
    r = machine.run()
    assert r.returncode == 0, r.stderr
    calls = machine.calls()
    assert calls[0].endswith("apt-get update -qq")
    assert calls[1].endswith("apt-get install -y -qq --no-install-recommends " + " ".join(wanted))
    assert f"installed {' '.join(wanted)}" in r.stderr
    for program in packages():
        assert os.access(machine.bin / program, os.X_OK)
    again = machine.run()
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert len(machine.calls()) == 2  # idempotent: apt-get is not run again


def test_one_missing_program_installs_only_its_package(machine) -> None:
    for program in packages():
        if program != "promtool":
            _exe(machine.bin / program, "exit 0\n")
    r = machine.run()
    assert r.returncode == 0, r.stderr
    assert machine.calls()[-1].endswith("--no-install-recommends prometheus")


def test_without_root_or_sudo_it_says_what_to_install(machine) -> None:
    machine.as_user(sudo=False)
    r = machine.run()
    assert r.returncode == 0  # make test goes on; the tests that need them skip
    assert machine.calls() == []
    assert "not root, and no passwordless sudo" in r.stderr
    assert "apt-get install systemd prometheus fuse3 etcd-server faketime openssl" in r.stderr
    strict = machine.run("--required")  # CI
    assert strict.returncode == 1 and "not root" in strict.stderr


def test_passwordless_sudo_is_used(machine) -> None:
    machine.as_user(sudo=True)
    r = machine.run()
    assert r.returncode == 0, r.stderr
    calls = machine.calls()
    assert calls[0] == "sudo -n true"  # asked first whether sudo needs no password
    assert [c for c in calls if c.startswith("apt-get")] == [
        "apt-get update -qq",
        "apt-get install -y -qq --no-install-recommends systemd prometheus fuse3 etcd-server "
        "faketime openssl",
    ]
    assert calls.count("sudo -n apt-get update -qq") == 1 and "installed" in r.stderr


def test_a_failing_apt_get_is_reported(machine) -> None:
    machine.apt_fails()
    r = machine.run()
    assert r.returncode == 0
    assert "E: no network" in r.stderr and "apt-get failed" in r.stderr
    assert machine.run("--required").returncode == 1


def test_unknown_arguments_are_refused(machine) -> None:
    r = machine.run("--force")
    assert r.returncode == 2 and "usage:" in r.stderr
