"""``[fleet.shared]`` takes mount points only: write slots are per mount.

A sub-folder of a mount declared shared was silently ignored (the sampler reports each
mount as one target, and the fleet names a target by a declared path equal to its
mount point). Now it is refused, naming the mount it belongs to, by
``serve --check-config`` and at start (both read the config through
:func:`adaptd.config.loader.load`). Recorded mount tables (tests/fixtures/proc/fleet) for the
rules; this host's own for the commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptd.cli import main as cli_main
from adaptd.config.fleet import parse_fleet
from adaptd.fleet.targets import not_a_mount_point, read_mounts
from adaptd.telemetry.storage import mount_of, parse_mountinfo

HOST_A = parse_mountinfo(
    (Path(__file__).parents[1] / "fixtures" / "proc" / "fleet" / "host-a.mountinfo").read_text()
)


@pytest.mark.parametrize("path", ["/mnt/nfs/ckpt", "/mnt/nfs/ckpt/", "/scratch", "/mnt/my ckpts"])
def test_a_mount_point_is_accepted(path) -> None:
    assert not_a_mount_point(path, HOST_A, resolve=False) is None


@pytest.mark.parametrize(
    ("path", "mount", "what"),
    [
        ("/mnt/nfs/ckpt/job-1", "/mnt/nfs/ckpt", "nfs4 10.0.4.20:/export/ckpt"),
        ("/scratch/ckpts", "/scratch", "xfs /dev/mapper/vg_scratch-lv_ckpt"),
        ("/mnt/nfs", "/", "ext4 /dev/nvme0n1p2"),  # the folder a mount sits in is not it
    ],
)
def test_a_folder_inside_a_mount_is_refused_naming_the_mount(path, mount, what) -> None:
    assert not_a_mount_point(path, HOST_A, resolve=False) == (
        f"{path!r} is not a mount point but a folder inside the mount {mount!r} ({what}); "
        f"write slots are per mount: declare {mount!r} (or mount the folder on its own)"
    )


def test_parse_fleet_refuses_it_with_the_key() -> None:
    table = {"etcd": ["http://e:2379"], "shared": {"/scratch": "x", "/mnt/nfs/ckpt/j": "y"}}
    with pytest.raises(ValueError, match=r"^fleet\.shared: '/mnt/nfs/ckpt/j' is not a mount"):
        parse_fleet(table, mounts=HOST_A)
    assert parse_fleet({**table, "shared": {"/scratch": "x"}}, mounts=HOST_A) is not None
    # a host whose mount table cannot be read has nothing to say against a path
    assert parse_fleet(table, mounts=[]) is not None


def config(tmp_path: Path, shared: Path) -> Path:
    path = tmp_path / "adaptd.toml"
    path.write_text(
        '[fleet]\netcd = ["http://127.0.0.1:1"]\n'
        f'[fleet.shared]\n{json.dumps(str(shared))} = "test://shared"\n'
    )
    return path


def test_check_config_and_start_refuse_a_sub_folder_naming_its_mount(tmp_path, capsys) -> None:
    folder = tmp_path / "ckpts"
    folder.mkdir()
    mount = mount_of(str(folder.resolve()), read_mounts())
    assert mount is not None and mount.mountpoint != str(folder)  # tmp is not a mount
    cfg = config(tmp_path, folder)
    for args in (["--check-config"], ["--check-config", "--json"], []):
        rc = cli_main(["serve", "--config", str(cfg), *args])
        out, err = capsys.readouterr()
        assert (rc, out) == (1, ""), err
        assert err.startswith(f"adaptd serve: {cfg}: fleet.shared: {str(folder)!r} is not a mount")
        assert f"inside the mount {mount.mountpoint!r}" in err, err


def test_a_symlink_to_a_mount_point_is_refused_naming_the_mount_point(tmp_path, capsys) -> None:
    link = tmp_path / "root-link"
    link.symlink_to("/")  # "/" is a mount point on every host
    rc = cli_main(["serve", "--check-config", "--config", str(config(tmp_path, link))])
    err = capsys.readouterr().err
    assert rc == 1 and f"{str(link)!r} is a symlink to the mount point '/': declare '/'" in err
    ok = config(tmp_path, Path("/"))
    assert cli_main(["serve", "--check-config", "--config", str(ok)]) == 0
    assert '"/" = "test://shared"' in capsys.readouterr().out
