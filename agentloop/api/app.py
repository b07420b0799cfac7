"""The FastAPI application factory: routers, error bodies, the request guard (body size, text no store can
hold), request metrics."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentloop import __version__
from agentloop.api import openapi_doc
from agentloop.api.errors import DATABASE_ERRORS, InvalidRequest, ServiceError, TooLarge, database_unavailable
from agentloop.api.metrics import HTTP_LATENCY, HTTP_REQUESTS
from agentloop.api.routes import admin, apps, demonstrations, health, tasks
from agentloop.api.text_guard import check_text
from agentloop.settings import Settings, get_settings
from agentloop.store.db import serve_requests

log = logging.getLogger(__name__)

DESCRIPTION = """Agent-as-a-service that learns online. Send a task; an LLM agent carries it out by
calling app APIs; every step and reward is stored; LoRA adapters trained on those episodes are
hot-swapped into serving. Authenticate with `Authorization: Bearer <API key>`."""


def error_response(exc: ServiceError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.http_status, headers=headers)


class RequestGuard:
    """Before any route runs: 413 for bodies over the limit, whether or not they declare a Content-Length
    (the body is read up to the limit first, so an over-long stream is refused before anything happens);
    422 for a path, query or JSON body holding text no store can hold (text_guard.py)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            check_text(scope.get("path", ""), "path")
            query = scope.get("query_string", b"").decode("latin-1")
            check_text(dict(parse_qsl(query, keep_blank_values=True)), "query")
        except InvalidRequest as exc:
            await error_response(exc)(scope, receive, send)
            return
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        too_large = error_response(TooLarge(f"request body over the {self.max_bytes}-byte limit"))
        headers = dict(scope.get("headers", []))
        declared = headers.get(b"content-length")
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
        # JSON text can carry a NUL or a lone surrogate only as a \u escape (raw control characters and
        # surrogates are not valid JSON or UTF-8): a body without one is not parsed here
        if b"\\u" in body and b"json" in headers.get(b"content-type", b"").lower():
            try:
                check_text(json.loads(body), "body")
            except InvalidRequest as exc:
                await error_response(exc)(scope, receive, send)
                return
            except (ValueError, RecursionError):
                pass  # not JSON: the route's own parsing answers 400

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RequestMetrics:
    """Requests by method, route and status, and the time until the response starts (a stream's headers),
    as plain ASGI: no task or queue per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, recorded = time.perf_counter(), False

        def record(status: int) -> None:
            nonlocal recorded
            recorded = True
            route = getattr(scope.get("route"), "path", "unmatched")
            HTTP_REQUESTS.labels(scope["method"], route, str(status)).inc()
            HTTP_LATENCY.labels(scope["method"], route).observe(time.perf_counter() - start)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and not recorded:
                record(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if not recorded:
                record(500)
            raise


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods some route takes at the request's path (a 405's Allow header)."""
    return [m for m in METHODS if any(r.matches({**scope, "method": m})[0] == Match.FULL for r in app.router.routes)]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    serve_requests()  # pooled connections checked after idling, not at every checkout (store/db.py)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # the event loop's thread pool, which runs sync routes and dependencies: sized to the work, so that a
        # burst of requests waits on the loop, not as dozens of threads taking turns at one interpreter lock
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        yield

    app = FastAPI(title="agentloop", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    app.include_router(health.router)
    app.include_router(tasks.router)
    app.include_router(apps.router)
    app.include_router(demonstrations.router)
    app.include_router(admin.router)

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else {}
        if exc.retry_after_s is not None:
            headers["Retry-After"] = str(exc.retry_after_s)
        return error_response(exc, headers or None)

    async def _database_lost(_: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable during a request: %s", getattr(exc, "orig", None) or exc)
        return error_response(database_unavailable(exc), {"Retry-After": "1"})

    for kind in DATABASE_ERRORS:
        app.add_exception_handler(kind, _database_lost)

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
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        message = str(exc.detail)
        if exc.status_code == 405:  # every method the path takes, not only those of the first route it matched
            headers["Allow"] = ", ".join(allowed_methods(app, request.scope))
            message = f"{request.method} is not allowed on {request.url.path}; it takes {headers['Allow']}"
        body = {"error": {"code": code, "message": message}}
        return JSONResponse(body, status_code=exc.status_code, headers=headers or None)

    app.add_middleware(RequestMetrics)
    app.add_middleware(RequestGuard, max_bytes=settings.max_body_bytes)
    openapi_doc.install(app)
    return app
