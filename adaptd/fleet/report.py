"""The fleet section of ``adaptd status``: rendered from :meth:`FleetLink.status`'s dict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def render(data: Mapping[str, Any]) -> str:
    """A few lines: up or why not, hosts and role, each shared target's slots, failures."""
    state = (
        "up"
        if data.get("up")
        else f"DOWN (deciding locally) for {data.get('since_s', 0):.0f}s: {data.get('reason')}"
    )
    hosts = data.get("hosts") or []
    lines = [
        "",
        f"FLEET {state}",
        f"  this host {data.get('host')} ({data.get('role') or 'not registered'}); "
        f"{len(hosts)} host(s) up: {', '.join(hosts[:8])}{' ...' if len(hosts) > 8 else ''}",
    ]
    age = data.get("targets_age_s")
    if data.get("targets") and age is not None:
        lines.append(f"  shared targets, as of the claims read {age:.0f}s ago:")
    for target, t in sorted((data.get("targets") or {}).items()):
        lines.append(
            f"  {target}: {len(t['holders'])}/{t['cap']} slot(s) held"
            + (f" by {', '.join(t['holders'])}" if t["holders"] else "")
            + (f"; waiting: {', '.join(t['waiters'])}" if t["waiters"] else "")
        )
    shape = data.get("weibull_shape")
    lines.append(
        f"  failures ({data.get('gpu_model')}): {data.get('fleet_failures', 0):.0f} in the fleet, "
        f"per-GPU MTBF {data.get('gpu_mtbf_s', 0) / 3600:.0f}h"
        + (
            f", Weibull shape {shape[1]:.2f} [{shape[0]:.2f}, {shape[2]:.2f}]"
            if shape
            else ", too few failures for a shape"
        )
    )
    lines.append(
        f"  slots granted {data.get('grants', 0)}, etcd errors {data.get('errors', 0)}, "
        f"rejoins {data.get('rejoins', 0)}"
    )
    return "\n".join(lines) + "\n"
