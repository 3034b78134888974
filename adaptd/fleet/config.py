"""The daemon's ``[fleet]`` section: which etcd, who this host is, how slots are shared.

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

``adaptd serve --etcd URL`` (repeatable) and ``ADAPTD_ETCD`` (comma-separated URLs)
give the endpoints without a file, or replace the file's. :func:`parse_fleet`
returns ``None`` when neither names an endpoint: no fleet, nothing changes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from adaptd.fleet.session import FleetSettings
from adaptd.fleet.targets import not_a_mount_point, read_mounts
from adaptd.telemetry.storage import Mount

ETCD_ENV = "ADAPTD_ETCD"
KEYS = (
    "etcd",
    "prefix",
    "host",
    "user",
    "password",
    "password_file",
    "ca_file",
    "cert_file",
    "key_file",
    "lease_ttl_s",
    "call_timeout_s",
    "slots",
    "shared",
)


@dataclass(frozen=True)
class FleetConfig:
    """A validated ``[fleet]`` section."""

    settings: FleetSettings
    slots: int = 2
    shared: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: a view older than this reads as "etcd away": decide locally
    stale_after_s: float = 3.0
    #: a granted slot no save started on within this is given back
    grant_timeout_s: float = 120.0
    #: how often this host's failure knowledge is written
    publish_every_s: float = 30.0
    #: an upload waits at most this long for a slot, then goes ahead without one
    upload_wait_s: float = 600.0

    def as_table(self) -> dict[str, Any]:
        """The section as the file writes it (``serve --check-config``); the password
        is ``"***"``."""
        s = self.settings
        return {
            "etcd": list(s.endpoints),
            "prefix": s.prefix,
            "host": s.host,
            "user": s.user,
            "password": None if s.password is None else "***",
            "ca_file": s.ca_file,
            "cert_file": s.cert_file,
            "key_file": s.key_file,
            "lease_ttl_s": s.lease_ttl_s,
            "call_timeout_s": s.call_timeout_s,
            "slots": self.slots,
            "shared": dict(self.shared),
        }


def endpoints_from(env: Mapping[str, str], flags: Sequence[str] | None) -> tuple[str, ...]:
    """``--etcd`` flags, else ``ADAPTD_ETCD`` (comma-separated), else nothing."""
    if flags:
        return tuple(flags)
    return tuple(u.strip() for u in env.get(ETCD_ENV, "").split(",") if u.strip())


def with_endpoints(fleet: FleetConfig | None, urls: Sequence[str]) -> FleetConfig:
    """``fleet`` with its etcd endpoints replaced (``serve --etcd``); a fleet of defaults
    when there was none. Raises :class:`ValueError` for a bad URL."""
    if fleet is None:
        made = parse_fleet({}, endpoints=urls)
        assert made is not None
        return made
    return replace(fleet, settings=replace(fleet.settings, endpoints=tuple(urls)))


def parse_fleet(
    table: Any,
    *,
    endpoints: Sequence[str] = (),
    hostname: str | None = None,
    mounts: Sequence[Mount] | None = None,
) -> FleetConfig | None:
    """Validate ``[fleet]`` (``table``: the parsed TOML table or ``None``); ``endpoints``
    (from the command line or environment) replace its ``etcd``. Every ``[fleet.shared]``
    path must be a mount point of ``mounts`` (default: this host's mount table,
    :func:`~adaptd.fleet.targets.read_mounts`). Raises :class:`ValueError` whose
    message starts with the dotted key at fault."""
    if table is None:
        table = {}
    if not isinstance(table, Mapping):
        raise ValueError("fleet: must be a table ([fleet])")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ValueError(f"fleet.{unknown[0]}: unknown setting; known: {', '.join(KEYS)}")
    urls = tuple(endpoints) or tuple(_strings(table, "etcd"))
    if not urls:
        if table:
            raise ValueError(
                'fleet.etcd: give the etcd endpoints, e.g. etcd = ["http://127.0.0.1:2379"] '
                f"(or --etcd / {ETCD_ENV})"
            )
        return None
    password = _string(table, "password")
    if "password_file" in table:
        if password is not None:
            raise ValueError("fleet.password_file: set password or password_file, not both")
        path = Path(_string(table, "password_file") or "")
        try:
            password = path.read_text().strip()
        except OSError as exc:
            raise ValueError(f"fleet.password_file: cannot read {path}: {exc.strerror}") from None
    files = {k: _string(table, k) for k in ("ca_file", "cert_file", "key_file")}
    for key, value in files.items():
        if value is not None and not os.path.isfile(value):
            raise ValueError(f"fleet.{key}: {value!r} is not a file")
    try:
        settings = FleetSettings(
            endpoints=urls,
            host=_string(table, "host") or hostname or socket.gethostname(),
            prefix=_string(table, "prefix") or "/adaptd/",
            user=_string(table, "user"),
            password=password,
            ca_file=files["ca_file"],
            cert_file=files["cert_file"],
            key_file=files["key_file"],
            lease_ttl_s=int(_number(table, "lease_ttl_s", 10, integer=True)),
            call_timeout_s=_number(table, "call_timeout_s", 1.0),
            call_deadline_s=max(2.5, 2.5 * _number(table, "call_timeout_s", 1.0)),
        )
    except ValueError as exc:
        raise ValueError(_dotted(str(exc))) from None
    slots = int(_number(table, "slots", 2, integer=True))
    if slots < 1:
        raise ValueError(f"fleet.slots: must be >= 1, got {slots}")
    shared = table.get("shared", {})
    if not isinstance(shared, Mapping) or not all(
        isinstance(k, str) and os.path.isabs(k) and isinstance(v, str) and v
        for k, v in shared.items()
    ):
        raise ValueError(
            'fleet.shared: must map absolute paths to names, e.g. "/mnt/bucket" = "gcs://b"'
        )
    if shared:
        table_of_mounts = read_mounts() if mounts is None else mounts
        for path in shared:
            why = not_a_mount_point(path, table_of_mounts, resolve=mounts is None)
            if why is not None:
                raise ValueError(f"fleet.shared: {why}")
    return FleetConfig(settings=settings, slots=slots, shared=MappingProxyType(dict(shared)))


def _string(t: Mapping[str, Any], key: str) -> str | None:
    v = t.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise ValueError(f"fleet.{key}: must be a non-empty string, got {v!r}")
    return v


def _strings(t: Mapping[str, Any], key: str) -> list[str]:
    v = t.get(key, [])
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise ValueError(f"fleet.{key}: must be a list of URLs, got {v!r}")
    return v


def _number(t: Mapping[str, Any], key: str, default: float, *, integer: bool = False) -> float:
    v = t.get(key, default)
    ok = isinstance(v, int) if integer else isinstance(v, int | float)
    if isinstance(v, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"fleet.{key}: must be {kind}, got {v!r}")
    return float(v)


def _dotted(message: str) -> str:
    """A :class:`FleetSettings` message as ``fleet.KEY: ...`` (the config's errors name the
    key, then say what is wrong): ``fleet: lease_ttl_s must be ...`` named the whole
    sentence as the key. A message about no one key stays ``fleet: ...``."""
    head, _, rest = message.partition(": ")
    key, _, tail = rest.partition(" ")
    if head != "fleet" or key not in KEYS:
        return message
    if tail.startswith(("must", "(")):  # "lease_ttl_s must be ...": the key said once
        return f"fleet.{key}: {tail}"
    return f"fleet.{key}: {rest}"
