"""Where checkpoints land and how busy it is: the only reader of mount and disk stats.

A job's checkpoint directory is mapped to its *storage target*: the mount that
holds it (``/proc/self/mountinfo``), the filesystem type and, for local disks,
the block device that really receives the writes. Partitions resolve to their
disk (``sda1`` -> ``sda``, ``nvme0n1p2`` -> the namespace ``nvme0n1``);
device-mapper/LVM volumes keep their ``dm-N`` device, whose own counters the
kernel keeps, and name the disks beneath them (``/sys/block/dm-N/slaves``);
btrfs' anonymous device numbers resolve through the mount source; an overlay
resolves through its ``upperdir`` when that is visible here. tmpfs/ramfs have
no device and no rates (writes go to memory); a network filesystem (NFS) has
no device and gets per-mount figures from ``/proc/self/mountstats``.

Per target per interval: write bytes/s, write IOPS, busy fraction
(``io_ticks``) and mean write latency (``write_ticks / writes``) from the
device's counters (``/proc/diskstats`` as psutil reads it:
:func:`adaptd.telemetry.host.disk_counters`); for NFS, bytes written to the server,
WRITE ops and their mean execute time. The mount table and NFS ``mountstats`` are
parsed here because psutil has nothing for them (its ``disk_partitions`` lacks the
device numbers and super options that map a mount to its disk; it has no NFS
figures). Sources are injected (``proc`` defaults to psutil's procfs root,
``sys='/sys'``, ``disks=disk_counters``), so tests replay recorded files. A missing
or unreadable source yields ``None`` figures and one log line, never an exception
out of :meth:`Storage.sample`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from adaptd.core.snapshot import Snapshot, StorageSample
from adaptd.telemetry.host import DiskCounters, disk_counters, procfs
from adaptd.telemetry.once import OnceLog
from adaptd.telemetry.source import Sampling

__all__ = [
    "MEMORY_FS",
    "MOUNTS_TTL_S",
    "NETWORK_FS",
    "Mount",
    "Storage",
    "Target",
    "existing_ancestor",
    "mount_of",
    "parse_mountinfo",
    "parse_mountstats",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

NETWORK_FS = frozenset({"nfs", "nfs4"})
MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs"})
#: Seconds between re-reads of mountinfo (mounts change rarely; a miss re-reads at once).
MOUNTS_TTL_S = 10.0

_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of ``/proc/self/mountinfo``."""

    mount_id: int
    parent_id: int
    dev: str  # "major:minor" of the filesystem
    root: str
    mountpoint: str
    fstype: str
    source: str
    super_options: str = ""


def parse_mountinfo(text: str) -> list[Mount]:
    """Mounts in mount order (a later mount on the same point hides earlier ones).

    Parsed by hand: psutil's ``disk_partitions`` has no device numbers, mount roots or
    super options, which map a mount to the disk that receives its writes.
    """
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        a = left.split()
        b = right.split()
        if len(a) < 5 or len(b) < 2:
            continue
        out.append(
            Mount(
                mount_id=int(a[0]),
                parent_id=int(a[1]),
                dev=a[2],
                root=_unescape(a[3]),
                mountpoint=_unescape(a[4]),
                fstype=b[0],
                source=_unescape(b[1]),
                super_options=b[2] if len(b) > 2 else "",
            )
        )
    return out


def mount_of(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """The mount holding ``path`` (already resolved): longest mountpoint prefix, last wins."""
    best: Mount | None = None
    for m in mounts:
        mp = m.mountpoint
        inside = path == mp or path.startswith(mp if mp.endswith("/") else mp + "/")
        if inside and (best is None or len(mp) >= len(best.mountpoint)):
            best = m
    return best


def existing_ancestor(path: str) -> str:
    """``path`` resolved through symlinks, or its nearest existing ancestor's.

    A job announces its checkpoint directory before its first save creates it.
    """
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return os.path.realpath(p)


@dataclass(frozen=True, slots=True)
class Target:
    """A storage target: one mount, and the block device whose counters describe it."""

    mountpoint: str
    fstype: str
    source: str
    device: str | None = None  # the block device read in /proc/diskstats
    disks: tuple[str, ...] = ()  # the physical disks beneath (dm/LVM slaves; else the device)
    lvm_name: str | None = None  # /sys/block/dm-N/dm/name

    @property
    def kind(self) -> str:
        if self.fstype in NETWORK_FS:
            return "network"
        if self.fstype in MEMORY_FS:
            return "memory"
        return "disk" if self.device else "other"


@dataclass(slots=True)
class _NfsCounters:
    bytes_written: int
    write_ops: int
    write_rtt_ms: int
    write_exe_ms: int


def parse_mountstats(text: str) -> dict[str, _NfsCounters]:
    """Per NFS mountpoint: bytes written to the server, WRITE ops, RTT and execute ms.

    Parsed by hand: psutil has no NFS figures.
    """
    out: dict[str, _NfsCounters] = {}
    current: _NfsCounters | None = None
    for line in text.splitlines():
        if line.startswith("device "):
            current = None
            m = re.match(r"device (\S+) mounted on (\S+) with fstype (\S+)", line)
            if m and m.group(3) in NETWORK_FS:
                current = _NfsCounters(0, 0, 0, 0)
                out[_unescape(m.group(2))] = current
            continue
        if current is None:
            continue
        s = line.strip()
        if s.startswith("bytes:"):
            f = s.split()[1:]
            if len(f) >= 6:
                current.bytes_written = int(f[5])  # serverwrite
        elif s.startswith("WRITE:"):
            f = s.split()[1:]
            if len(f) >= 8:
                current.write_ops = int(f[0])
                current.write_rtt_ms = int(f[6])
                current.write_exe_ms = int(f[7])
    return out


class Storage:
    """Maps checkpoint directories to targets and samples their write figures. A
    telemetry source (:mod:`adaptd.telemetry.source`): it fills ``Snapshot.storage``.

    ``proc`` and ``sys`` are the roots of procfs and sysfs (default: the procfs
    psutil reads, and ``/sys``); ``disks`` returns the block devices' counters.
    Tests pass recorded trees, and ``resolve=os.path.normpath`` to map paths of the
    recorded host that do not exist here. :meth:`sample` never raises for missing
    sources.
    """

    def __init__(
        self,
        proc: str | os.PathLike[str] | None = None,
        sys: str | os.PathLike[str] = "/sys",
        *,
        disks: Callable[[], Mapping[str, DiskCounters]] = disk_counters,
        resolve: Callable[[str], str] = existing_ancestor,
    ) -> None:
        self.proc = Path(proc) if proc is not None else procfs()
        self.sys = Path(sys)
        self.disks = disks
        self.resolve = resolve  # path -> the real path whose mount holds it
        self.once = OnceLog(log)
        self._mounts: list[Mount] = []
        self._mounts_at: float | None = None
        self._dirs: dict[str, Target | None] = {}
        #: directories not created yet: their ancestor's target, and when it was resolved
        self._uncreated: dict[str, tuple[Target | None, float]] = {}
        self._prev: dict[str, tuple[float, DiskCounters | _NfsCounters]] = {}

    # ---------------------------------------------------------------- mapping

    def mounts(self, now: float | None = None, *, refresh: bool = False) -> list[Mount]:
        """The mount table, re-read every :data:`MOUNTS_TTL_S` or when asked."""
        stale = self._mounts_at is None or (
            now is not None and now - self._mounts_at >= MOUNTS_TTL_S
        )
        if refresh or stale:
            try:
                text = (self.proc / "self" / "mountinfo").read_text()
            except OSError as exc:
                self.once("mountinfo", logging.WARNING, "storage: cannot read mountinfo: %s", exc)
                text = ""
            mounts = parse_mountinfo(text)
            if mounts != self._mounts:
                self._dirs.clear()
                self._uncreated.clear()
            self._mounts = mounts
            self._mounts_at = now if now is not None else 0.0
        return self._mounts

    def target_of(self, checkpoint_dir: str, now: float | None = None) -> Target | None:
        """The target holding ``checkpoint_dir``; ``None`` for a URL or an unknown mount."""
        if not checkpoint_dir or "://" in checkpoint_dir:
            if checkpoint_dir:
                self.once(
                    ("url", checkpoint_dir.split("://")[0]),
                    logging.INFO,
                    "storage: %s is not a local path; no storage figures for it",
                    checkpoint_dir,
                )
            return None
        mounts = self.mounts(now)
        if checkpoint_dir in self._dirs:
            return self._dirs[checkpoint_dir]
        created = os.path.isdir(checkpoint_dir)
        if not created and now is not None:
            # Not created yet (a job's first save creates it): its nearest existing
            # ancestor's target, resolved again as often as the mount table is re-read
            # (and at once when that changes), not at every sample: 64 such jobs made
            # the walk up their paths a fifth of a daemon's CPU (docs/scale.md).
            known = self._uncreated.get(checkpoint_dir)
            if known is not None and now - known[1] < MOUNTS_TTL_S:
                return known[0]
        path = self.resolve(checkpoint_dir)
        m = mount_of(path, mounts)
        if m is None:
            m = mount_of(path, self.mounts(now, refresh=True))
        target = self._target(m, mounts) if m is not None else None
        if created:  # for good; not yet created: resolve again later (it may be a symlink)
            self._dirs[checkpoint_dir] = target
            self._uncreated.pop(checkpoint_dir, None)
        elif now is not None:
            self._uncreated[checkpoint_dir] = (target, now)
        return target

    def _target(self, m: Mount, mounts: list[Mount], depth: int = 0) -> Target:
        if m.fstype in NETWORK_FS or m.fstype in MEMORY_FS:
            return Target(m.mountpoint, m.fstype, m.source)
        name = self._block_name(m.dev)
        if name is None and m.source.startswith("/dev/"):  # btrfs: anonymous st_dev
            name = self._block_name_of_node(m.source)
        if name is None and m.fstype == "overlay" and depth < 4:
            upper = re.search(r"(?:^|,)upperdir=([^,]+)", m.super_options)
            below = mount_of(self.resolve(upper.group(1)), mounts) if upper else None
            if below is not None and below is not m:
                t = self._target(below, mounts, depth + 1)
                return Target(m.mountpoint, m.fstype, m.source, t.device, t.disks, t.lvm_name)
        if name is None:
            return Target(m.mountpoint, m.fstype, m.source)
        device, disks, lvm = self._resolve(name)
        return Target(m.mountpoint, m.fstype, m.source, device, disks, lvm)

    def _block_name(self, dev: str) -> str | None:
        if dev.startswith("0:"):
            return None
        link = self.sys / "dev" / "block" / dev
        try:
            return Path(os.readlink(link)).name
        except OSError:
            return None

    def _block_name_of_node(self, node: str) -> str | None:
        name = Path(os.path.realpath(node)).name
        return name if (self.sys / "class" / "block" / name).exists() else None

    def _resolve(self, name: str) -> tuple[str, tuple[str, ...], str | None]:
        """(device to read, physical disks beneath, LVM name) for block device ``name``."""
        node = self.sys / "class" / "block" / name
        try:
            real = node.resolve(strict=True)
        except OSError:
            return name, (name,), None
        if (real / "dm" / "name").exists():
            try:
                lvm = (real / "dm" / "name").read_text().strip() or None
            except OSError:
                lvm = None
            disks: list[str] = []
            for slave in sorted((real / "slaves").iterdir()) if (real / "slaves").is_dir() else ():
                _, below, _ = self._resolve(slave.name)
                disks.extend(d for d in below if d not in disks)
            return name, tuple(disks) or (name,), lvm
        if (real / "partition").exists():
            disk = real.parent.name
            return disk, (disk,), None
        return name, (name,), None

    # ---------------------------------------------------------------- sampling

    def collect(self, snapshot: Snapshot, sampling: Sampling) -> Snapshot:
        """The telemetry source: ``snapshot`` with the targets of the jobs' checkpoint
        directories (none while there are no jobs)."""
        if not sampling.jobs:
            return snapshot
        dirs = {j: i.checkpoint_dir for j, i in sampling.jobs.items() if i.checkpoint_dir}
        return replace(snapshot, storage=self.sample(dirs, sampling.now))

    def sample(self, jobs: Mapping[str, str], now: float) -> tuple[StorageSample, ...]:
        """One sample per target of ``jobs`` ({job: checkpoint_dir}), rates since the last call.

        Rates are ``None`` on a target's first sample and for memory filesystems.
        """
        groups = self.group(jobs, now)
        if not groups:
            return ()
        disks = mstats = None
        if any(t.device for t in groups):
            try:
                disks = self.disks()
            except OSError as exc:
                self.once("disks", logging.WARNING, "storage: cannot read disk counters: %s", exc)
        if any(t.fstype in NETWORK_FS for t in groups):
            mstats = self._read("self/mountstats", parse_mountstats)
        out = []
        seen: set[str] = set()
        for t, names in groups.items():
            key = t.mountpoint
            seen.add(key)
            counters: DiskCounters | _NfsCounters | None = None
            if t.device and disks is not None:
                counters = disks.get(t.device)
            elif t.fstype in NETWORK_FS and mstats is not None:
                counters = mstats.get(t.mountpoint)
            rates = self._rates(key, counters, now)
            out.append(
                StorageSample(
                    target=key,
                    mountpoint=t.mountpoint,
                    fstype=t.fstype,
                    device=t.device,
                    jobs=names,
                    **rates,
                )
            )
        for key in list(self._prev):
            if key not in seen:
                del self._prev[key]
        return tuple(sorted(out, key=lambda s: s.target))

    def group(
        self, jobs: Mapping[str, str], now: float | None = None
    ) -> dict[Target, tuple[str, ...]]:
        """Targets with the jobs whose checkpoint directories they hold (sorted job ids).

        Jobs sharing a target compete for its bandwidth: this is what staggering reads.
        """
        groups: dict[Target, list[str]] = {}
        for job, directory in jobs.items():
            t = self.target_of(directory, now)
            if t is not None:
                groups.setdefault(t, []).append(job)
        if len(self._uncreated) > len(jobs):  # the directories of jobs gone
            asked = set(jobs.values())
            self._uncreated = {d: v for d, v in self._uncreated.items() if d in asked}
        return {t: tuple(sorted(names)) for t, names in groups.items()}

    def _read(self, rel: str, parse: Callable[[str], _T]) -> _T | None:
        try:
            return parse((self.proc / rel).read_text())
        except OSError as exc:
            self.once(rel, logging.WARNING, "storage: cannot read %s: %s", self.proc / rel, exc)
            return None

    def _rates(
        self, key: str, counters: DiskCounters | _NfsCounters | None, now: float
    ) -> dict[str, float | None]:
        none: dict[str, float | None] = {
            "write_bytes_per_s": None,
            "write_iops": None,
            "busy_fraction": None,
            "write_latency_s": None,
        }
        if counters is None:
            self._prev.pop(key, None)
            return none
        prev = self._prev.get(key)
        self._prev[key] = (now, counters)
        if prev is None or type(prev[1]) is not type(counters):
            return none
        dt = now - prev[0]
        if dt <= 0:
            return none
        old = prev[1]
        if isinstance(counters, DiskCounters):
            assert isinstance(old, DiskCounters)
            d_writes = counters.writes - old.writes
            d_bytes = counters.bytes_written - old.bytes_written
            if d_writes < 0 or d_bytes < 0:  # counters reset (device re-attached)
                return none
            return {
                "write_bytes_per_s": d_bytes / dt,
                "write_iops": d_writes / dt,
                "busy_fraction": min(1.0, max(0.0, (counters.io_ms - old.io_ms) / 1000.0 / dt)),
                "write_latency_s": (
                    (counters.write_ms - old.write_ms) / 1000.0 / d_writes if d_writes else None
                ),
            }
        assert isinstance(old, _NfsCounters)
        d_ops = counters.write_ops - old.write_ops
        d_bytes = counters.bytes_written - old.bytes_written
        if d_ops < 0 or d_bytes < 0:
            return none
        return {
            "write_bytes_per_s": d_bytes / dt,
            "write_iops": d_ops / dt,
            "busy_fraction": None,  # a server's load is not visible from here
            "write_latency_s": (
                (counters.write_exe_ms - old.write_exe_ms) / 1000.0 / d_ops if d_ops else None
            ),
        }
