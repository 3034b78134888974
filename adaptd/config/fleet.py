"""``[fleet]`` read by the schema into the fleet's record.

The section's keys are :data:`adaptd.config.schema.FLEET_SETTINGS`, read like every
other section's; what is particular to it is here: it is there only when etcd endpoints
are (in the file, ``serve --etcd`` or ``$ADAPTD_ETCD``, which replace the file's), the
password may come from a file, and the settings become the fleet's own records
(:class:`~adaptd.fleet.config.FleetConfig` around
:class:`~adaptd.fleet.session.FleetSettings`), whose checks (endpoint URLs, prefix,
host name, keys that go in pairs) name the key at fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptd.config.check import Check
from adaptd.config.schema import FLEET_SETTINGS
from adaptd.fleet.config import ETCD_ENV, FleetConfig
from adaptd.fleet.session import FleetSettingError, FleetSettings, call_deadline
from adaptd.telemetry.storage import Mount

__all__ = ["parse_fleet", "read_fleet"]


def parse_fleet(
    table: Any,
    *,
    endpoints: Sequence[str] = (),
    hostname: str | None = None,
    mounts: Sequence[Mount] | None = None,
) -> FleetConfig | None:
    """A ``[fleet]`` table (the parsed TOML, or ``None``) read as
    :func:`adaptd.config.loader.from_mapping` reads it: ``None`` without endpoints.
    ``endpoints`` (the command line's or the environment's) replace its ``etcd``;
    ``hostname`` stands for this host's name, ``mounts`` for its mount table. Raises
    :class:`~adaptd.config.check.ConfigError`."""
    return read_fleet(Check(""), table, endpoints, hostname=hostname, mounts=mounts)


def read_fleet(
    check: Check, table: Any, endpoints: Sequence[str], **context: Any
) -> FleetConfig | None:
    """``[fleet]`` by :data:`~adaptd.config.schema.FLEET_SETTINGS`; ``None``: no fleet (no
    endpoints anywhere). The fleet's own checks (endpoint URLs, prefix, host name, keys
    that go in pairs, ranges) are its settings' (:class:`FleetSettings`), named by key."""
    keys = [s.key for s in FLEET_SETTINGS]
    table = check.table({} if table is None else table, "fleet", keys)
    if not table and not endpoints:
        return None
    values = check.read(FLEET_SETTINGS, "fleet", table, **context)
    if endpoints:
        values["settings.endpoints"] = tuple(endpoints)
    if not values["settings.endpoints"]:
        raise check.fail(
            "fleet.etcd",
            f'give the etcd endpoints, e.g. etcd = ["http://127.0.0.1:2379"] (or --etcd / '
            f"{ETCD_ENV})",
        )
    password, password_file = values.pop("password"), values.pop("password_file")
    if password_file is not None:
        if password is not None:
            raise check.fail("fleet.password_file", "set password or password_file, not both")
        try:
            password = Path(password_file).read_text().strip()
        except OSError as exc:
            raise check.fail(
                "fleet.password_file", f"cannot read {password_file}: {exc.strerror}"
            ) from None
    etcd = {k.removeprefix("settings."): values.pop(k) for k in list(values) if "." in k}
    try:
        settings = FleetSettings(
            password=password, call_deadline_s=call_deadline(etcd["call_timeout_s"]), **etcd
        )
    except FleetSettingError as exc:
        raise check.fail(f"fleet.{exc.key}", exc.reason) from None
    return FleetConfig(settings=settings, password_file=password_file, **values)
