"""Storage targets and their write figures: recorded /proc + /sys trees, and this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from adaptd.telemetry import host
from adaptd.telemetry import storage as st

from .conftest import GPUHOST

# The sysfs of the recorded host: (major:minor, path under devices/, partition?)
SYS_DEVICES = {
    "nvme0n1": ("259:0", "pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0/nvme0n1", False),
    "nvme0n1p1": (
        "259:1",
        "pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0/nvme0n1/nvme0n1p1",
        True,
    ),
    "nvme0n1p2": (
        "259:2",
        "pci0000:00/0000:00:01.1/0000:01:00.0/nvme/nvme0/nvme0n1/nvme0n1p2",
        True,
    ),
    "nvme1n1": ("259:3", "pci0000:40/0000:40:01.1/0000:41:00.0/nvme/nvme1/nvme1n1", False),
    "nvme2n1": ("259:4", "pci0000:40/0000:40:01.2/0000:42:00.0/nvme/nvme2/nvme2n1", False),
    "dm-0": ("253:0", "virtual/block/dm-0", False),
    "sda": ("8:0", "pci0000:80/0000:80:03.0/ata1/host0/target0:0:0/0:0:0:0/block/sda", False),
}


def build_sys(root: Path) -> Path:
    """A sysfs tree shaped like the kernel's: class/block and dev/block symlinks."""
    sys = root / "sys"
    for name, (dev, rel, partition) in SYS_DEVICES.items():
        d = sys / "devices" / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "dev").write_text(dev + "\n")
        if partition:
            (d / "partition").write_text(name[-1] + "\n")
        for link_dir in (sys / "class" / "block", sys / "dev" / "block"):
            link_dir.mkdir(parents=True, exist_ok=True)
            link = link_dir / (name if "class" in str(link_dir) else dev)
            link.symlink_to(os.path.relpath(d, link_dir))
    dm = sys / "devices" / "virtual" / "block" / "dm-0"
    (dm / "dm").mkdir()
    (dm / "dm" / "name").write_text("vg_scratch-lv_ckpt\n")
    (dm / "slaves").mkdir()
    for slave in ("nvme1n1", "nvme2n1"):
        (dm / "slaves" / slave).symlink_to(
            os.path.relpath(sys / "devices" / SYS_DEVICES[slave][1], dm / "slaves")
        )
    return sys


@pytest.fixture
def recorded(tmp_path: Path, procfs) -> tuple[st.Storage, Path]:
    """The recorded host: its procfs (psutil reads the disk counters there) and sysfs."""
    proc = procfs(tmp_path / "proc")
    shutil.copytree(GPUHOST, proc)
    return st.Storage(sys=build_sys(tmp_path), resolve=os.path.normpath), proc


JOBS = {
    "llm-a": "/scratch/ckpt/llm-a",
    "llm-b": "/scratch/ckpt/llm-b",
    "vit": "/home/ml/vit/ckpt",
    "nfs-job": "/mnt/nfs/ckpt/run7",
    "boot": "/boot/efi/x",
    "btr": "/data/ckpt",
    "ram": "/mnt/my ckpts/j",
    "box": "/var/lib/docker/overlay2/7f3c/merged/ckpt",
    "gcs": "gs://bucket/ckpt",
}


@pytest.mark.parametrize(
    ("job", "mountpoint", "fstype", "device", "disks", "lvm"),
    [
        ("vit", "/", "ext4", "nvme0n1", ("nvme0n1",), None),  # partition -> namespace
        ("boot", "/boot/efi", "vfat", "nvme0n1", ("nvme0n1",), None),
        ("llm-a", "/scratch", "xfs", "dm-0", ("nvme1n1", "nvme2n1"), "vg_scratch-lv_ckpt"),
        ("btr", "/data", "btrfs", "sda", ("sda",), None),  # anonymous 0:52 via the source
        ("nfs-job", "/mnt/nfs/ckpt", "nfs4", None, (), None),
        ("ram", "/mnt/my ckpts", "tmpfs", None, (), None),  # \040 unescaped
        (
            "box",
            "/var/lib/docker/overlay2/7f3c/merged",
            "overlay",
            "dm-0",
            ("nvme1n1", "nvme2n1"),
            "vg_scratch-lv_ckpt",
        ),  # through its upperdir on /scratch
    ],
)
def test_recorded_host_maps_each_directory_to_its_target(
    recorded, job, mountpoint, fstype, device, disks, lvm
) -> None:
    storage, _ = recorded
    t = storage.target_of(JOBS[job])
    assert t is not None
    assert (t.mountpoint, t.fstype, t.device, t.disks, t.lvm_name) == (
        mountpoint,
        fstype,
        device,
        disks,
        lvm,
    )


def test_a_url_has_no_target(recorded) -> None:
    storage, _ = recorded
    assert storage.target_of("gs://bucket/ckpt") is None
    assert storage.target_of("") is None


def test_jobs_sharing_a_target_are_grouped(recorded) -> None:
    storage, _ = recorded
    groups = {t.mountpoint: names for t, names in storage.group(JOBS).items()}
    assert groups["/scratch"] == ("llm-a", "llm-b")
    assert groups["/"] == ("vit",)
    assert len(groups) == 7 and not any("gcs" in names for names in groups.values())


def test_recorded_rates_over_two_seconds(recorded) -> None:
    storage, proc = recorded
    first = {s.target: s for s in storage.sample(JOBS, now=100.0)}
    assert all(s.write_bytes_per_s is None for s in first.values())  # no rate on a first sample
    (proc / "diskstats.2s").replace(proc / "diskstats")
    (proc / "self" / "mountstats.2s").replace(proc / "self" / "mountstats")
    s = {x.target: x for x in storage.sample(JOBS, now=102.0)}
    scratch = s["/scratch"]
    assert scratch.device == "dm-0" and scratch.jobs == ("llm-a", "llm-b")
    assert scratch.write_bytes_per_s == 8192000 * 512 / 2
    assert scratch.write_iops == 2500
    assert scratch.busy_fraction == 1.0
    assert scratch.write_latency_s == pytest.approx(15.0 / 5000)
    root = s["/"]
    assert (root.write_bytes_per_s, root.write_iops) == (2048000 * 512 / 2, 600)
    assert root.busy_fraction == pytest.approx(0.4)
    assert root.write_latency_s == pytest.approx(2.4 / 1200)
    nfs = s["/mnt/nfs/ckpt"]
    assert nfs.device is None and nfs.fstype == "nfs4"
    assert nfs.write_bytes_per_s == 1048576000 / 2
    assert nfs.write_iops == 500
    assert nfs.write_latency_s == pytest.approx(25.0 / 1000)  # execute time per WRITE
    assert nfs.busy_fraction is None
    idle = s["/data"]
    assert (idle.write_bytes_per_s, idle.write_iops, idle.busy_fraction) == (0.0, 0.0, 0.0)
    assert idle.write_latency_s is None  # no writes, no latency
    ram = s["/mnt/my ckpts"]
    assert ram.write_bytes_per_s is None and ram.device is None


class Unreadable:
    """Disk counters that cannot be read (what host.disk_counters raises then)."""

    def __call__(self) -> dict[str, host.DiskCounters]:
        raise OSError("disk counters unavailable: no /proc/diskstats and no /sys/block")


def test_missing_sources_give_no_figures_not_an_exception(tmp_path, caplog) -> None:
    storage = st.Storage(tmp_path / "noproc", tmp_path / "nosys")
    assert storage.sample({"a": "/x"}, now=1.0) == ()  # no mountinfo: no target
    proc = tmp_path / "proc"
    shutil.copytree(GPUHOST, proc)
    storage = st.Storage(proc, build_sys(tmp_path), disks=Unreadable(), resolve=os.path.normpath)
    for now in (1.0, 2.0, 3.0):
        (s,) = storage.sample({"a": "/scratch/a"}, now=now)
        assert s.device == "dm-0" and s.write_bytes_per_s is None
    assert sum("disk counters" in r.message for r in caplog.records) == 1


def test_a_counter_reset_gives_no_negative_rate(recorded) -> None:
    storage, proc = recorded
    (proc / "diskstats.2s").replace(proc / "diskstats.later")
    (proc / "diskstats").replace(proc / "diskstats.earlier")
    (proc / "diskstats.later").replace(proc / "diskstats")
    storage.sample({"a": "/scratch/a"}, now=1.0)
    (proc / "diskstats.earlier").replace(proc / "diskstats")
    (s,) = storage.sample({"a": "/scratch/a"}, now=2.0)
    assert s.write_bytes_per_s is None


# ------------------------------------------------------------------ this machine


def test_this_machines_root_mount_has_a_real_block_device(tmp_path) -> None:
    storage = st.Storage()
    t = storage.target_of(str(tmp_path / "not" / "yet" / "created"))
    assert t is not None
    assert t.mountpoint == st.mount_of(os.path.realpath(tmp_path), storage.mounts()).mountpoint
    if t.fstype in st.NETWORK_FS | st.MEMORY_FS:
        pytest.skip(f"tmp_path is on {t.fstype} here")
    assert t.device is not None, t
    assert Path("/sys/class/block", t.device).exists()
    assert t.device in host.disk_counters()


def test_a_directory_not_created_yet_is_resolved_as_often_as_the_mounts_are_read(
    tmp_path,
) -> None:
    """A job announces its directory before its first save creates it: its ancestor's
    target is resolved once per MOUNTS_TTL_S, not at every sample; once the directory
    exists it is resolved at once, and for good. A gone job's entry is dropped."""
    calls: list[str] = []

    def resolve(path: str) -> str:
        calls.append(path)
        return st.existing_ancestor(path)

    storage = st.Storage(resolve=resolve)
    ckpt = tmp_path / "ckpt"
    first = storage.target_of(str(ckpt), now=100.0)
    assert first is not None and len(calls) == 1
    for now in (101.0, 105.0, 109.9):
        assert storage.target_of(str(ckpt), now=now) == first
    assert len(calls) == 1
    assert storage.target_of(str(ckpt), now=110.0) == first
    assert len(calls) == 2  # MOUNTS_TTL_S later: again
    ckpt.mkdir()
    assert storage.target_of(str(ckpt), now=110.5) == first
    assert len(calls) == 3  # created: at once
    for now in (111.0, 200.0):
        storage.target_of(str(ckpt), now=now)
    assert len(calls) == 3  # and for good
    other = str(tmp_path / "other")
    storage.group({"a": other, "b": str(tmp_path / "third")}, now=201.0)
    assert other in storage._uncreated
    storage.group({"a": other}, now=202.0)
    assert list(storage._uncreated) == [other]


def test_bytes_seen_cover_a_real_fsynced_file(tmp_path) -> None:
    """The device counters see at least what the test writes and fsyncs in the window."""
    storage = st.Storage()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    t = storage.target_of(str(ckpt))
    if t is None or t.device is None:
        pytest.skip(f"{tmp_path} is not on a block device here ({t})")
    jobs = {"job": str(ckpt)}
    t0 = time.monotonic()
    storage.sample(jobs, now=t0)
    size = 8 * 1024 * 1024
    data = os.urandom(size)
    written = 0
    with open(ckpt / "state.bin", "wb") as f:
        # a quarter of a second of fsynced writes at least: the device's busy time is
        # counted in jiffies, and one fast 8 MiB fsync showed busy_fraction 0.0 on a VM
        while written == 0 or (time.monotonic() - t0 < 0.25 and written < 16 * size):
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            written += size
    t1 = time.monotonic()
    (s,) = storage.sample(jobs, now=t1)
    assert s.write_bytes_per_s is not None
    assert s.write_bytes_per_s * (t1 - t0) >= written
    assert s.write_iops and s.write_iops > 0
    assert 0.0 < s.busy_fraction <= 1.0
    assert s.write_latency_s is not None and s.write_latency_s >= 0


@pytest.fixture
def tmpfs(tmp_path: Path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_real_tmpfs_is_a_memory_target_without_rates(tmpfs: Path) -> None:
    storage = st.Storage()
    (tmpfs / "ckpt").mkdir()
    jobs = {"a": str(tmpfs / "ckpt"), "b": str(tmpfs / "other")}
    storage.sample(jobs, now=1.0)
    (tmpfs / "ckpt" / "x").write_bytes(b"x" * 4096)
    (s,) = storage.sample(jobs, now=2.0)
    assert (s.mountpoint, s.fstype, s.device, s.jobs) == (str(tmpfs), "tmpfs", None, ("a", "b"))
    assert s.write_bytes_per_s is None and s.busy_fraction is None


def test_a_directory_created_later_as_a_symlink_is_resolved_again(tmp_path, tmpfs: Path) -> None:
    storage = st.Storage()
    ckpt = tmp_path / "ckpt"
    assert storage.target_of(str(ckpt)).fstype != "tmpfs"  # not there yet: its parent's mount
    ckpt.symlink_to(tmpfs)  # the job's first save creates it, on the tmpfs
    assert storage.target_of(str(ckpt)).mountpoint == str(tmpfs)
