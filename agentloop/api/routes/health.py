"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agentloop.api.deps import OperatorPrincipal
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
    balancer keeps sending them), and `warnings` says why; likewise when a worker found an owner's active
    adapter damaged (its episodes run on a fallback until the files verify again or another is activated)."""
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
    if checks.get("migrations") == "ok":  # the adapters table is as this code reads it
        warnings += _damaged_adapters()
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


def _damaged_adapters() -> list[str]:
    try:
        return _damage_warnings()
    except Exception as exc:  # readiness must answer whatever the store does
        return [f"could not read the adapters' state: {type(exc).__name__}: {exc}"]


def _damage_warnings() -> list[str]:
    from agentloop.store import adapters as adapter_store
    from agentloop.store.db import session_scope
    from agentloop.store.models import Tenant

    with session_scope() as s:
        out = []
        for row in adapter_store.damaged_active(s):
            owner = s.get(Tenant, row.tenant_id).name if row.tenant_id else None  # type: ignore[union-attr]
            whose = f"tenant {owner!r}'s" if owner else "the shared"
            since = row.damaged_at.isoformat(timespec="seconds") if row.damaged_at else "?"
            out.append(
                f"{whose} active adapter {row.name} cannot be served since {since} ({row.damage}); its episodes "
                "run on the previous good version or the base model: restore its files or activate another"
            )
        return out


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


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"description": "Prometheus' text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    },
)
def metrics(_: OperatorPrincipal) -> Response:
    """Prometheus metrics of the whole deployment (operator key: `authorization: {credentials: <key>}` in the
    scrape config)."""
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
