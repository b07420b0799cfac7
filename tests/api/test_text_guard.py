"""Text no store can hold (NUL, lone surrogates) is refused with 422 naming where it is, on every route's path,
query and body, on SQLite and PostgreSQL, and writes nothing; a 405 says which methods the path takes."""

import re

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.api.errors import InvalidRequest
from agentloop.api.text_guard import check_message, check_text
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import Base
from tests.factories import bearer, make_keys


@pytest.fixture
def env(db_url):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app(), raise_server_exceptions=False), keys


def row_counts() -> dict[str, int]:
    with get_sessionmaker()() as s:
        return {t.name: s.scalar(sa.select(sa.func.count()).select_from(t)) for t in Base.metadata.sorted_tables}


def routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path template) of every documented route."""
    paths = client.app.openapi()["paths"]
    return [(m.upper(), p) for p, ops in paths.items() for m in ops if m in ("get", "post", "put", "patch", "delete")]


def test_every_route_refuses_a_nul_in_its_path_query_and_body(env):
    client, keys = env
    before = row_counts()
    checked = 0
    for method, template in routes(client):
        headers = bearer(keys.operator)
        if "{" in template:
            path = re.sub(r"\{[^}]+\}", "a%00b", template)
            resp = client.request(method, path, headers=headers, json={} if method in ("POST", "PUT") else None)
            assert resp.status_code == 422, (method, template, resp.text)
            assert resp.json()["error"]["details"][0]["loc"] == ["path"], resp.text
            checked += 1
        path = re.sub(r"\{[^}]+\}", "x", template)
        resp = client.request(method, f"{path}?cursor=a%00", headers=headers)
        assert resp.status_code == 422, (method, template, resp.text)
        assert "query.cursor: contains a NUL character" in resp.json()["error"]["message"]
        if method in ("POST", "PUT", "PATCH"):
            for body, loc in [
                ({"name": "ok", "nested": [{"x": "a\u0000b"}]}, ["body", "nested", "0", "x"]),
                ({"k\u0000": 1}, ["body", "k\\x00"]),
            ]:
                resp = client.request(method, path, headers=headers, json=body)
                assert resp.status_code == 422, (method, template, resp.text)
                assert resp.json()["error"]["details"][0]["loc"] == loc
        checked += 1
    assert checked > 25  # every route was reached, with or without path parameters
    assert row_counts() == before


def test_a_task_with_a_nul_or_a_lone_surrogate_is_refused_and_nothing_is_written(env):
    client, keys = env
    headers = bearer(keys.tenant_a_client)
    before = row_counts()
    resp = client.post("/v1/tasks", json={"instruction": "hi\u0000there", "apps": ["wallet"]}, headers=headers)
    assert resp.status_code == 422
    assert resp.json()["error"] == {
        "code": "invalid_request",
        "message": "body.instruction: contains a NUL character (\\u0000), which cannot be stored",
        "details": [
            {
                "loc": ["body", "instruction"],
                "message": "contains a NUL character (\\u0000), which cannot be stored",
                "type": "text_not_storable",
            }
        ],
    }
    raw = b'{"instruction": "hi \\ud800", "apps": ["wallet"]}'  # JSON may escape a lone surrogate
    resp = client.post("/v1/tasks", content=raw, headers={**headers, "Content-Type": "application/json"})
    assert resp.status_code == 422 and "lone surrogate (\\ud800)" in resp.json()["error"]["message"]
    resp = client.get("/v1/tasks/%00x", headers=headers)
    assert resp.status_code == 422
    assert row_counts() == before
    # the same task without the character is taken: the guard refuses the character, not the task
    resp = client.post("/v1/tasks", json={"instruction": "hi there", "apps": ["wallet"]}, headers=headers)
    assert resp.status_code == 202, resp.text


def test_a_method_a_path_does_not_take_is_405_with_allow(env):
    client, keys = env
    resp = client.put("/v1/tasks", headers=bearer(keys.tenant_a_client))
    assert resp.status_code == 405
    assert resp.headers["allow"] == "GET, POST"
    assert resp.json()["error"] == {
        "code": "method_not_allowed",
        "message": "PUT is not allowed on /v1/tasks; it takes GET, POST",
    }
    resp = client.delete("/v1/apps", headers=bearer(keys.tenant_a_admin))
    assert (resp.status_code, resp.headers["allow"]) == (405, "GET, POST")


@pytest.mark.parametrize(
    ("value", "loc"),
    [
        ("plain", None),
        ({"a": [1, 2.5, None, True, {"b": "ok"}]}, None),
        ({"a": [1, {"b": "x\u0000"}]}, "body.a.1.b"),
        ({"a\u0000": 1}, "body.a\\x00"),
        (["ok", "\udfff"], "body.1"),
    ],
)
def test_check_text_names_where_the_character_is(value, loc):
    if loc is None:
        check_text(value, "body")
        return
    with pytest.raises(InvalidRequest) as err:
        check_text(value, "body")
    assert err.value.message.startswith(f"{loc}: ")


def test_check_text_walks_deep_values_without_recursion():
    value: object = "x\u0000"
    for _ in range(5000):
        value = [value]
    with pytest.raises(InvalidRequest) as err:
        check_text(value, "body")
    assert err.value.message.startswith("body." + ".".join(["0"] * 5000) + ": contains a NUL")


@pytest.mark.parametrize(
    ("request_message", "where"),
    [
        (pb.SubmitTaskRequest(task_ref="wallet_balance-1"), None),
        (pb.SubmitTaskRequest(instruction="a\u0000b", apps=["wallet"]), "request.instruction"),
        (pb.SubmitTaskRequest(instruction="x", apps=["wallet", "no\u0000te"]), "request.apps.1"),
        (pb.SubmitTaskRequest(task_ref="w", metadata={"k": "v\u0000"}), "request.metadata.k"),
        (pb.SubmitTaskRequest(task_ref="w", metadata={"k\u0000": "v"}), "request.metadata"),
        (pb.TrainRequest(algo="loop"), None),
    ],
)
def test_check_message_walks_strings_repeated_fields_and_maps(request_message, where):
    if where is None:
        check_message(request_message)
        return
    with pytest.raises(InvalidRequest) as err:
        check_message(request_message)
    assert err.value.message.startswith(f"{where}: ")


def test_check_message_walks_struct_values():
    request = pb.TrainRequest(algo="loop")
    request.config.update({"scenarios": ["fine", "ba\u0000d"], "nested": {"k": "v"}})
    with pytest.raises(InvalidRequest) as err:
        check_message(request)
    assert "contains a NUL character" in err.value.message and err.value.message.startswith("request.config")
