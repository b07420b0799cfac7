"""Fuzzing the OpenAPI importer: whatever a client sends as a document, `parse_document` and the argument
schema check answer with the operations or an AppRegistrationError (the 422 a registration gets), never
another exception, and stay within the document limits. Documents are drawn from OpenAPI's own vocabulary
(paths, operations, parameters, bodies, `$ref`s to anywhere, cycles included) so that most get past the first
checks, and from arbitrary JSON. Bounded: a few hundred documents in a few seconds."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop.apps.openapi import AppRegistrationError, Operation, check_argument_schemas, parse_document
from agentloop.apps.openapi_refs import DocumentLimits

LIMITS = DocumentLimits(
    max_operations=20,
    max_ref_depth=8,
    max_schema_depth=16,
    max_operation_schema_bytes=20_000,
    max_app_schema_bytes=100_000,
)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)

WORDS = [
    "openapi", "paths", "components", "schemas", "parameters", "requestBody", "responses", "content",
    "application/json", "schema", "type", "properties", "items", "required", "name", "in", "operationId",
    "$ref", "allOf", "oneOf", "anyOf", "enum", "default", "description", "summary", "format", "nullable",
    "additionalProperties", "minimum", "maxLength", "200", "default", "jsonSchemaDialect", "$schema",
]  # fmt: skip
REFS = [
    "#", "#/", "#/components/schemas/A", "#/components/schemas/B", "#/components/schemas/A/properties/x",
    "#/paths", "#/components", "#/components/schemas/missing", "other.json#/x", "http://169.254.169.254/x",
    "#/components/schemas/A/items", "#/components/schemas/%41", "#/components/schemas/A~1B",
]  # fmt: skip
TYPES = ["object", "string", "integer", "number", "boolean", "array", "null", "file", 3, None]

scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=6)
keys = st.sampled_from(WORDS) | st.text(max_size=6)
json_values = st.recursive(
    scalars | st.sampled_from(REFS),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=25,
)


names = st.sampled_from(["id", "q", "page", "Host", "authorization", "Cookie", "agentloop-episode", "a b", "x"])
refs = st.sampled_from(REFS[2:4] * 3 + REFS)  # mostly to the components, which may refer to each other
schemas = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(TYPES[:7])}) | st.fixed_dictionaries({"$ref": refs}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "array"])},
        optional={
            "properties": st.dictionaries(names, inner, max_size=3),
            "items": inner,
            "required": st.lists(names, min_size=1, max_size=2, unique=True),
            "allOf": st.lists(inner, min_size=1, max_size=2),
            "additionalProperties": st.booleans() | inner,
            "enum": st.lists(scalars, min_size=1, max_size=3),
        },
    ),
    max_leaves=10,
)
TEMPLATES = ["/items", "/items/{id}", "/a/{x}/b/{y}", "/q"]
METHODS = ["get", "post", "put", "patch", "delete"]


@st.composite
def valid_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A document the importer takes (schemas may refer to each other in cycles; header, cookie and
    reserved parameters included)."""
    paths: dict[str, Any] = {}
    for template in draw(st.lists(st.sampled_from(TEMPLATES), min_size=1, max_size=3, unique=True)):
        item: dict[str, Any] = {}
        for method in draw(st.lists(st.sampled_from(METHODS), min_size=1, max_size=2, unique=True)):
            params = [
                {"name": name, "in": "path", "required": True, "schema": draw(schemas)}
                for name in template.replace("}", "{").split("{")[1::2]
            ]
            params += draw(
                st.lists(
                    st.fixed_dictionaries(
                        {"name": names, "in": st.sampled_from(["query", "header", "cookie"]), "schema": schemas}
                    ),
                    max_size=2,
                    unique_by=lambda p: (p["name"], p["in"]),
                )
            )
            op: dict[str, Any] = {
                "operationId": f"op_{len(paths)}_{method}",
                "parameters": params,
                "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": draw(schemas)}}}},
            }
            if method in ("post", "put", "patch") and draw(st.booleans()):
                op["requestBody"] = {
                    "required": draw(st.booleans()),
                    "content": {"application/json": {"schema": draw(schemas)}},
                }
            item[method] = op
        paths[template] = item
    doc = {"openapi": draw(st.sampled_from(["3.0.3", "3.1.0"])), "info": {"title": "t", "version": "1"}, "paths": paths}
    doc["components"] = {
        "schemas": draw(st.fixed_dictionaries({"A": schemas, "B": schemas}, optional={"A/B": schemas}))
    }
    return doc


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid document, or one with any place in it (a key's value or a list's item) replaced by any JSON."""
    doc = draw(valid_documents())
    spots: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        for key in list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []:
            spots.append((node, key))
            walk(node[key])

    walk(doc)
    for _ in range(draw(st.integers(0, 2))):
        container, key = draw(st.sampled_from(spots))
        container[key] = draw(json_values)
    return doc


def imported(doc: Any) -> list[Operation] | AppRegistrationError:
    try:
        ops = parse_document(doc, limits=LIMITS)
        check_argument_schemas(ops)
        return ops
    except AppRegistrationError as exc:  # DocumentLimitExceeded is one
        assert str(exc), "a refusal says why"
        return exc


@FUZZ
@given(documents())
def test_openapi_shaped_documents_import_or_are_refused_with_a_reason(doc: Any) -> None:
    result = imported(doc)
    if isinstance(result, list):
        assert len(result) <= LIMITS.max_operations
        for op in result:
            assert op.operation_id and isinstance(op.arguments_schema(), dict)
            declared = {p["name"] for p in op.parameters if p["in"] == "path"}
            assert all(f"{{{name}}}" in op.path for name in declared)


@FUZZ
@given(json_values)
def test_any_json_is_imported_or_refused_with_a_reason(doc: Any) -> None:
    imported(doc)
    imported({"openapi": "3.1.0", "paths": doc})
