"""External apps' OpenAPI 3 documents: each operation becomes an API (named by its operationId), with its
`$ref`s resolved within limits (`openapi_refs`). Calling the operations is `remote_http`'s job; an app
that declares the agentloop_* operations is an environment (`remote_env`), and those are never shown
to the agent.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any

import jsonschema.exceptions
import jsonschema.validators

from agentloop.apps.api_doc import schema_outline
from agentloop.apps.base import schema_problem
from agentloop.apps.openapi_refs import (
    AppRegistrationError,
    DocumentLimitExceeded,
    DocumentLimits,
    RefResolver,
)

TASKS_OP, RESET_OP, EVALUATE_OP = "agentloop_tasks", "agentloop_reset", "agentloop_evaluate"
EXAMPLE_OP = "agentloop_example"  # the app's worked example for the agent's prompt (see world_prompt.py)
RELEASE_OP = "agentloop_release"  # optional: the episode is over, the app may free its state
HIDDEN_OPS = frozenset({TASKS_OP, RESET_OP, EVALUATE_OP, EXAMPLE_OP, RELEASE_OP})
EPISODE_HEADER = "Agentloop-Episode"
# headers the service or the HTTP client sets on every request: never an argument the agent gives, whatever
# a document declares (a declared `Host` would let an agent pick the virtual host, `Authorization` another
# identity); OpenAPI itself says Accept, Content-Type and Authorization header parameters are ignored
RESERVED_HEADERS = frozenset(
    {
        EPISODE_HEADER.lower(),
        "host",
        "authorization",
        "proxy-authorization",
        "cookie",
        "accept",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)
METHODS = ("get", "post", "put", "patch", "delete")
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
RETURNS_SCHEMA_SIZE = 120  # of the response schema's outline in an API's `returns`, in api_doc.text_size's tokens


DRAFT_4 = "http://json-schema.org/draft-04/schema#"
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    summary: str  # the operation's `summary` ("" when it has none)
    description: str  # its `description`, else its summary, else its operationId
    parameters: tuple[dict[str, Any], ...]  # {"name", "in": path|query|header, "required", "schema"}
    body_schema: dict[str, Any] | None
    body_required: bool
    returns: str
    schema_dialect: str  # the JSON Schema draft its schemas are written in (`$schema` of its arguments)

    def to_json(self) -> dict[str, Any]:
        """The stored form (the app's row keeps it, so requests never parse the document again)."""
        return {
            "operation_id": self.operation_id,
            "method": self.method,
            "path": self.path,
            "summary": self.summary,
            "description": self.description,
            "parameters": list(self.parameters),
            "body_schema": self.body_schema,
            "body_required": self.body_required,
            "returns": self.returns,
            "schema_dialect": self.schema_dialect,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Operation:
        return cls(**{**data, "parameters": tuple(data["parameters"])})

    def without_headers(self, names: tuple[str, ...]) -> Operation:
        """The operation minus the header parameters the service sets itself (the registered auth header)."""
        managed = {n.lower() for n in names}
        kept = tuple(p for p in self.parameters if not (p["in"] == "header" and p["name"].lower() in managed))
        return self if len(kept) == len(self.parameters) else replace(self, parameters=kept)

    @property
    def flat_body(self) -> bool:
        """An object body's properties become arguments of their own; any other body is `body`."""
        body = self.body_schema
        return bool(body and body.get("type") == "object" and isinstance(body.get("properties"), dict))

    def arguments_schema(self) -> dict[str, Any]:
        props: dict[str, Any] = {}
        required: list[str] = []
        for p in self.parameters:
            own = p["schema"]  # not an object only in a document that fails check_argument_schemas
            props[p["name"]] = {**own, "description": p.get("description", "")} if isinstance(own, dict) else own
            if p["required"]:
                required.append(p["name"])
        if self.body_schema is not None:
            if self.flat_body:
                for name, prop in self.body_schema["properties"].items():
                    if name in props:
                        raise AppRegistrationError(
                            f"operation {self.operation_id}: body property {name!r} clashes with a parameter"
                        )
                    props[name] = prop
                if self.body_required:
                    required += list(self.body_schema.get("required", []))
            else:
                props["body"] = self.body_schema
                if self.body_required:
                    required.append("body")
        schema: dict[str, Any] = {
            "$schema": self.schema_dialect,
            "type": "object",
            "properties": props,
            "additionalProperties": False,
        }
        if required:
            schema["required"] = required
        return schema


DIALECT_NAMES = {DRAFT_4: "draft 4, as OpenAPI 3.0 uses it", DRAFT_2020_12: "draft 2020-12"}


@functools.cache
def _metaschema_validator(dialect: str) -> Any:
    cls = jsonschema.validators.validator_for({"$schema": dialect})
    return cls(cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER)  # as check_schema builds it


def _schema_error(schema: Any, dialect: str) -> str | None:
    """How `schema` breaks `dialect`'s metaschema (None: it is valid)."""
    error = jsonschema.exceptions.best_match(_metaschema_validator(dialect).iter_errors(schema))
    return None if error is None else schema_problem(jsonschema.exceptions.SchemaError.create_from(error))


def check_argument_schemas(operations: list[Operation]) -> None:
    """At registration: every argument schema (each parameter's, the request body's) is valid JSON Schema
    of its draft, as jsonschema's check_schema checks it; raises AppRegistrationError naming the operation,
    the part and the problem. A part shared by several operations is checked once."""
    checked: dict[int, Any] = {}  # id -> the part, kept alive so that no id is reused
    for op in operations:
        parts = [(f"parameter {p['name']!r}", p["schema"]) for p in op.parameters]
        if op.body_schema is not None:
            parts.append(("the request body", op.body_schema))
        for what, schema in parts:
            if id(schema) in checked:
                continue
            error = _schema_error(schema, op.schema_dialect)
            if error is not None:
                draft = DIALECT_NAMES.get(op.schema_dialect, op.schema_dialect)
                raise AppRegistrationError(
                    f"operation {op.operation_id}: the schema of {what} is not valid JSON Schema ({draft}): {error}"
                )
            checked[id(schema)] = schema


def schema_dialect(doc: dict[str, Any]) -> str:
    """The JSON Schema draft a document's schemas are written in: OpenAPI 3.0's schema object is draft 4's
    (`exclusiveMinimum: true` and the like); 3.1's is 2020-12, or the `jsonSchemaDialect` it names when that
    is a draft jsonschema knows."""
    if str(doc.get("openapi", "")).startswith("3.0"):
        return DRAFT_4
    named = doc.get("jsonSchemaDialect")
    if isinstance(named, str) and jsonschema.validators.validator_for({"$schema": named}, default=None) is not None:
        return named
    return DRAFT_2020_12


def _returns(op: dict[str, Any], resolver: RefResolver, where: str) -> str:
    responses = op.get("responses") or {}
    if not isinstance(responses, dict):
        raise AppRegistrationError(f"{where}: responses must be an object")
    for code in ("200", "201", "2XX", "default"):
        resp = resolver.deref(responses.get(code), where)
        if isinstance(resp, dict):
            content = resp.get("content")
            media = resolver.deref(content.get("application/json"), where) if isinstance(content, dict) else None
            schema = media.get("schema") if isinstance(media, dict) else None
            text = str(resp.get("description", ""))
            if schema:
                # an outline that stops at its limit, so a large response schema is never written out whole
                outline = schema_outline(resolver.schema(schema, where), RETURNS_SCHEMA_SIZE)
                text += (" " if text else "") + outline
            return text
    return ""


def _count_operations(paths: dict[str, Any]) -> int:
    return sum(isinstance(item, dict) and item.get(m) is not None for item in paths.values() for m in METHODS)


def parse_document(
    doc: Any, managed_headers: tuple[str, ...] = (), limits: DocumentLimits | None = None
) -> list[Operation]:
    """Every operation of an OpenAPI 3 document, checked, with its `$ref`s inlined within `limits` (default:
    the settings'); raises AppRegistrationError (DocumentLimitExceeded over a limit). Header parameters the
    service sets itself (RESERVED_HEADERS: Agentloop-Episode, Host, Authorization, ...; the registered auth
    header) and cookie parameters are not arguments the agent gives: they are left out."""
    from agentloop.settings import get_settings

    limits = limits or DocumentLimits.from_settings(get_settings())
    if not isinstance(doc, dict) or not str(doc.get("openapi", "")).startswith("3."):
        raise AppRegistrationError('not an OpenAPI 3 document: the top level needs "openapi": "3.x.y"')
    paths = doc.get("paths")
    if not isinstance(paths, dict) or not paths:
        raise AppRegistrationError('the document has no "paths"')
    declared = _count_operations(paths)
    if declared > limits.max_operations:  # before any of them is resolved
        raise DocumentLimitExceeded(
            f"the document declares {declared} operations",
            "openapi_max_operations",
            limits.max_operations,
            "operations",
        )
    resolver = RefResolver(doc, limits)
    dialect = schema_dialect(doc)
    ops: list[Operation] = []
    seen: set[str] = set()
    app_bytes = 0
    for path, item in paths.items():
        if not isinstance(path, str) or not path.startswith("/") or not isinstance(item, dict):
            raise AppRegistrationError(f"invalid path entry {path!r}")
        shared = item.get("parameters", [])
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            where = f"{method.upper()} {path}"
            if not isinstance(op, dict):
                raise AppRegistrationError(f"{where}: an operation must be an object")
            op_id = op.get("operationId")
            if not isinstance(op_id, str) or not NAME_RE.match(op_id):
                raise AppRegistrationError(
                    f"{where}: needs an operationId of letters, digits and underscores (it names the API)"
                )
            if op_id in seen:
                raise AppRegistrationError(f"operationId {op_id!r} is used twice")
            seen.add(op_id)
            own = op.get("parameters", [])
            if not isinstance(shared, list) or not isinstance(own, list):
                raise AppRegistrationError(f"{where}: parameters must be a list")
            params = []
            for entry in [*shared, *own]:
                raw = resolver.deref(entry, where)
                if not isinstance(raw, dict) or raw.get("in") not in ("path", "query", "header", "cookie"):
                    raise AppRegistrationError(f"{where}: each parameter needs a name and in: path|query|header")
                if raw["in"] == "cookie" or (
                    raw["in"] == "header" and str(raw.get("name")).lower() in RESERVED_HEADERS
                ):
                    continue  # the service's to set (see RESERVED_HEADERS), not the agent's
                params.append(
                    {
                        "name": str(raw.get("name")),
                        "in": raw["in"],
                        "required": bool(raw.get("required", raw["in"] == "path")),
                        "schema": resolver.schema(raw.get("schema") or {}, where),
                        "description": str(raw.get("description", "")),
                    }
                )
            for name in re.findall(r"{([^}]+)}", path):
                if not any(p["name"] == name and p["in"] == "path" for p in params):
                    raise AppRegistrationError(f"{where}: path parameter {name!r} is not declared")
            body = resolver.deref(op.get("requestBody"), where)
            body_schema, body_required = None, False
            if isinstance(body, dict):
                content = body.get("content")
                json_body = None
                if isinstance(content, dict):
                    json_body = resolver.deref(content.get("application/json"), where)
                if not isinstance(json_body, dict):
                    raise AppRegistrationError(f"{where}: only application/json request bodies are supported")
                body_schema = resolver.schema(json_body.get("schema") or {}, where)
                body_required = bool(body.get("required", False))
            schemas = [p["schema"] for p in params] + ([body_schema] if body_schema is not None else [])
            app_bytes += resolver.check_arguments(schemas, where, app_bytes)
            ops.append(
                Operation(
                    operation_id=op_id,
                    method=method,
                    path=path,
                    summary=str(op.get("summary") or ""),
                    description=str(op.get("description") or op.get("summary") or op_id),
                    parameters=tuple(params),
                    body_schema=body_schema,
                    body_required=body_required,
                    returns=_returns(op, resolver, where),
                    schema_dialect=dialect,
                )
            )
    for parsed in ops:
        parsed.arguments_schema()  # raise now for clashes, not on first call
    check_specification(doc)  # after the bounded resolver: its limits hold before the validator follows a $ref
    return [parsed.without_headers(managed_headers) for parsed in ops] if managed_headers else ops


@functools.cache
def _specification_validator(version: str) -> Any:
    """A jsonschema validator of the OpenAPI specification's own schema for `version` ("3.0"; else 3.1's), built
    here from the schema openapi-spec-validator ships (its own validators may run on another backend, whose
    errors jsonschema's `best_match` cannot rank)."""
    from openapi_spec_validator.schemas import get_schema_content_v30, get_schema_content_v31

    schema = dict(get_schema_content_v30() if version == "3.0" else get_schema_content_v31())
    return jsonschema.validators.validator_for(schema)(schema)


def check_specification(doc: dict[str, Any]) -> None:
    """AppRegistrationError naming the first way `doc` breaks the OpenAPI specification of its version (3.0 or
    3.1): the document checked against the specification's own JSON Schema, as openapi-spec-validator ships
    it, so what this module does not use is checked too (responses, info, ...) and a document that registers
    here is one other tools read alike. `$ref`s are not followed there (a recursive schema would never end):
    what they point to is checked by `parse_document`, within its limits."""
    from jsonschema.exceptions import best_match

    version = str(doc.get("openapi", ""))
    error = best_match(_specification_validator(version[:3]).iter_errors(doc))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise AppRegistrationError(f"not a valid OpenAPI {version} document: {error.message}, at {where}")
