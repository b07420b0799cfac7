"""Prometheus metrics of the API process. Task and episode figures are read from the database at
scrape time, so they are right whichever process (API, worker) did the work."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agentloop.store.db import get_engine
from agentloop.store.models import Adapter, Episode, Task, TaskStatus, Tenant

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()

HTTP_REQUESTS = Counter(
    "agentloop_http_requests_total",
    "HTTP requests by route and status.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_LATENCY = Histogram(
    "agentloop_http_request_seconds",
    "HTTP request latency by route.",
    ["method", "route"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class StoreCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        tasks = GaugeMetricFamily("agentloop_tasks", "Tasks by status.", labels=["status"])
        episodes = GaugeMetricFamily(
            "agentloop_episodes_finished", "Finished episodes by finish reason.", labels=["finish_reason"]
        )
        active = GaugeMetricFamily(
            "agentloop_active_adapter_version",
            "Version of each owner's active adapter per base (owner: a tenant's name, or `shared`).",
            labels=["base_model", "owner"],
        )
        damaged = GaugeMetricFamily(
            "agentloop_adapter_damaged",
            "1 for each owner's active adapter a worker could not serve (files missing, changed or unloadable); "
            "its episodes run on a fallback.",
            labels=["base_model", "owner", "adapter"],
        )
        try:
            with get_engine().connect() as conn:
                counts = dict(conn.execute(sa.select(Task.status, sa.func.count()).group_by(Task.status)).all())
                for status in TaskStatus.ALL:
                    tasks.add_metric([status], float(counts.get(status, 0)))
                for reason, n in conn.execute(
                    sa.select(Episode.finish_reason, sa.func.count())
                    .where(Episode.finish_reason.is_not(None))
                    .group_by(Episode.finish_reason)
                ):
                    episodes.add_metric([str(reason)], float(n))
                for base, version, owner in conn.execute(
                    sa.select(Adapter.base_model, Adapter.version, Tenant.name)
                    .outerjoin(Tenant, Tenant.id == Adapter.tenant_id)
                    .where(Adapter.status == "active")
                ):
                    active.add_metric([base, owner or "shared"], float(version))
                for base, name, owner in conn.execute(
                    sa.select(Adapter.base_model, Adapter.name, Tenant.name)
                    .outerjoin(Tenant, Tenant.id == Adapter.tenant_id)
                    .where(Adapter.status == "active", Adapter.damage.is_not(None))
                ):
                    damaged.add_metric([base, owner or "shared", name], 1.0)
        except Exception as exc:  # a scrape must not fail because the database blinked
            log.warning("metrics: store unavailable: %s", exc)
            return
        yield tasks
        yield episodes
        yield active
        yield damaged


REGISTRY.register(StoreCollector())
