"""The FastAPI application factory: routers, error bodies, body-size limit, request metrics."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentloop import __version__
from agentloop.api.errors import ServiceError, TooLarge, Unavailable
from agentloop.api.metrics import HTTP_LATENCY, HTTP_REQUESTS
from agentloop.api.routes import admin, apps, demonstrations, health, tasks
from agentloop.settings import Settings, get_settings

log = logging.getLogger(__name__)

DESCRIPTION = """Agent-as-a-service that learns online. Send a task; an LLM agent carries it out by
calling app APIs; every step and reward is stored; LoRA adapters trained on those episodes are
hot-swapped into serving. Authenticate with `Authorization: Bearer <API key>`."""


def error_response(exc: ServiceError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.http_status, headers=headers)


class BodyLimit:
    """413 for bodies over the limit, whether or not they declare a Content-Length. The body is read
    (up to the limit) before the app runs, so an over-long stream is refused before anything happens."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        too_large = error_response(TooLarge(f"request body over the {self.max_bytes}-byte limit"))
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _route_of(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path", "unmatched")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(title="agentloop", version=__version__, description=DESCRIPTION)
    app.include_router(health.router)
    app.include_router(tasks.router)
    app.include_router(apps.router)
    app.include_router(demonstrations.router)
    app.include_router(admin.router)

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else {}
        if isinstance(exc, Unavailable) and exc.retry_after_s is not None:
            headers["Retry-After"] = str(exc.retry_after_s)
        return error_response(exc, headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors: list[dict[str, Any]] = list(exc.errors())
        bad_json = next((e for e in errors if e.get("type") == "json_invalid"), None)
        if bad_json is not None:
            reason = (bad_json.get("ctx") or {}).get("error", "malformed JSON")
            return JSONResponse(
                {"error": {"code": "invalid_json", "message": f"request body is not valid JSON: {reason}"}},
                status_code=400,
            )
        details = [
            {"loc": list(e.get("loc", ())), "message": e.get("msg", ""), "type": e.get("type", "")} for e in errors
        ]
        message = "; ".join(f"{'.'.join(str(p) for p in d['loc'])}: {d['message']}" for d in details)
        return JSONResponse(
            {
                "error": {
                    "code": "invalid_request",
                    "message": message,
                    "details": json.loads(json.dumps(details, default=str)),
                }
            },
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"error": {"code": code, "message": str(exc.detail)}}, status_code=exc.status_code)

    @app.middleware("http")
    async def _metrics(request: Request, call_next: Any) -> Any:
        start = time.perf_counter()
        response = await call_next(request)
        route = _route_of(request)
        HTTP_REQUESTS.labels(request.method, route, str(response.status_code)).inc()
        HTTP_LATENCY.labels(request.method, route).observe(time.perf_counter() - start)
        return response

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app
