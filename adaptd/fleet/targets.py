"""Which storage targets several hosts share, named the same on every host.

A write slot only means something if every host calls the target by the same name:

- an **NFS export** is ``nfs://SERVER/EXPORT``: the server's address from the mount's
  ``addr=`` option (so a host that mounted it by name and one that mounted it by IP
  agree), else the host part of the mount source, and the exported path;
- other **network filesystems** (CIFS/SMB, Lustre, CephFS, GlusterFS, BeeGFS) are
  ``FSTYPE://SOURCE``, the mount source as the mount table shows it;
- an **object store** is ``s3://ENDPOINT/BUCKET`` (``gs://``, ``az://`` likewise): the
  endpoint matters, two S3-compatible services may have buckets of the same name;
- a **local disk** (or tmpfs, overlay, anything else) is never shared: ``None``;
- the operator may **declare** a path shared under a name of their choosing
  (``[storage."PATH"] fleet_name``): FUSE filesystems such as a cloud bucket mount or
  a bind of a network path look local from the mount table.

Pure functions of the mount table (:func:`adaptd.telemetry.storage.parse_mountinfo`);
:func:`read_mounts` is the only reader of ``/proc``.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from adaptd.telemetry.storage import Mount, existing_ancestor, mount_of, parse_mountinfo
from adaptd.tiers.urls import OBJECT_STORES

NFS = frozenset({"nfs", "nfs4"})
#: Network filesystems named by their mount source.
OTHER_NETWORK = frozenset(
    {"cifs", "smb3", "smbfs", "lustre", "ceph", "fuse.ceph", "glusterfs", "fuse.glusterfs"}
    | {"beegfs"}
)


@dataclass(frozen=True, slots=True)
class SharedTarget:
    """A storage target the fleet coordinates on, by its fleet-wide ``name``."""

    name: str
    kind: str  # "nfs", "network", "object" or "declared"


def nfs_name(source: str, super_options: str = "") -> str | None:
    """``nfs://SERVER/EXPORT`` for an NFS mount source ``server:/export`` (IPv6 servers in
    brackets); the ``addr=`` mount option names the server when present."""
    server, sep, export = source.rpartition(":")
    if not sep or not server or not export.startswith("/"):
        return None
    server = server.strip("[]").lower()
    for opt in super_options.split(","):
        key, _, value = opt.partition("=")
        if key == "addr" and value:
            server = value.strip("[]").lower()
    export = posixpath.normpath(export)
    host = f"[{server}]" if ":" in server else server
    return f"nfs://{host}{'' if export == '/' else export}"


def target_of_mount(mount: Mount) -> SharedTarget | None:
    """The shared target a mount is, or ``None`` for a local one."""
    if mount.fstype in NFS:
        name = nfs_name(mount.source, mount.super_options)
        return SharedTarget(name, "nfs") if name else None
    if mount.fstype in OTHER_NETWORK and mount.source:
        return SharedTarget(f"{mount.fstype}://{mount.source.lstrip('/')}", "network")
    return None


def declared_target(path: str, declared: Mapping[str, str]) -> SharedTarget | None:
    """The operator's name for ``path`` (the longest declared path that contains it)."""
    best: tuple[int, str] | None = None
    for root, name in declared.items():
        root = posixpath.normpath(root)
        inside = path == root or path.startswith(root.rstrip("/") + "/")
        if inside and (best is None or len(root) > best[0]):
            best = (len(root), name)
    return SharedTarget(best[1], "declared") if best else None


def not_a_mount_point(path: str, mounts: Sequence[Mount], *, resolve: bool = True) -> str | None:
    """Why ``[fleet.shared]`` cannot use ``path``; ``None`` when it is a mount point.

    Write slots are per mount: the sampler reports each mount as one target and the
    fleet names a target by the declared path equal to its mount point, so a folder
    inside a mount (or a symlink's name) would be silently ignored. An unreadable
    mount table (``mounts`` empty) says nothing against a path. ``resolve``: follow
    symlinks first (tests replaying another host's mount table pass False).
    """
    text = posixpath.normpath(path)
    if not mounts or any(m.mountpoint == text for m in mounts):
        return None
    real = os.path.realpath(text) if resolve else text
    if any(m.mountpoint == real for m in mounts):
        return f"{path!r} is a symlink to the mount point {real!r}: declare {real!r}"
    mount = mount_of(real, mounts)
    if mount is None:  # a mount table without "/": nothing to name
        return f"{path!r} is not a mount point"
    what = f"{mount.fstype} {mount.source}".strip()
    return (
        f"{path!r} is not a mount point but a folder inside the mount {mount.mountpoint!r} "
        f"({what}); write slots are per mount: declare {mount.mountpoint!r} "
        "(or mount the folder on its own)"
    )


def shared_target(
    path: str | os.PathLike[str],
    mounts: Iterable[Mount],
    declared: Mapping[str, str] | None = None,
    *,
    resolve: bool = True,
) -> SharedTarget | None:
    """The shared target a checkpoint directory lives on, or ``None`` (local).

    ``resolve``: follow symlinks of the path (its nearest existing ancestor) first;
    tests replaying another host's mount table pass False.
    """
    text = existing_ancestor(os.fspath(path)) if resolve else posixpath.normpath(os.fspath(path))
    if declared:
        found = declared_target(text, declared)
        if found is not None:
            return found
    mount = mount_of(text, list(mounts))
    return target_of_mount(mount) if mount is not None else None


def object_target(url: str, endpoint: str | None = None) -> SharedTarget | None:
    """``SCHEME://ENDPOINT/BUCKET`` for an object-store URL (``s3://bucket/prefix``), or
    ``None`` for a path. ``endpoint``: the service's URL (e.g. fsspec's ``endpoint_url``);
    without one, the scheme's public service."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in OBJECT_STORES or not parts.netloc:
        return None
    where = urlsplit(endpoint).netloc.lower() if endpoint else "default"
    return SharedTarget(f"{scheme}://{where}/{parts.netloc}", "object")


def read_mounts(proc: str = "/proc") -> list[Mount]:
    """This process's mount table (``[]`` when it cannot be read)."""
    try:
        with open(os.path.join(proc, "self", "mountinfo"), encoding="utf-8") as f:
            return parse_mountinfo(f.read())
    except OSError:
        return []
