"""The local tier set in the daemon's config (issue 24, item 1): a job whose script
names no local tier gets it from ``[jobs."ID"] local_tier`` through a real ``adaptd
serve``, saves there, and a SIGKILL and restart on the same host resumes from it,
bit-identical to the uninterrupted run; the hook's own ``local_tier`` wins over the
config. Real TensorFlow in real subprocesses, a real tmpfs (/dev/shm)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from faults.zygote import Zygote

from tests.client.test_local_tier import memory_tier  # noqa: F401  (the fixture)
from tests.client.test_resume import kill_at, read_until, start

from ._serve import NotifyListener, Serve

pytestmark = [pytest.mark.slow, pytest.mark.tf]


def _indexes(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("*.index")) if d.is_dir() else []


def test_a_job_saves_to_the_local_tier_of_the_daemons_config_and_resumes_from_it(
    short_dir: Path,
    memory_tier: Path,  # noqa: F811
    zygote: Zygote,
) -> None:
    conf = short_dir / "adaptd.toml"
    conf.write_text(
        f'[daemon]\nstate_dir = "{short_dir / "state"}"\n'
        f'[jobs."cfg-*"]\nlocal_tier = "{memory_tier}/{{job}}/{{rank}}"\n'
        '[metrics]\nlisten = "off"\n'  # the default port may be another daemon's
    )
    sock = short_dir / "a.sock"
    notify = NotifyListener(short_dir / "notify")
    d = Serve(["--config", str(conf), "--socket", str(sock)], notify, {})
    try:
        d.ready()
        # fixed two tiers: a save every 5 steps, every 2nd durable; killed once the save of
        # 15 is reported (its write runs beside the steps: on a loaded box it can end after step 17)
        common = ["--steps", "30", "--policy", "fixed:steps=5,durable_every=2",
                  "--step-sleep", "0.05"]  # fmt: skip
        ref_out = short_dir / "ref.bin"
        ref = start(
            zygote, short_dir / "ref", ref_out, *common, "--socket", f"ipc://{short_dir}/none"
        )
        served = [*common, "--socket", f"ipc://{sock}"]

        ckpt, out = short_dir / "ckpt", short_dir / "out.bin"
        job = ["--job", "cfg-a"]
        kill_at(zygote, ckpt, out, r"saved 15 ok=True tier=local", *served, *job)
        local = memory_tier / "cfg-a" / "0"  # the config's {job}/{rank}
        assert _indexes(local) == ["ckpt-15.index"]
        assert _indexes(ckpt) == ["ckpt-10.index"]

        # the hook's own local_tier wins over the config's
        own = memory_tier / "own"
        kill_at(zygote, short_dir / "ckpt-own", short_dir / "own.bin",
                        r"saved 15 ok=True tier=local",
                        *served, "--job", "cfg-b", "--local-tier", str(own))  # fmt: skip
        assert _indexes(own) == ["ckpt-15.index"]
        assert not (memory_tier / "cfg-b").exists()

        proc = start(zygote, ckpt, out, *served, *job)
        lines = read_until(proc, "done")
        assert proc.wait(60) == 0
        assert lines[:2] == ["start 15", "tier local"], lines
        read_until(ref, "done")
        assert ref.wait(60) == 0
        assert out.read_bytes() == ref_out.read_bytes(), "not bit-identical to the reference"
        assert not local.exists(), "a clean end (final save durable) frees the memory tier"
    finally:
        d.terminate()
        d.wait()
        notify.close()


def test_a_bad_local_tier_is_refused_by_check_config(short_dir: Path) -> None:
    cases = {
        '[jobs."j*"]\nlocal_tier = "/dev/shm/x"\n': "jobs.\"j*\".local_tier: 'j*' matches "
        "many jobs, so the path needs {job}",
        '[jobs."j"]\nlocal_tier = "shm/{job}"\n': 'jobs."j".local_tier: must be an absolute path',
        '[jobs."j"]\nlocal_tier = "/x/{host}"\n': "the only placeholders allowed are {job} and "
        "{rank}",
        '[jobs."j"]\nlocal_tier_memory = 0.5\n': 'jobs."j".local_tier_memory: needs '
        'jobs."j".local_tier too',
        '[jobs."j"]\nlocal_tier = "/x"\nlocal_tier_memory = 2\n': "must be <= 1, got 2",
        '[jobs."j"]\nlocal_tier = "/x"\nlocal_tier_disk = "d"\n': 'jobs."j".local_tier_disk: '
        "must be an absolute path",
    }
    for i, (text, message) in enumerate(cases.items()):
        conf = short_dir / f"bad{i}-{uuid.uuid4().hex[:4]}.toml"
        conf.write_text(text)
        out = subprocess.run(
            [sys.executable, "-m", "adaptd.cli", "serve", "--config", str(conf), "--check-config"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode != 0, text
        assert message in out.stderr, (text, out.stderr)
    good = short_dir / "good.toml"
    good.write_text(
        '[jobs."j*"]\nlocal_tier = "/dev/shm/adaptd/{job}/{rank}"\n'
        'local_tier_memory = 0.1\nlocal_tier_disk = "/var/tmp/adaptd/{job}"\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "adaptd.cli", "serve", "--config", str(good), "--check-config"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "/dev/shm/adaptd/{job}/{rank}" in out.stdout
