"""What reaches an external app is what the service allows: a path parameter stays one segment under the
app's base path, and the headers the service sets (Host, the auth header, Agentloop-Episode, ...) are the
service's, whatever the document declares and whatever the agent writes."""

from typing import Any

import pytest
from fastapi import FastAPI, Request

from agentloop.apps.addresses import parse_networks
from agentloop.apps.base import ApiError
from agentloop.apps.openapi import parse_document
from agentloop.apps.remote_http import Origin, RemoteClient, call_operation
from tests.apps.loopback_app import LOOPBACK_NETWORKS, serve_app

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "echo", "version": "1"},
    "paths": {
        "/items/{item_id}": {
            "get": {
                "operationId": "show_item",
                "parameters": [
                    {"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "Host", "in": "header", "schema": {"type": "string"}},
                    {"name": "Authorization", "in": "header", "schema": {"type": "string"}},
                    {"name": "Cookie", "in": "header", "schema": {"type": "string"}},
                    {"name": "agentloop-episode", "in": "header", "schema": {"type": "string"}},
                    {"name": "session", "in": "cookie", "schema": {"type": "string"}},
                    {"name": "X-Trace", "in": "header", "schema": {"type": "string"}},
                ],
            }
        }
    },
}


@pytest.fixture
def echo():
    """An app under /api that answers with the path and headers it got."""
    seen: list[dict[str, Any]] = []
    app = FastAPI()

    @app.api_route("/{rest:path}", methods=["GET"])
    def anything(rest: str, request: Request) -> dict[str, Any]:
        got = {"path": request.scope["raw_path"].decode(), "headers": dict(request.headers)}
        seen.append(got)
        return got

    with serve_app(app) as base_url:
        yield f"{base_url}/api", seen


def client_for(base_url: str, episode: str = "ep-1") -> RemoteClient:
    return RemoteClient(
        Origin.parse(base_url),
        tuple(parse_networks(LOOPBACK_NETWORKS)),
        auth_header=("Authorization", "Bearer app-secret"),
        episode=episode,
    )


def test_reserved_headers_and_cookies_are_not_arguments():
    (op,) = parse_document(DOCUMENT)
    assert [(p["name"], p["in"]) for p in op.parameters] == [("item_id", "path"), ("X-Trace", "header")]
    assert set(op.arguments_schema()["properties"]) == {"item_id", "X-Trace"}


def test_the_service_sets_its_own_headers_whatever_the_agent_writes(echo):
    base_url, seen = echo
    (op,) = parse_document(DOCUMENT)
    client = client_for(base_url)
    got = call_operation(client, op, {"item_id": "a b", "X-Trace": "t1"})
    assert got["path"] == "/api/items/a%20b"
    assert got["headers"]["x-trace"] == "t1"
    # arguments the document may not declare, sent anyway (a stale operation, a hand-built call): dropped
    got = client.request(
        "GET",
        "/items/x",
        headers={"Host": "internal.example", "authorization": "Bearer stolen", "Agentloop-Episode": "other"},
    )
    port = base_url.split(":")[2].split("/")[0]
    assert got["headers"]["host"] == f"127.0.0.1:{port}"
    assert got["headers"]["authorization"] == "Bearer app-secret"
    assert got["headers"]["agentloop-episode"] == "ep-1"
    assert len(seen) == 2


@pytest.mark.parametrize("value", ["..", ".", "", "a/b", "../../admin", "a\\b", "a\nb", "a\x00b", "\x7f"])
def test_a_path_parameter_cannot_leave_its_segment(echo, value):
    base_url, seen = echo
    (op,) = parse_document(DOCUMENT)
    with pytest.raises(ApiError) as err:
        call_operation(client_for(base_url), op, {"item_id": value})
    assert err.value.status == 400 and "must be one path segment" in err.value.message
    assert seen == []  # nothing was sent


@pytest.mark.parametrize("value", ["a..b", "%2e%2e", "v1.2", "ü", 7])
def test_other_values_are_one_escaped_segment(echo, value):
    base_url, seen = echo
    (op,) = parse_document(DOCUMENT)
    got = call_operation(client_for(base_url), op, {"item_id": value})
    assert got["path"].startswith("/api/items/") and got["path"].count("/") == 3
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(openapi="3.0.3"), "not a valid OpenAPI 3.0.3 document: 'responses' is a required property"),
        (
            lambda d: d.pop("info"),
            "not a valid OpenAPI 3.1.0 document: 'info' is a required property, at the top level",
        ),
        (
            lambda d: d["paths"]["/items/{item_id}"]["get"].update(responses={"200": {}}),
            "not a valid OpenAPI 3.1.0 document: 'description' is a required property, at paths/",
        ),
    ],
)
def test_a_document_that_breaks_its_openapi_version_is_refused(change, message):
    import copy

    from agentloop.apps.openapi_refs import AppRegistrationError

    doc = copy.deepcopy(DOCUMENT)
    parse_document(doc)  # valid as it is
    change(doc)
    with pytest.raises(AppRegistrationError) as err:
        parse_document(doc)
    assert str(err.value).startswith(message), str(err.value)
