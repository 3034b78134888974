"""slowfs: a FUSE passthrough mount whose writes share one bandwidth cap (a stand-in NFS server).

A shared NFS server gives every client together a fixed bandwidth; when N training
jobs checkpoint at the same moment (a "save storm") each gets about 1/N of it. This
mount reproduces that on one machine: every write (and, with ``--throttle-reads``,
every read) of every process passes through ONE token bucket, so the writers share
``--bandwidth-mib-s`` between them; ``--latency-ms`` adds a fixed delay to every
request (a network round trip). Everything else is a plain passthrough to the
backing directory (create, open, read, write, rename, fsync, readdir, getattr,
unlink, mkdir, rmdir, truncate, statfs, chmod, utimens, symlink, link), enough for
TensorFlow checkpoints and fsspec.

The token bucket is deliberately its own small class, not ``adaptd.tiers``'s
``Throttle``: this mount is the yardstick that a cap in adaptd is measured against,
so it must not share that code.

Command line (prints ``slowfs: ready ...`` on stdout once mounted; SIGTERM or SIGINT
unmounts and exits 0, after a last ``slowfs: stats {json}`` line)::

    python scripts/slowfs.py BACKING MOUNT --bandwidth-mib-s 100 [--latency-ms 2]

From Python (benchmarks, tests)::

    from slowfs import slow_mount          # with scripts/ on sys.path
    with slow_mount(backing, mount, bandwidth_mib_s=100) as fs:
        ...                                # write under fs.mount
    fs.stats                               # {"bytes_written": ..., "writes": ..., ...}

Self-test (writes 64 MiB with dd through a 50 MiB/s mount, checks the rate)::

    python scripts/slowfs.py --self-test

Needs the FUSE library (Debian: ``fuse3``, installed by scripts/install-test-deps.sh),
the ``mfusepy`` binding (the dev extra), /dev/fuse, and root (or a user allowed to
mount FUSE filesystems).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 2**20
READY = "slowfs: ready"
STATS = "slowfs: stats "
# Largest FUSE request: fewer, bigger writes cost this Python server less CPU.
MAX_WRITE = MIB


class SlowFSError(RuntimeError):
    """The mount could not be set up (no FUSE library, no permission, bad directory)."""


class TokenBucket:
    """One bandwidth shared by every caller: ``take(n)`` blocks until ``n`` bytes may pass.

    A virtual-clock bucket (GCRA): each ``take`` reserves the next ``n / rate`` seconds
    of the link under a lock, then sleeps outside it until its slot. Callers are
    therefore served in arrival order and together never exceed ``rate`` bytes/s,
    apart from an initial ``burst_bytes`` after an idle spell.
    """

    def __init__(
        self,
        rate_bytes_s: float,
        *,
        burst_bytes: int = 256 * 1024,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate_bytes_s > 0:
            raise ValueError(f"rate_bytes_s must be > 0, got {rate_bytes_s!r}")
        if burst_bytes < 0:
            raise ValueError(f"burst_bytes must be >= 0, got {burst_bytes!r}")
        self.rate = float(rate_bytes_s)
        self._burst_s = burst_bytes / self.rate
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tat = clock() - self._burst_s  # when the link has sent all it was given
        self.waited_s = 0.0

    def take(self, n: int) -> float:
        """Block until ``n`` bytes may pass; returns the seconds waited."""
        if n <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            # the link is free from _tat on; an idle link banks at most burst_s of credit
            self._tat = max(self._tat, now - self._burst_s) + n / self.rate
            wait = self._tat - now
            if wait > 0:
                self.waited_s += wait
        if wait > 0:
            self._sleep(wait)
            return wait
        return 0.0


def unavailable() -> str | None:
    """Why slowfs cannot mount on this machine, naming what to install; None when it can.

    Tests skip with this reason instead of failing where FUSE is truly missing.
    """
    if not os.path.exists("/dev/fuse"):
        return (
            "no /dev/fuse on this machine (load the fuse module, or give the "
            "container the device: --device /dev/fuse)"
        )
    try:
        _operations_class()
    except SlowFSError as exc:
        return str(exc)
    return None


def _operations_class() -> type:
    """The passthrough Operations class (built lazily: importing mfusepy loads libfuse)."""
    try:
        import mfusepy as fuse
    except (ImportError, OSError) as exc:  # OSError/EnvironmentError: libfuse not found
        raise SlowFSError(
            f"slowfs needs the mfusepy binding and the FUSE library ({exc}); "
            "install the dev extra (pip install mfusepy) and the Debian package fuse3 "
            "(`make test` installs it as root: scripts/install-test-deps.sh)"
        ) from exc

    class Passthrough(fuse.Operations):
        """Every path maps onto ``root``; data passes ``bucket``; ``latency_s`` per request."""

        use_ns = True  # timestamps in integer nanoseconds, as os.stat_result gives them

        def __init__(
            self,
            root: Path,
            bucket: TokenBucket,
            *,
            latency_s: float = 0.0,
            throttle_reads: bool = False,
            on_ready: Callable[[], None] | None = None,
        ) -> None:
            self.root = str(root)
            self.bucket = bucket
            self.latency_s = latency_s
            self.throttle_reads = throttle_reads
            self.on_ready = on_ready
            self._count_lock = threading.Lock()
            self.counts = {"bytes_written": 0, "writes": 0, "bytes_read": 0, "reads": 0}

        # -- helpers
        def _p(self, path: str) -> str:
            return self.root + path  # FUSE paths are absolute within the mount

        def _delay(self) -> None:
            if self.latency_s > 0:
                time.sleep(self.latency_s)

        def _count(self, bytes_key: str, ops_key: str, n: int) -> None:
            with self._count_lock:
                self.counts[bytes_key] += n
                self.counts[ops_key] += 1

        # -- lifecycle
        def init_with_config(self, conn: Any, config: Any) -> None:
            if conn is not None:
                # Bigger requests: fewer round trips through this Python server. libfuse
                # asks the kernel for enough pages per request to match.
                conn.max_write = MAX_WRITE
            if self.on_ready is not None:
                self.on_ready()

        # -- metadata
        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            self._delay()
            st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_dev")
            attrs = {k: getattr(st, k) for k in keys}
            attrs["st_blocks"] = st.st_blocks
            attrs["st_blksize"] = st.st_blksize
            attrs["st_atime"] = st.st_atime_ns
            attrs["st_mtime"] = st.st_mtime_ns
            attrs["st_ctime"] = st.st_ctime_ns
            return attrs

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._p(path), amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

        def readdir(self, path: str, fh: int) -> list[str]:
            self._delay()
            return [".", "..", *os.listdir(self._p(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(self._p(path))

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(self._p(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree")
            keys += ("f_files", "f_flag", "f_frsize", "f_namemax")
            return {k: getattr(sv, k) for k in keys}

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._p(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self._p(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            if times is None:
                os.utime(self._p(path))
            else:
                os.utime(self._p(path), ns=(int(times[0]), int(times[1])))
            return 0

        # -- namespace
        def mkdir(self, path: str, mode: int) -> int:
            self._delay()
            os.mkdir(self._p(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            self._delay()
            os.rmdir(self._p(path))
            return 0

        def unlink(self, path: str) -> int:
            self._delay()
            os.unlink(self._p(path))
            return 0

        def rename(self, old: str, new: str) -> int:
            self._delay()
            os.rename(self._p(old), self._p(new))
            return 0

        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, self._p(target))
            return 0

        def link(self, target: str, source: str) -> int:
            os.link(self._p(source), self._p(target))
            return 0

        def mknod(self, path: str, mode: int, dev: int) -> int:
            os.mknod(self._p(path), mode, dev)
            return 0

        # -- files
        def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
            self._delay()
            return os.open(self._p(path), flags | os.O_CREAT, mode)

        def open(self, path: str, flags: int) -> int:
            self._delay()
            return os.open(self._p(path), flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            self._delay()
            if self.throttle_reads:
                self.bucket.take(size)
            data = os.pread(fh, size, offset)
            self._count("bytes_read", "reads", len(data))
            return data

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            self._delay()
            self.bucket.take(len(data))
            n = os.pwrite(fh, data, offset)
            self._count("bytes_written", "writes", n)
            return n

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            self._delay()
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._p(path), length)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0  # writes reach the backing file synchronously; nothing is buffered here

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            self._delay()
            if datasync:
                os.fdatasync(fh)
            else:
                os.fsync(fh)
            return 0

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

    Passthrough.fuse = fuse  # type: ignore[attr-defined]
    return Passthrough


def serve(
    backing: Path,
    mount: Path,
    *,
    bandwidth_mib_s: float,
    latency_ms: float = 0.0,
    throttle_reads: bool = False,
    out: Any = None,
) -> dict[str, Any]:
    """Mount and serve in the foreground until SIGTERM/SIGINT; returns the counters.

    Prints the ready line on ``out`` (stdout) once the kernel has initialised the
    mount. Raises SlowFSError for a bad directory or when FUSE cannot mount.
    """
    out = out or sys.stdout
    backing, mount = Path(backing).resolve(), Path(mount).absolute()
    if not backing.is_dir():
        raise SlowFSError(f"backing directory {backing} does not exist")
    if not mount.is_dir():
        raise SlowFSError(f"mount point {mount} does not exist (create an empty directory)")
    if not bandwidth_mib_s > 0:
        raise SlowFSError(f"--bandwidth-mib-s must be > 0, got {bandwidth_mib_s}")
    if latency_ms < 0:
        raise SlowFSError(f"--latency-ms must be >= 0, got {latency_ms}")
    bucket = TokenBucket(bandwidth_mib_s * MIB)
    started = time.monotonic()

    mounted = threading.Event()

    def ready() -> None:
        mounted.set()
        print(
            f"{READY} {mount} -> {backing} ({bandwidth_mib_s:g} MiB/s shared, "
            f"latency {latency_ms:g} ms, reads {'throttled' if throttle_reads else 'free'})",
            file=out,
            flush=True,
        )

    ops_cls = _operations_class()
    ops = ops_cls(
        backing,
        bucket,
        latency_s=latency_ms / 1000,
        throttle_reads=throttle_reads,
        on_ready=ready,
    )
    try:
        ops_cls.fuse.FUSE(
            ops,
            str(mount),
            foreground=True,
            nothreads=False,
            fsname="slowfs",
        )
    except RuntimeError as exc:
        # libfuse's fuse_main returns 8 when its loop ends on a signal (SIGTERM/SIGINT/
        # SIGHUP: the normal way to stop); any earlier failure means nothing was served.
        if not (mounted.is_set() and str(exc) == "8"):
            raise SlowFSError(
                f"FUSE could not mount {mount}: fuse_main returned {exc} (see the lines above)"
            ) from exc
    stats = dict(ops.counts, throttled_s=round(bucket.waited_s, 3))
    stats["seconds"] = round(time.monotonic() - started, 3)
    return stats


# ------------------------------------------------------------------- from Python


@dataclass
class SlowMount:
    """A running slowfs server (``slow_mount``'s value); ``stats`` is filled after it stops."""

    backing: Path
    mount: Path
    bandwidth_mib_s: float
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    stats: dict[str, Any] | None = None


def _unmount_lazily(mount: Path) -> None:
    """Last resort for a mount whose server died: detach it so the directory is usable."""
    for cmd in (["fusermount3", "-u", "-z", str(mount)], ["umount", "-l", str(mount)]):
        if shutil.which(cmd[0]):
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            if not os.path.ismount(mount):
                return


@contextlib.contextmanager
def slow_mount(
    backing: Path,
    mount: Path,
    *,
    bandwidth_mib_s: float,
    latency_ms: float = 0.0,
    throttle_reads: bool = False,
    ready_timeout_s: float = 30.0,
    stop_timeout_s: float = 30.0,
) -> Iterator[SlowMount]:
    """Run slowfs in a child process for the ``with`` block; unmounts at the end.

    The server is a separate process so its FUSE threads never contend for the
    caller's GIL, and a crash of the caller cannot leave it serving. Raises
    SlowFSError (with the server's output) if it does not print its ready line in
    ``ready_timeout_s``.
    """
    backing, mount = Path(backing), Path(mount)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        str(backing),
        str(mount),
        "--bandwidth-mib-s",
        str(bandwidth_mib_s),
        "--latency-ms",
        str(latency_ms),
    ]
    if throttle_reads:
        cmd.append("--throttle-reads")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    fs = SlowMount(backing, mount, bandwidth_mib_s, proc)
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            line = line.rstrip("\n")
            fs.lines.append(line)
            if line.startswith(READY):
                ready.set()
            elif line.startswith(STATS):
                fs.stats = json.loads(line[len(STATS) :])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        end = time.monotonic() + ready_timeout_s
        while not ready.wait(0.05):
            if proc.poll() is not None or time.monotonic() > end:
                why = (
                    f"exited with status {proc.returncode}"
                    if proc.poll() is not None
                    else f"was not ready within {ready_timeout_s:g}s"
                )
                raise SlowFSError(f"slowfs {why}; its output:\n" + "\n".join(fs.lines))
        yield fs
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
        if os.path.ismount(mount):
            _unmount_lazily(mount)


# ------------------------------------------------------------------- self-test


def self_test(mib: int = 64, rate: float = 50.0, tolerance: float = 0.15) -> int:
    """dd ``mib`` MiB through a ``rate`` MiB/s mount; 0 if the measured rate is within tolerance."""
    root = Path(tempfile.mkdtemp(prefix="slowfs-selftest-"))
    try:
        (root / "backing").mkdir()
        (root / "mnt").mkdir()
        with slow_mount(root / "backing", root / "mnt", bandwidth_mib_s=rate) as fs:
            t0 = time.monotonic()
            subprocess.run(
                ["dd", "if=/dev/zero", f"of={root / 'mnt' / 'file'}", "bs=1M", f"count={mib}"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            seconds = time.monotonic() - t0
            size = (root / "backing" / "file").stat().st_size
        measured = size / MIB / seconds
        ok = size == mib * MIB and abs(measured - rate) <= tolerance * rate
        print(
            f"slowfs self-test: {size / MIB:.0f} MiB in {seconds:.2f}s = {measured:.1f} MiB/s "
            f"(cap {rate:g} MiB/s, ±{tolerance:.0%}): {'ok' if ok else 'FAILED'}; "
            f"server stats {fs.stats}"
        )
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backing", nargs="?", help="the directory that holds the files")
    parser.add_argument("mount", nargs="?", help="an empty directory to mount on")
    parser.add_argument(
        "--bandwidth-mib-s", type=float, default=100.0, help="shared cap (default 100)"
    )
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    parser.add_argument(
        "--throttle-reads", action="store_true", help="reads take from the same bucket"
    )
    parser.add_argument("--self-test", action="store_true", help="dd 64 MiB at 50 MiB/s, check")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.backing or not args.mount:
        parser.error("BACKING and MOUNT are required (or --self-test)")
    # libfuse unmounts and returns on SIGTERM/SIGINT/SIGHUP only if they are at their
    # default disposition when it starts; Python's own SIGINT handler would swallow it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        stats = serve(
            Path(args.backing),
            Path(args.mount),
            bandwidth_mib_s=args.bandwidth_mib_s,
            latency_ms=args.latency_ms,
            throttle_reads=args.throttle_reads,
        )
    except SlowFSError as exc:
        print(f"slowfs: {exc}", file=sys.stderr, flush=True)
        return 1
    print(STATS + json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
