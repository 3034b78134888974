"""The systemd unit, verified and security-scored by systemd-analyze itself."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from ._tools import ROOT, run, tool

UNIT = ROOT / "systemd" / "adaptd.service"


def directives(path: Path) -> dict[str, list[str]]:
    """Every ``Key=value`` of the unit (keys may repeat), comments dropped."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, val = line.partition("=")
        out.setdefault(key, []).append(val)
    return out


@pytest.fixture
def unit_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart= pointing at this checkout's adaptd (verify needs it to exist)."""
    exe = Path(sys.executable).with_name("adaptd")
    if not exe.exists():
        found = shutil.which("adaptd")
        if found is None:
            pytest.skip("the adaptd entry point is not installed (pip install -e .)")
        exe = Path(found)
    text = UNIT.read_text()
    assert "ExecStart=/usr/bin/adaptd serve" in text
    text = text.replace("ExecStart=/usr/bin/adaptd", f"ExecStart={exe}")
    out = tmp_path / "adaptd.service"
    out.write_text(text)
    return out


def test_systemd_analyze_verify_is_clean(unit_copy: Path) -> None:
    analyze = tool("systemd-analyze")
    res = run(analyze, "verify", unit_copy)
    assert res.returncode == 0, res.stderr
    # verify also prints warnings (unknown keys, bad values) without failing
    noise = [ln for ln in res.stderr.splitlines() if "adaptd.service" in ln]
    assert noise == [], res.stderr


def test_verify_catches_a_broken_unit(unit_copy: Path) -> None:
    """The check above can fail: a typo in a directive is reported."""
    analyze = tool("systemd-analyze")
    broken = unit_copy.with_name("broken.service")
    broken.write_text(unit_copy.read_text().replace("ProtectSystem=strict", "ProtectSystm=strict"))
    res = run(analyze, "verify", broken)
    assert "ProtectSystm" in res.stderr


def test_security_exposure_is_ok_or_better(unit_copy: Path) -> None:
    analyze = tool("systemd-analyze")
    res = run(analyze, "security", "--offline=true", "--no-pager", unit_copy)
    assert res.returncode == 0, res.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d) (\w+)", res.stdout)
    assert m, res.stdout[-2000:]
    score, level = float(m.group(1)), m.group(2)
    assert level in ("SAFE", "OK"), f"exposure {score} {level}"
    assert score < 2.0, f"exposure {score} {level}: the sandbox regressed"


def test_unit_is_notify_with_watchdog_and_sandbox() -> None:
    d = directives(UNIT)
    one = {k: v[-1] for k, v in d.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert one["ExecStart"] == "/usr/bin/adaptd serve --config /etc/adaptd/adaptd.toml"
    assert re.fullmatch(r"\d+s", one["WatchdogSec"])
    assert (one["User"], one["Group"]) == ("adaptd", "adaptd")
    assert one["RuntimeDirectory"] == "adaptd" and one["StateDirectory"] == "adaptd"
    assert one["ProtectSystem"] == "strict" and one["ProtectHome"] == "read-only"
    assert one["NoNewPrivileges"] == one["PrivateTmp"] == "yes"
    assert one["DevicePolicy"] == "closed"
    assert any("nvidia" in v for v in d["DeviceAllow"])
    assert "@system-service" in d["SystemCallFilter"]
    assert one["CapabilityBoundingSet"] == ""
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    # the drain on SIGTERM must fit: stop timeout above the config's default grace
    from adaptd.config.loader import from_mapping

    assert int(one["TimeoutStopSec"].rstrip("s")) > from_mapping({}).drain_grace_s


@pytest.mark.skipif(os.geteuid() != 0, reason="creating users and chowning needs root")
def test_sysusers_and_tmpfiles_create_the_user_and_directories(tmp_path: Path) -> None:
    sysusers, tmpfiles = tool("systemd-sysusers"), tool("systemd-tmpfiles")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for src, sub in (
        ("adaptd.sysusers.conf", "sysusers.d"),
        ("adaptd.tmpfiles.conf", "tmpfiles.d"),
    ):
        (root / "usr/lib" / sub).mkdir(parents=True)
        shutil.copy(ROOT / "systemd" / src, root / "usr/lib" / sub / "adaptd.conf")
    res = run(sysusers, f"--root={root}")
    assert res.returncode == 0, res.stderr
    passwd = (root / "etc/passwd").read_text()
    m = re.search(r"^adaptd:x:(\d+):(\d+):[^:]*:/var/lib/adaptd:/usr/sbin/nologin$", passwd, re.M)
    assert m, passwd
    uid, gid = int(m.group(1)), int(m.group(2))
    assert re.search(rf"^adaptd:x:{gid}:", (root / "etc/group").read_text(), re.M)
    res = run(tmpfiles, f"--root={root}", "--create")
    assert res.returncode == 0, res.stderr
    run_dir, state = (root / "run/adaptd").stat(), (root / "var/lib/adaptd").stat()
    assert (run_dir.st_uid, run_dir.st_gid, run_dir.st_mode & 0o777) == (uid, gid, 0o750)
    assert (state.st_uid, state.st_gid, state.st_mode & 0o777) == (uid, gid, 0o700)
    assert (root / "etc/adaptd").is_dir()
