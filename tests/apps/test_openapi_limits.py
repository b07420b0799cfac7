"""OpenAPI documents whose $refs expand without bound are refused fast and in flat memory, with an error
naming the limit; shared and recursive references still work; a registered app is served from the
operations resolved at registration, never by parsing its document again."""

from __future__ import annotations

import contextlib
import gc
import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.apps import openapi_refs
from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.openapi import parse_document
from agentloop.apps.openapi_refs import (
    AppRegistrationError,
    DocumentLimitExceeded,
    DocumentLimits,
    RefResolver,
    json_preview,
)
from agentloop.settings import Settings
from agentloop.store import apps as app_store
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import App
from tests.apps.loopback_app import LOOPBACK_NETWORKS
from tests.factories import bearer, make_keys

BASE_URL = "http://127.0.0.1:9"  # only resolved at registration (allowed_networks, operator key), never called here


@pytest.fixture
def api(sqlite_db):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    client = TestClient(create_app())
    client.get("/v1/apps", headers=bearer(keys.tenant_a_admin))  # first request pays for start-up, not the test
    return client, keys


def register(client: TestClient, admin: str, doc: dict[str, Any], name: str = "shop_api"):
    body = {
        "name": name,
        "description": "",
        "openapi": doc,
        "base_url": BASE_URL,
        "allowed_networks": LOOPBACK_NETWORKS,
    }
    return client.post("/v1/apps", json=body, headers=bearer(admin))


def app_rows() -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(App))


def document(schemas: dict[str, Any], paths: dict[str, Any] | None = None) -> dict[str, Any]:
    body_op = {
        "operationId": "create",
        "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/A0"}}}},
        "responses": {"200": {"description": "ok"}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "paths": paths or {"/things": {"post": body_op}},
        "components": {"schemas": schemas},
    }


def exponential_document(levels: int = 24) -> dict[str, Any]:
    """A0..A{levels}: each Ai has two properties referencing A(i+1), so A0 expands to 2**levels leaves."""
    schemas: dict[str, Any] = {
        f"A{i}": {
            "type": "object",
            "properties": {
                "left": {"$ref": f"#/components/schemas/A{i + 1}"},
                "right": {"$ref": f"#/components/schemas/A{i + 1}"},
            },
        }
        for i in range(levels)
    }
    schemas[f"A{levels}"] = {"type": "string"}
    return document(schemas)


def chain_document(length: int = 900, nested: bool = False) -> dict[str, Any]:
    """A0 -> A1 -> ... -> A{length}: each a bare alias of the next, or an object with the next as a property."""
    schemas: dict[str, Any] = {}
    for i in range(length):
        ref = {"$ref": f"#/components/schemas/A{i + 1}"}
        schemas[f"A{i}"] = {"type": "object", "properties": {"next": ref}} if nested else ref
    schemas[f"A{length}"] = {"type": "string"}
    return document(schemas)


# --- measuring one request ----------------------------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/self/status")


def measured(call):
    """(result, CPU seconds of the whole process, wall seconds, growth of peak RSS in MB) of `call()`."""
    gc.collect()  # not to bill this request for a full collection of what earlier tests left (torch, models)
    with contextlib.suppress(OSError):  # Linux: restart the peak (VmHWM) from the current RSS
        Path("/proc/self/clear_refs").write_text("5")
    peak_before = _status_kb("VmHWM")
    cpu, wall = time.process_time(), time.perf_counter()
    result = call()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return result, cpu, wall, (_status_kb("VmHWM") - peak_before) / 1024


# --- documents over a limit -----------------------------------------------------------------------


@pytest.mark.timeout(60)  # the exponential expansion this guards against took minutes and gigabytes
@pytest.mark.parametrize(
    ("doc", "setting"),
    [
        (exponential_document(24), "openapi_max_operation_schema_bytes"),
        (chain_document(900), "openapi_max_ref_depth"),
        (chain_document(900, nested=True), "openapi_max_ref_depth"),
    ],
    ids=["exponential-2^24", "alias-chain-900", "nested-chain-900"],
)
def test_document_over_a_limit_is_refused_fast_in_flat_memory(api, doc, setting):
    client, keys = api
    resp, cpu, wall, peak_mb = measured(lambda: register(client, keys.operator, doc))
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert setting in error["message"] and f"AGENTLOOP_{setting.upper()}" in error["message"]
    assert error["details"] == {
        "limit": setting,
        "value": getattr(Settings(), setting),
        "env": f"AGENTLOOP_{setting.upper()}",
    }
    assert cpu < 0.1, f"the refusal took {cpu:.3f} s of CPU ({wall:.3f} s wall)"
    assert wall < 0.5, f"the refusal took {wall:.3f} s wall"
    assert peak_mb < 30, f"peak RSS grew by {peak_mb:.0f} MB"
    assert app_rows() == 0


def nested_object(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


def operations_document(count: int) -> dict[str, Any]:
    paths = {
        f"/op{i}": {"get": {"operationId": f"op{i}", "responses": {"200": {"description": "ok"}}}} for i in range(count)
    }
    return document({}, paths)


def wide_document(operations: int, properties: int) -> dict[str, Any]:
    """`operations` operations sharing one body schema of `properties` string properties."""
    schemas = {"A0": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(properties)}}}
    body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/A0"}}}}
    paths = {
        f"/op{i}": {"post": {"operationId": f"op{i}", "requestBody": body, "responses": {"200": {"description": "ok"}}}}
        for i in range(operations)
    }
    return document(schemas, paths)


@pytest.mark.parametrize(
    ("doc", "setting", "low", "enough"),
    [
        (operations_document(6), "openapi_max_operations", 5, 6),
        (chain_document(5), "openapi_max_ref_depth", 5, 6),  # A0 .. A5: six $refs, one inside the other
        # 30 objects nest 60 levels (each object and its `properties`), and the string's schema one more
        (document({"A0": nested_object(30)}), "openapi_max_schema_depth", 60, 61),
        (chain_document(60, nested=True), "openapi_max_schema_depth", 100, 121),  # the depth through $refs
        (wide_document(1, 100), "openapi_max_operation_schema_bytes", 1_000, 10_000),
        (wide_document(10, 100), "openapi_max_app_schema_bytes", 10_000, 100_000),
    ],
)
def test_each_limit_is_its_setting(api, configure_env, doc, setting, low, enough):
    """Over the limit: 422 naming the setting; the same document registers once the setting allows it."""
    client, keys = api
    configure_env(**{"openapi_max_ref_depth": 100, setting: low})
    resp = register(client, keys.operator, doc)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["details"]["limit"] == setting
    assert f"AGENTLOOP_{setting.upper()}" in resp.json()["error"]["message"]
    assert app_rows() == 0
    configure_env(**{setting: enough})
    assert register(client, keys.operator, doc).status_code == 201
    assert app_rows() == 1


def test_settings_refuse_limits_that_cannot_work(configure_env):
    with pytest.raises(ValueError, match="AGENTLOOP_OPENAPI_MAX_SCHEMA_DEPTH"):
        Settings(openapi_max_schema_depth=1000)
    with pytest.raises(ValueError, match="AGENTLOOP_OPENAPI_MAX_REF_DEPTH"):
        Settings(openapi_max_ref_depth=0)


# --- references that are fine -----------------------------------------------------------------------


def shared_document(operations: int = 40) -> dict[str, Any]:
    """Address and Country used by every operation (twice each): a shared component, not an expansion."""
    schemas = {
        "Country": {"type": "string", "enum": ["FR", "DE", "IT"], "description": "ISO country code."},
        "Address": {
            "type": "object",
            "description": "A postal address.",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "country": {"$ref": "#/components/schemas/Country"},
            },
            "required": ["street", "city"],
        },
        "Customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "home": {"$ref": "#/components/schemas/Address"},
                "work": {"$ref": "#/components/schemas/Address"},
            },
        },
    }
    country = {"name": "country", "in": "query", "schema": {"$ref": "#/components/schemas/Country"}}
    paths = {
        f"/customers{i}": {
            "post": {
                "operationId": f"create_customer_{i}",
                "summary": f"Create customer {i}.",
                "parameters": [country],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Customer"}}},
                },
                "responses": {
                    "200": {
                        "description": "The customer.",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Customer"}}},
                    }
                },
            }
        }
        for i in range(operations)
    }
    return document(schemas, paths)


def test_shared_references_register_and_show_expanded(api):
    client, keys = api
    resp = register(client, keys.operator, shared_document())
    assert resp.status_code == 201, resp.text
    assert resp.json()["apis"] == 40

    with get_sessionmaker()() as s:
        row = s.scalars(sa.select(App)).one()
        external = app_store.to_external(row, "unused")  # no auth header to decrypt
    world = BUILTIN.new_world(0, [])
    world.attach(external.spec())
    doc = world.call("api_docs", "show_api_doc", {"app_name": "shop_api", "api_name": "create_customer_7"})
    params = {p["name"]: p for p in doc["parameters"]}
    # each $ref is replaced by the component: its type, description and enum are what the agent reads
    assert params["home"]["type"] == "object" and params["home"]["description"] == "A postal address."
    assert params["country"] == {
        "name": "country",
        "type": "string",
        "required": False,
        "description": "",
        "enum": ["FR", "DE", "IT"],
    }
    assert "$ref" not in json.dumps(doc) and "home?: {street: string" in doc["returns"]  # the response schema, inlined
    # nested parts are expanded too: the arguments are checked against them before any request is made
    schema = external.spec().apis["create_customer_7"].parameters
    assert schema["properties"]["work"]["properties"]["country"]["enum"] == ["FR", "DE", "IT"]
    with pytest.raises(ApiError, match=r"Invalid work\.country"):
        world.call("shop_api", "create_customer_7", {"work": {"street": "x", "city": "y", "country": "XX"}})


def test_shared_component_is_resolved_once_and_shared():
    ops = parse_document(exponential_document(5))
    body = ops[0].body_schema
    assert body is not None and body["properties"]["left"] is body["properties"]["right"]  # one object, used twice
    expanded = json.dumps(body, separators=(",", ":"))
    assert expanded.count('"type":"string"') == 2**5


def test_recursive_schema_is_cut_with_a_placeholder():
    schemas = {
        "Node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}},
            },
        },
        "A0": {"type": "object", "properties": {"root": {"$ref": "#/components/schemas/Node"}}},
    }
    ops = parse_document(document(schemas))
    root = ops[0].arguments_schema()["properties"]["root"]
    assert root["properties"]["name"] == {"type": "string"}
    assert root["properties"]["children"]["items"] == {
        "description": "(recursive: the schema of #/components/schemas/Node)"
    }
    # mutual recursion, and a $ref to itself
    cyclic = {
        "A0": {"$ref": "#/components/schemas/B"},
        "B": {"type": "object", "properties": {"a": {"$ref": "#/components/schemas/A0"}}},
    }
    assert "recursive" in json.dumps(parse_document(document(cyclic))[0].body_schema)
    assert parse_document(document({"A0": {"$ref": "#/components/schemas/A0"}}))[0].body_schema == {
        "description": "(recursive: the schema of #/components/schemas/A0)"
    }


def test_parameter_reference_cycle_is_an_error():
    doc = document({}, {"/x": {"get": {"operationId": "x", "parameters": [{"$ref": "#/components/parameters/P"}]}}})
    doc["components"]["parameters"] = {
        "P": {"$ref": "#/components/parameters/Q"},
        "Q": {"$ref": "#/components/parameters/P"},
    }
    with pytest.raises(ValueError, match="form a cycle"):
        parse_document(doc)


def test_ref_depth_counts_chains_resolved_earlier():
    """A chain met from its far end first (each link then one $ref deep) is still as deep as it is long."""
    doc = chain_document(10)
    doc["paths"] = {
        f"/op{i}": {
            "post": {
                "operationId": f"op{i}",
                "requestBody": {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/A{i}"}}}},
            }
        }
        for i in range(10, -1, -1)
    }
    with pytest.raises(DocumentLimitExceeded, match="openapi_max_ref_depth") as info:
        parse_document(doc, limits=limits_with(openapi_max_ref_depth=10))
    assert str(info.value).startswith("POST /op0:")  # A0 .. A10: eleven
    assert len(parse_document(doc, limits=limits_with(openapi_max_ref_depth=11))) == 11


def test_schema_depth_counts_schemas_resolved_earlier():
    doc = chain_document(10, nested=True)  # A{i} nests 2 * (10 - i) + 1 levels
    doc["paths"] = {
        f"/op{i}": {
            "post": {
                "operationId": f"op{i}",
                "requestBody": {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/A{i}"}}}},
            }
        }
        for i in range(10, -1, -1)
    }
    with pytest.raises(DocumentLimitExceeded, match="openapi_max_schema_depth") as info:
        parse_document(doc, limits=limits_with(openapi_max_schema_depth=20))
    assert str(info.value).startswith("POST /op0:")
    assert len(parse_document(doc, limits=limits_with(openapi_max_schema_depth=21))) == 11


def limits_with(**settings: Any) -> DocumentLimits:
    return DocumentLimits.from_settings(Settings(**settings))


def test_measure_is_the_compact_json_length():
    value = {"a": [1, 2.5, None, True, 'é"\\n'], "b": {}, "c": [], "ünï": {"x": [{"y": "z"}]}}
    resolver = RefResolver({}, limits_with())
    assert resolver.measure(value) == (len(json.dumps(value, separators=(",", ":"))), 4)
    for limit in (0, 1, 7, 30, 1000):
        assert json_preview(value, limit) == json.dumps(value, separators=(",", ":"))[:limit]


def test_realistic_128_operation_app_fits_the_defaults(api):
    client, keys = api
    doc = shared_document(128)
    started = time.process_time()
    resp = register(client, keys.operator, doc)
    assert resp.status_code == 201, resp.text
    assert resp.json()["apis"] == 128
    assert time.process_time() - started < 2.0


# --- the stored form --------------------------------------------------------------------------------


def test_requests_use_the_stored_operations_not_the_document(api, monkeypatch):
    """After registration the document is never parsed again: listing, API docs and an episode's world all
    come from the operations stored on the row (shown by breaking the stored document and counting parses)."""
    from agentloop.agent.runner import prepare_world
    from agentloop.settings import get_settings
    from agentloop.store.models import Task

    client, keys = api
    admin = bearer(keys.tenant_a_admin)
    assert register(client, keys.operator, shared_document(3)).status_code == 201
    with get_sessionmaker()() as s:
        row = s.scalars(sa.select(App)).one()
        assert row.operations is not None and len(row.operations["operations"]) == 3
        assert row.operation_ids == ["create_customer_0", "create_customer_1", "create_customer_2"]
        row.spec = {"not": "an OpenAPI document"}  # parsing it now would fail
        s.commit()

    parses = []
    original = openapi_refs.RefResolver.__init__

    def counting(self, *args, **kwargs):
        parses.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(openapi_refs.RefResolver, "__init__", counting)

    listed = {a["name"]: a for a in client.get("/v1/apps", headers=admin).json()}
    assert listed["shop_api"]["apis"] == 3
    docs = client.get("/v1/apps/shop_api/apis", headers=admin).json()
    assert {d["api"] for d in docs} == {"create_customer_0", "create_customer_1", "create_customer_2"}
    task = client.post("/v1/tasks", json={"instruction": "Add a customer.", "apps": ["shop_api"]}, headers=admin)
    assert task.status_code == 202, task.text
    with get_sessionmaker()() as s:
        prepared = prepare_world(s.get(Task, task.json()["id"]), get_settings())
    assert "create_customer_2" in prepared.world.apps["shop_api"].apis
    assert parses == []


def test_an_app_registered_before_operations_were_stored_is_resolved_once(api, monkeypatch):
    client, keys = api
    admin = bearer(keys.tenant_a_admin)
    assert register(client, keys.operator, shared_document(3)).status_code == 201
    with get_sessionmaker()() as s:
        s.execute(sa.update(App).values(operations=None, operation_ids=None))  # as migration 0005 leaves a row
        s.commit()

    parses = []
    original = openapi_refs.RefResolver.__init__

    def counting(self, *args, **kwargs):
        parses.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(openapi_refs.RefResolver, "__init__", counting)
    for _ in range(3):
        listed = {a["name"]: a for a in client.get("/v1/apps", headers=admin).json()}
        assert listed["shop_api"]["apis"] == 3
    assert len(client.get("/v1/apps/shop_api/apis", headers=admin).json()) == 3
    assert parses == [1]  # the first listing resolved it and stored the result
    with get_sessionmaker()() as s:
        row = s.scalars(sa.select(App)).one()
        assert row.operations is not None and row.operation_ids is not None


def test_references_are_uris_and_json_pointers():
    """A $ref's fragment is percent-decoded, then read as a JSON pointer: `~1` and `~0` escapes, and array
    indexes (a parameter declared once and referred to from another operation); a bad index points nowhere."""
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "paths": {
            "/items/{id}": {
                "get": {
                    "operationId": "get_item",
                    "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}],
                    "responses": {"200": {"description": "ok"}},
                },
                "delete": {
                    "operationId": "delete_item",
                    "parameters": [{"$ref": "#/paths/~1items~1%7Bid%7D/get/parameters/0"}],
                    "responses": {"200": {"description": "ok"}},
                },
            },
            "/notes": {
                "post": {
                    "operationId": "add_note",
                    "requestBody": {
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/%4Eote.body"}}}
                    },
                    "responses": {"200": {"description": "ok"}},
                }
            },
        },
        "components": {"schemas": {"Note.body": {"type": "object", "properties": {"text": {"type": "string"}}}}},
    }
    ops = {op.operation_id: op for op in parse_document(doc)}
    assert ops["delete_item"].parameters[0]["name"] == "id"
    assert ops["add_note"].body_schema == {"type": "object", "properties": {"text": {"type": "string"}}}
    for bad in ("/1", "/01", "/-"):
        doc["paths"]["/items/{id}"]["delete"]["parameters"] = [
            {"$ref": "#/paths/~1items~1%7Bid%7D/get/parameters" + bad}
        ]
        with pytest.raises(AppRegistrationError, match="points nowhere"):
            parse_document(doc)
