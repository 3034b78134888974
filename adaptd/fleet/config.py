"""The daemon's ``[fleet]`` section as the fleet uses it: which etcd, who this host is,
how slots are shared.

::

    [fleet]
    etcd = ["https://etcd1:2379", "https://etcd2:2379", "https://etcd3:2379"]
    prefix = "/adaptd/"              # every key of this fleet lives under it
    host = "gpu-node-17"             # default: the host name
    user = "gpu-node-17"             # etcd user (a role per host: docs/fleet.md)
    password_file = "/etc/adaptd/etcd-password"   # or password = "..."
    ca_file = "/etc/adaptd/etcd-ca.pem"
    cert_file = "/etc/adaptd/etcd-client.pem"      # client certificate (optional)
    key_file = "/etc/adaptd/etcd-client.key"
    lease_ttl_s = 10                 # a dead daemon's slots free within this
    call_timeout_s = 1.0             # one etcd request
    slots = 2                        # fleet-wide saves at once on a shared target whose
                                     # [storage."NAME"] sets no max_concurrent_saves
    [fleet.shared]                   # paths the mount table cannot tell are shared
    "/mnt/bucket" = "gcs://ckpt-bucket"

Each key is declared once, with the daemon's other settings, in
:data:`adaptd.config.schema.FLEET_SETTINGS` (type, default, check, meaning; the docs
table comes from there), and the config loader reads the section with it into a
:class:`FleetConfig`. ``adaptd serve --etcd URL`` (repeatable) and ``ADAPTD_ETCD``
(comma-separated URLs) give the endpoints without a file, or replace the file's;
without endpoints there is no fleet (``Config.fleet`` is ``None``).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from adaptd.fleet.session import FleetSettings

__all__ = ["ETCD_ENV", "SLOTS", "FleetConfig", "endpoints_from", "this_host", "with_endpoints"]

ETCD_ENV = "ADAPTD_ETCD"
#: Fleet-wide saves at once on a shared target without a limit of its own.
SLOTS = 2


@dataclass(frozen=True)
class FleetConfig:
    """A validated ``[fleet]`` section: how to reach etcd (``settings``), the slots of a
    shared target without a limit of its own, the paths declared shared, and the
    timings that are not settings of the file."""

    settings: FleetSettings
    slots: int = SLOTS
    shared: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: the file the password was read from (``None``: given in the file, or none)
    password_file: str | None = None
    #: a view older than this reads as "etcd away": decide locally
    stale_after_s: float = 3.0
    #: a granted slot no save started on within this is given back
    grant_timeout_s: float = 120.0
    #: how often this host's failure knowledge is written
    publish_every_s: float = 30.0
    #: an upload waits at most this long for a slot, then goes ahead without one
    upload_wait_s: float = 600.0

    @property
    def password(self) -> str | None:
        """The password as the file gave it: ``None`` when it came from ``password_file``
        (so the section written back names the file, not a copy of its secret)."""
        return None if self.password_file is not None else self.settings.password


def this_host() -> str:
    """This host's name in the fleet when ``[fleet] host`` names none."""
    return socket.gethostname()


def endpoints_from(env: Mapping[str, str], flags: Sequence[str] | None) -> tuple[str, ...]:
    """``--etcd`` flags, else ``ADAPTD_ETCD`` (comma-separated), else nothing."""
    if flags:
        return tuple(flags)
    return tuple(u.strip() for u in env.get(ETCD_ENV, "").split(",") if u.strip())


def with_endpoints(fleet: FleetConfig | None, urls: Sequence[str]) -> FleetConfig:
    """``fleet`` with its etcd endpoints replaced (``serve --etcd``); a fleet of defaults
    when there was none. Raises :class:`~adaptd.fleet.session.FleetSettingError` (a
    :class:`ValueError`) for a bad URL."""
    if fleet is None:
        return FleetConfig(settings=FleetSettings(endpoints=tuple(urls), host=this_host()))
    return replace(fleet, settings=replace(fleet.settings, endpoints=tuple(urls)))
