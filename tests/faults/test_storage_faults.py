"""Storage faults under a real Keras job and a real daemon.

* The checkpoint directory is a small tmpfs mounted by the test. It is filled up
  (ENOSPC), emptied, remounted read-only (EROFS) and read-write again while the job
  trains: each failed save is reported (``ok=False`` with the error, to the daemon,
  which counts it), the previous checkpoint stays complete (``adaptd verify``) and
  restorable, training goes on, and saving resumes once the space is back.
* The checkpoint directory moves onto a slow filesystem (scripts/slowfs.py, a FUSE
  passthrough with a bandwidth cap): the measured time until durable rises and the
  daemon's interval for the job grows with it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from adaptd.client.save import files

from .conftest import ROOT, TRAIN_SCRIPT, Serve, SmallFS, on_disk, state
from .zygote import Child, Zygote

pytestmark = [pytest.mark.slow, pytest.mark.tf]

JOB = "storage-job"
DEADLINE = 60.0


def report_after(child: Child, after: int, ok: bool) -> tuple[int, int]:
    """(step, line index) of the first save report with ``ok`` from line ``after`` on."""
    line = child.log.wait_for("saved ", f"ok={ok}", timeout=DEADLINE, after=after)
    return int(line.split()[1]), child.log.lines.index(line, after)


def verify(zygote: Zygote, ckpt: Path) -> str:
    """``adaptd verify CKPT`` (forked from the zygote: TF is imported there); its output."""
    v = zygote.spawn(["verify", ckpt], module="adaptd.cli")
    code = v.wait(DEADLINE)
    assert code == 0, v.log.text()
    # the child's output can trail the zygote's "exit" line: wait for it, not a snapshot
    return v.log.wait_for("OK ", timeout=DEADLINE)


def test_full_then_read_only_disk_fails_saves_cleanly_and_saving_resumes(
    zygote: Zygote, small_fs: SmallFS, tmp_path: Path
) -> None:
    socket, ckpt, stop = small_fs.path.parent / "a.sock", small_fs.path / "ckpt", tmp_path / "stop"
    daemon = Serve(socket, tmp_path / "state", JOB)
    daemon.start()
    try:
        job = zygote.spawn(
            [ckpt, tmp_path / "out", "--steps", "1000000", "--policy", "fixed:steps=20",
             "--socket", f"ipc://{socket}", "--step-sleep", "0.004", "--pad-mb", "2",
             "--job", JOB, "--stop-file", stop],
            script=TRAIN_SCRIPT,
        )  # fmt: skip
        job.log.wait_for("mode daemon", timeout=DEADLINE)
        _, i = report_after(job, 0, True)
        good, i = report_after(job, i + 1, True)
        faults = []
        for fault in ("ENOSPC", "EROFS"):
            mark = len(job.log.lines)
            if fault == "ENOSPC":
                filler = small_fs.fill()
            else:
                small_fs.remount("ro")
            failed, i = report_after(job, mark, False)
            latest, _ = state(ckpt)
            # reported with its error, counted, and the previous checkpoint is intact
            n, step = len(faults) + 1, failed
            info = daemon.wait_job(
                lambda j, n=n, step=step: (
                    j.failed_saves >= n and j.last_save is not None and j.last_save.step >= step
                ),
                "the failed save's report",
            )
            assert info.last_save is not None and not info.last_save.ok
            expect = "No space left" if fault == "ENOSPC" else "Read-only file system"
            assert expect in info.last_save.error, info.last_save.error
            assert latest is not None and latest < failed and latest >= good
            ok_line = verify(zygote, ckpt)
            assert f"ckpt-{latest}:" in ok_line and f"step {latest}" in ok_line
            # training goes on through the fault
            job.log.wait_for(f"step {failed + 30}", timeout=DEADLINE, after=i)
            # space comes back: the next save works
            if fault == "ENOSPC":
                filler.unlink()
            else:
                small_fs.remount("rw")
            good, i = report_after(job, len(job.log.lines), True)
            assert good > failed
            faults.append(f"{fault}: save of step {failed} failed ({info.last_save.error[:80]})"
                          f", latest stayed {latest}, next good save {good}")  # fmt: skip
        stop.touch()
        assert job.wait(DEADLINE) == 0, job.log.text()[-2000:]
        final = daemon.wait_job(lambda j: j.state == "finished", "the job's goodbye")
    finally:
        daemon.stop()
    print("\n".join(faults))
    # every failed save the job saw was reported to the daemon and counted there
    assert final.failed_saves == sum(ln.endswith("ok=False") for ln in job.log.lines) >= 2
    # what is on disk is whole: the latest verifies, nothing half-written remains
    latest, listed = state(ckpt)
    assert f"step {latest}" in verify(zygote, ckpt)
    assert files.orphans(ckpt) == []
    assert on_disk(ckpt) == listed
    # and the job restores from it
    again = zygote.spawn(
        [ckpt, tmp_path / "out2", "--steps", str(latest + 1), "--policy", "fixed:steps=20",
         "--socket", f"ipc://{tmp_path}/none", "--pad-mb", "2"],
        script=TRAIN_SCRIPT,
    )  # fmt: skip
    assert again.wait(DEADLINE) == 0
    assert again.log.lines[0] == f"start {latest}"


# ---------------------------------------------------------------------- slow storage


def test_slow_storage_raises_the_save_cost_and_the_interval_follows(
    zygote: Zygote, short_dir: Path, tmp_path: Path
) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import slowfs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    if why := slowfs.unavailable():
        pytest.skip(why)
    socket, store, slow = short_dir / "a.sock", tmp_path / "store", tmp_path / "slow"
    store.mkdir()
    slow.mkdir()
    ckpt = tmp_path / "ckpt"  # the job's directory: a symlink, repointed at the slow mount
    ckpt.symlink_to(store)
    stop = tmp_path / "stop"
    # Daly with a short MTBF (so the interval is seconds, not hours), under the guard
    # that keeps saves at least one durable latency apart
    policy = "guards:inner=daly:probe_s=2;mtbf_s=20"
    daemon = Serve(socket, tmp_path / "state", JOB)
    daemon.start()
    try:
        # one writer priority throughout: the save cost of the two phases is compared,
        # and "auto" would choose differently for the fast and the slow storage
        job = zygote.spawn(
            [ckpt, tmp_path / "out", "--steps", "1000000", "--policy", policy,
             "--socket", f"ipc://{socket}", "--step-sleep", "0.004", "--pad-mb", "4",
             "--job", JOB, "--stop-file", stop, "--writer-nice", "none"],
            script=TRAIN_SCRIPT,
        )  # fmt: skip
        job.log.wait_for("mode daemon", timeout=DEADLINE)
        # fast storage: a few saves measured, a plan from them
        fast = daemon.wait_job(
            lambda j: j.saves >= 3 and j.plan is not None and j.plan.interval_s,
            "three saves and a plan",
        )
        try:
            # 1 MiB/s: a 4 MiB save takes about 4 s to become durable, so both the cost
            # and the guard's floor (one durable latency) lift the interval well clear
            # of the fast phase's, even when a loaded box inflates the fast phase's cost
            # (at 2 MiB/s, 2 of ~10 runs under load stopped short of 1.5x)
            with slowfs.slow_mount(store, slow, bandwidth_mib_s=1) as fs:
                link = tmp_path / "ckpt.new"
                link.symlink_to(slow)
                os.replace(link, ckpt)  # from now on every write goes through the cap
                saves_then = fast.saves
                # in seconds, not steps: on a loaded box the step time itself moves
                # (it doubled in one make test run), and the steps with it
                slow_info = daemon.wait_job(
                    lambda j: (
                        j.saves >= saves_then + 2
                        and j.plan is not None
                        # Daly's τ grows with √δ: δ about 4x makes it about 2x; 1.5x
                        # leaves room for the noise of a loaded box
                        and (j.plan.interval_s or 0) >= 1.5 * fast.plan.interval_s
                    ),
                    "the interval to grow",
                )
                stop.touch()
                assert job.wait(DEADLINE) == 0, job.log.text()[-2000:]
                link = tmp_path / "ckpt.new"
                link.symlink_to(store)
                os.replace(link, ckpt)
            written = (fs.stats or {}).get("bytes_written", 0)
        except slowfs.SlowFSError as exc:
            pytest.skip(f"cannot mount slowfs (FUSE) here: {exc}")
    finally:
        daemon.stop()
    print(
        f"fast: latency {fast.save_latency_s:.3f}s cost {fast.save_cost_s:.4f}s "
        f"every {fast.plan.every_steps} steps ({fast.plan.reason}); "
        f"slow (1 MiB/s): latency {slow_info.save_latency_s:.3f}s "
        f"cost {slow_info.save_cost_s:.4f}s every {slow_info.plan.every_steps} steps "
        f"({slow_info.plan.reason}); {written / 2**20:.0f} MiB through slowfs"
    )
    assert written > 8 * 2**20  # the saves really went through the slow mount
    assert slow_info.save_latency_s > 3 * fast.save_latency_s
    latest, listed = state(store)  # the state file written through slowfs is whole
    assert latest is not None and latest in listed and files.orphans(store) == []
