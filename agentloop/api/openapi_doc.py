"""The service's own OpenAPI document: what every route answers besides success, written once.

Routes declare their own outcomes (404 for another tenant's object, 409 for a conflict); what the middleware
and the shared dependencies answer is added here to every operation it applies to, so the document names
every status a client can get:

* 401 and 429 on every route that takes a key (`deps.get_principal`: the key, then its rate limits), and
  the key itself as an HTTP bearer security scheme rather than a free `authorization` header parameter;
* 503 on every route that reads the database (all but `/healthz`);
* 400 (body is not JSON) and 413 (body over `max_body_bytes`) on every route with a body;
* 422 on every route: the request guard refuses NUL and lone surrogates in any path, query or body.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from agentloop.api.schemas import ErrorBody

SCHEME = "bearer"
ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}

OUTCOMES = {
    "400": "The body is not valid JSON.",
    "401": "No key, or one that is unknown, revoked or expired.",
    "413": "The body is larger than the service takes.",
    "422": "A parameter or the body is invalid (the message names the field and why).",
    "429": "A rate limit or a quota is reached; `Retry-After` says when to try again.",
    "503": "The database cannot be reached; retry after `Retry-After` seconds.",
}
NO_DATABASE = {"/healthz"}


def install(app: FastAPI) -> None:
    """Replace `app.openapi` with one that documents the shared outcomes; the document is built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            app.openapi_schema = document_outcomes(doc)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document_outcomes(doc: dict[str, Any]) -> dict[str, Any]:
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    error = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, schema in error.pop("$defs", {}).items():
        schemas.setdefault(name, schema)
    schemas.setdefault("ErrorBody", error)
    components.setdefault("securitySchemes", {})[SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key: `Authorization: Bearer <key>` (gRPC metadata `authorization`).",
    }
    for path, operations in doc.get("paths", {}).items():
        for op in operations.values():
            params = op.get("parameters", [])
            keyed = any(p.get("in") == "header" and p.get("name", "").lower() == "authorization" for p in params)
            if keyed:
                op["parameters"] = [p for p in params if p.get("name", "").lower() != "authorization"]
                if not op["parameters"]:
                    del op["parameters"]
                op["security"] = [{SCHEME: []}]
            codes = ["422"]
            if keyed:
                codes += ["401", "429"]
            if path not in NO_DATABASE:
                codes.append("503")
            if "requestBody" in op:
                codes += ["400", "413"]
            responses = op.setdefault("responses", {})
            for code in codes:
                if code not in responses or "HTTPValidationError" in str(responses[code]):  # FastAPI's own 422
                    responses[code] = {
                        "description": OUTCOMES[code],
                        "content": {"application/json": {"schema": ERROR_REF}},
                    }
    return doc
