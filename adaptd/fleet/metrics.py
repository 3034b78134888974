"""Prometheus series of the fleet, rendered at scrape time from the link's newest view.

Registered on the daemon's own registry (``Metrics.registry.register(FleetCollector(link))``)
only when a ``[fleet]`` is configured:

- ``adaptd_fleet_up``: 1 while etcd answers and the view is fresh (decisions use the
  fleet), 0 while the daemon decides locally; ``adaptd_fleet_hosts``: daemons up;
  ``adaptd_fleet_leader``: 1 on the fleet's leader;
- ``adaptd_fleet_slot_cap``, ``adaptd_fleet_slot_holders``, ``adaptd_fleet_slot_waiters``
  per shared ``target`` (the whole fleet's, as of ``adaptd_fleet_slot_view_age_seconds``
  ago: a host with nothing waiting reads the claims less often in a large fleet), and
  ``adaptd_fleet_slot_holding`` / ``adaptd_fleet_slot_waiting`` (this host's jobs);
- counters ``adaptd_fleet_slot_grants_total``, ``adaptd_fleet_slot_waits_total``
  (jobs that had to wait), ``adaptd_fleet_errors_total`` (etcd rounds that failed),
  ``adaptd_fleet_rejoins_total`` (new sessions after a lease expired);
- ``adaptd_fleet_gpu_mtbf_seconds`` (the pooled posterior's per-GPU MTBF) and
  ``adaptd_fleet_failure_shape`` (the fitted Weibull shape, with ``quantile`` 0.05,
  0.5, 0.95) once the fleet has seen enough failures.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from adaptd.fleet.link import FleetLink


class FleetCollector(Collector):
    """Reads the link at scrape time (a metrics thread: only frozen views are read)."""

    def __init__(self, link: FleetLink) -> None:
        self.link = link

    def describe(self) -> Iterable[Metric]:
        return []  # families depend on the view; the registry asks collect() instead

    def collect(self) -> Iterator[Metric]:
        link = self.link
        view = link.agent.view()
        up = link.usable() is not None
        yield _gauge("adaptd_fleet_up", "1 while decisions use the fleet (etcd answers).", up)
        yield _gauge("adaptd_fleet_hosts", "Daemons registered in the fleet.", len(view.hosts))
        yield _gauge(
            "adaptd_fleet_leader", "1 on the fleet's leader (oldest member).", view.role == "leader"
        )
        yield _gauge(
            "adaptd_fleet_slot_holding", "This host's jobs holding a write slot.", len(view.granted)
        )
        yield _gauge(
            "adaptd_fleet_slot_waiting", "This host's jobs waiting for a slot.", len(view.waiting)
        )
        cap = GaugeMetricFamily(
            "adaptd_fleet_slot_cap", "Fleet-wide saves at once on the target.", labels=["target"]
        )
        held = GaugeMetricFamily(
            "adaptd_fleet_slot_holders", "Jobs of the fleet holding a slot.", labels=["target"]
        )
        waiting = GaugeMetricFamily(
            "adaptd_fleet_slot_waiters", "Jobs of the fleet waiting for a slot.", labels=["target"]
        )
        for target, slots in view.targets.items():
            cap.add_metric([target], slots.cap)
            held.add_metric([target], len(slots.holders))
            waiting.add_metric([target], len(slots.waiters))
        yield from (cap, held, waiting)
        if view.targets_at is not None:
            yield _gauge(
                "adaptd_fleet_slot_view_age_seconds",
                "Seconds since this host last read the fleet's claims (the per-target series).",
                max(0.0, link.clock() - view.targets_at),
            )
        yield CounterMetricFamily(
            "adaptd_fleet_slot_grants", "Write slots granted to this host's jobs.", view.grants
        )
        yield CounterMetricFamily(
            "adaptd_fleet_slot_waits", "Saves of this host that waited for a slot.",
            link.counts["waits"],
        )  # fmt: skip
        yield CounterMetricFamily(
            "adaptd_fleet_errors", "etcd rounds that failed (deciding locally).", view.errors
        )
        yield CounterMetricFamily(
            "adaptd_fleet_rejoins", "New etcd sessions after a lost lease.", view.rejoins
        )
        yield _gauge(
            "adaptd_fleet_gpu_mtbf_seconds",
            "Per-GPU MTBF of the fleet's pooled failure posterior.",
            link.failure_rate.gpu_mtbf_s,
        )
        fit = link.shape(view)
        shape = GaugeMetricFamily(
            "adaptd_fleet_failure_shape",
            "Weibull shape fitted to the fleet's failure times (posterior quantiles).",
            labels=["quantile"],
        )
        if fit is not None:
            for q, v in (("0.05", fit.low), ("0.5", fit.shape), ("0.95", fit.high)):
                shape.add_metric([q], v)
        yield shape


def _gauge(name: str, doc: str, value: float | bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))
