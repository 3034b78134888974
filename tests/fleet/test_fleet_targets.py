"""Storage targets named the same on every host, from recorded mount tables.

host-a.mountinfo and host-b.mountinfo (tests/fixtures/proc/fleet) are two hosts of one
cluster: host-a mounts the checkpoint export by IP on /mnt/nfs/ckpt, host-b by name on
/shared/checkpoints; the kernel's ``addr=`` option names the same server on both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptd.fleet.keys import KeySpace, range_end
from adaptd.fleet.targets import (
    SharedTarget,
    nfs_name,
    object_target,
    read_mounts,
    shared_target,
)
from adaptd.telemetry.storage import parse_mountinfo

FIXTURES = Path(__file__).parents[1] / "fixtures" / "proc" / "fleet"


def mounts(host: str):
    return parse_mountinfo((FIXTURES / f"{host}.mountinfo").read_text())


def target(host: str, path: str, declared=None) -> SharedTarget | None:
    return shared_target(path, mounts(host), declared, resolve=False)


def test_one_nfs_export_has_one_name_on_every_host():
    a = target("host-a", "/mnt/nfs/ckpt/job-1")
    b = target("host-b", "/shared/checkpoints/job-2")
    assert a == b == SharedTarget("nfs://10.0.4.20/export/ckpt", "nfs")


@pytest.mark.parametrize(
    ("host", "path", "name"),
    [
        ("host-a", "/mnt/home/u/ckpt", "nfs://10.0.4.21/export/home"),  # NFSv3, trailing /
        ("host-a", "/mnt/my ckpts/j", "nfs://[fd00::20]/export/ckpt"),  # IPv6, escaped space
        ("host-a", "/lustre/scratch/j", "lustre://10.0.5.1@o2ib:/scratch"),
        ("host-a", "/mnt/smb/j", "cifs://fileserver/ckpts"),
        ("host-a", "/scratch/ckpt", None),  # local LVM volume
        ("host-a", "/home/u/ckpt", None),  # the root ext4
        ("host-a", "/run/ckpt", None),  # tmpfs
        ("host-b", "/data/ckpt", None),  # local btrfs
    ],
)
def test_network_filesystems_are_shared_and_local_disks_never(host, path, name):
    got = target(host, path)
    assert (got.name if got else None) == name


def test_an_operator_declares_a_path_shared():
    declared = {"/scratch": "gcs://bucket-behind-fuse", "/scratch/private": "private"}
    assert target("host-a", "/scratch/ckpt", declared) == SharedTarget(
        "gcs://bucket-behind-fuse", "declared"
    )
    assert target("host-a", "/scratch/private/x", declared).name == "private"  # longest wins
    # a declaration wins over the mount table
    assert target("host-a", "/mnt/nfs/ckpt/j", {"/mnt/nfs": "nfs-a"}).name == "nfs-a"


def test_nfs_sources_without_a_server_are_not_named():
    assert nfs_name("/dev/sda") is None
    assert nfs_name("server:relative") is None
    assert nfs_name("Server.Example:/x/", "rw,addr=") == "nfs://server.example/x"


@pytest.mark.parametrize(
    ("url", "endpoint", "name"),
    [
        ("s3://ckpts/prefix/job", None, "s3://default/ckpts"),
        ("s3://ckpts/other", "http://minio.local:9000", "s3://minio.local:9000/ckpts"),
        ("gs://bucket/x", None, "gs://default/bucket"),
        ("/mnt/nfs/ckpt", None, None),
        ("file:///tmp/x", None, None),
    ],
)
def test_object_stores_are_named_by_endpoint_and_bucket(url, endpoint, name):
    got = object_target(url, endpoint)
    assert (got.name if got else None) == name


def test_this_hosts_mount_table_reads(tmp_path):
    assert read_mounts(str(tmp_path)) == []  # no mountinfo: nothing, no exception
    assert any(m.mountpoint == "/" for m in read_mounts())


def test_keys_split_back_into_their_parts():
    keys = KeySpace("/adaptd/")
    key = keys.claim("host-a", "nfs://10.0.4.20/export/ckpt", "team/job 1")
    assert key.startswith(keys.host_claims("host-a"))
    assert keys.claim_parts(key) == ("host-a", "nfs://10.0.4.20/export/ckpt", "team/job 1")
    assert keys.failure_parts(keys.failure("h", "NVIDIA H100 80GB HBM3")) == (
        "h",
        "NVIDIA H100 80GB HBM3",
    )
    assert keys.member_host(keys.member("h")) == "h"
    assert keys.claim_parts("/adaptd/claims/only-host") is None
    assert range_end("/adaptd/") == "/adaptd0"
    with pytest.raises(ValueError, match="start and end with '/'"):
        KeySpace("adaptd")
