"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agentloop.api.deps import AdminPrincipal
from agentloop.api.metrics import REGISTRY
from agentloop.settings import Settings, get_settings
from agentloop.store.db import get_engine

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz() -> JSONResponse:
    """Ready to take tasks: the database answers and is migrated, and the broker accepts connections;
    503 `not_ready` otherwise. `workers` counts the live workers consuming each queue. With none on
    `episodes` the status is `degraded`, still 200 (tasks are accepted and wait in the queue, so a load
    balancer keeps sending them), and `warnings` says why."""
    checks: dict[str, Any] = {}
    try:
        with get_engine().connect() as conn:
            conn.execute(sa.text("SELECT 1"))
            from agentloop.store.migrate import current_revision, head_revision

            current, head = current_revision(conn), head_revision()
            checks["database"] = "ok"
            checks["migrations"] = "ok" if current == head else f"at {current}, head is {head}: run `agentloop migrate`"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}: {exc}"
    try:
        from agentloop.worker.celery_app import app as celery_app

        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}: {exc}"
    workers, warnings = _workers(get_settings())
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {
            "status": ("degraded" if warnings else "ready") if ready else "not_ready",
            "checks": checks,
            "workers": workers,
            "warnings": warnings,
        },
        status_code=200 if ready else 503,
    )


def _workers(settings: Settings) -> tuple[dict[str, int] | None, list[str]]:
    """Live workers per queue, and what is wrong with them for serving tasks."""
    from agentloop.worker import presence
    from agentloop.worker.celery_app import QUEUES

    try:
        workers = presence.consumers(settings, QUEUES)
    except Exception as exc:
        return None, [f"could not count workers: {type(exc).__name__}: {exc}"]
    if workers is None:
        return None, ["workers are not counted with this broker: set AGENTLOOP_REDIS_URL"]
    if workers["episodes"]:
        return workers, []
    if settings.run_embedded_worker:
        why = "the worker `agentloop serve` starts is not consuming yet: loading the model, or restarting; see its log"
    else:
        why = "start one: `agentloop worker --queues episodes`"
    return workers, [f"no worker consumes the `episodes` queue; tasks are accepted but stay queued ({why})"]


@router.get("/metrics")
def metrics(_: AdminPrincipal) -> Response:
    """Prometheus metrics (admin key: `authorization: {credentials: <key>}` in the scrape config)."""
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
