"""Schemathesis against the ASGI app, every route, with its default checks (no 5xx, responses as documented:
status codes, content types, headers and bodies; schema-violating requests refused; schema-valid ones
accepted), on SQLite and PostgreSQL, with an operator key (every route answers it) and a bounded number of
examples per route.

One check is configured rather than left at its default: `positive_data_acceptance` also takes a 422 for
data the document allows, because some rules are not in the document (a world or a cursor that does not
exist, `task_ref` with `instruction`). Such a 422 must be one of those rules, never a type or shape the
document allows and the validation refuses: `schema_valid_refusals_are_rules` looks at its details."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from agentloop.api.app import create_app
from agentloop.store.db import get_sessionmaker
from tests.factories import bearer, make_keys

EXAMPLES = 20  # per route and database: 26 routes x 2 databases in well under a minute

CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]
"""


@pytest.fixture
def api_schema(db_url: str) -> Any:
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    config = SchemathesisConfig.from_str(CONFIG)
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(), config=config)
    schema.config.headers = bearer(keys.operator)
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


def schema_valid_refusals_are_rules(case: Any, response: Any) -> None:
    """A 422 for data the generator meant to be valid names a rule of ours (a custom validator's
    value_error, or a message without pydantic's details), never a type pydantic refused."""
    mode = getattr(getattr(getattr(case, "_meta", None), "generation", None), "mode", None)
    if response.status_code != 422 or str(mode) not in ("positive", "GenerationMode.POSITIVE"):
        return
    body = response.json()["error"]
    assert body["code"] == "invalid_request" and body["message"], body
    kinds = {d.get("type") for d in body.get("details") or []}
    assert kinds <= {"value_error", "text_not_storable"}, (case.as_curl_command(), body)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_every_route_answers_as_documented(case: Any) -> None:
    response = case.call_and_validate()
    schema_valid_refusals_are_rules(case, response)


def test_the_document_names_the_shared_outcomes(sqlite_db: str) -> None:
    """Besides each route's own: 401/429 where a key is taken, 400/413 where a body is, 422 and 503 everywhere
    the database is read; the key is a bearer security scheme, not a header parameter."""
    doc = TestClient(create_app()).get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    checked = 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert "422" in codes, (method, path)
            assert "HTTPValidationError" not in str(op["responses"]["422"]), (method, path)
            assert all(p["name"].lower() != "authorization" for p in op.get("parameters", [])), (method, path)
            if path in ("/healthz", "/readyz"):
                assert "security" not in op
                continue
            assert op["security"] == [{"bearer": []}], (method, path)
            assert {"401", "429", "503"} <= codes, (method, path, codes)
            if "requestBody" in op:
                assert {"400", "413"} <= codes, (method, path, codes)
            checked += 1
    assert checked >= 20
