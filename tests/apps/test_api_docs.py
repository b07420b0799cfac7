"""api_docs on large registered apps, walked as the agent walks them: every call goes through a real World
inside an Episode (its observation rendering and token cap), so what is asserted is what the agent reads.
Token counts are measured with the default tokenizer (SmolLM2's, the `tokenizer` fixture)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm.attributes import flag_modified

from agentloop.agent.actions import render_action
from agentloop.agent.episode import Episode, Limits, Turn, run_episodes
from agentloop.agent.prompt import ChatFormat
from agentloop.api.app import create_app
from agentloop.apps.api_doc import (
    DOC_MAX_SIZE,
    INDEX_SIZE,
    api_index,
    clip,
    fitted_api_doc,
    json_size,
    one_line,
    text_size,
)
from agentloop.apps.base import Api, ApiError, AppSpec
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.openapi import RETURNS_SCHEMA_SIZE, parse_document
from agentloop.apps.tasks import ToolCall
from agentloop.policy.base import Generation
from agentloop.policy.scripted import ScriptedPolicy
from agentloop.settings import get_settings
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import App, Task
from tests.apps.loopback_app import LOOPBACK_NETWORKS
from tests.factories import bearer, make_keys

BASE_URL = "http://127.0.0.1:9"  # only resolved at registration (allowed_networks, operator key), never called here
NOUNS = [
    *("customer", "invoice", "order", "product", "shipment", "warehouse", "supplier", "payment", "refund", "ticket"),
    *("contract", "lead", "campaign", "report", "region", "ledger", "budget", "asset", "vendor", "subscription"),
]
VERBS = ("list", "get", "create", "update", "delete", "search", "export", "archive", "restore", "count")
STATUSES = ["draft", "open", "pending", "active", "closed", "void"]


# --- the documents --------------------------------------------------------------------------------------


def _description(verb: str, noun: str, i: int) -> str:
    """A long, specific description (400-900 characters), as real documentation is."""
    sentences = [
        f"{verb.capitalize()} {noun} records of the tenant's workspace (operation {i}).",
        f"Every {noun} belongs to one region and one ledger; archived {noun}s are left out unless asked for.",
        "Amounts are Money objects: integer minor units and an ISO 4217 currency code, never floats.",
        f"Results are sorted by creation time, newest first, and the caller needs the {noun}:read scope.",
        "Dates are ISO 8601 in UTC. Rate limit: 20 requests a second per API key; a 429 says when to retry.",
        f"Changes to a {noun} are recorded in its audit log, which the export operations include.",
        f"A {noun} in status 'void' cannot change any more; restore it first if it was archived.",
    ]
    return "\n\n".join(sentences[: 3 + i % 5])


def big_document(n: int = 200) -> dict[str, Any]:
    """`n` operations over shared components (Address, Money, Contact and a Record per noun)."""
    schemas: dict[str, Any] = {
        "Address": {
            "type": "object",
            "description": "A postal address.",
            "required": ["street", "city", "country"],
            "properties": {
                "street": {"type": "string", "description": "Street and number."},
                "city": {"type": "string"},
                "postcode": {"type": "string"},
                "country": {"type": "string", "enum": ["FR", "DE", "IT", "ES", "PT"], "description": "ISO code."},
            },
        },
        "Money": {
            "type": "object",
            "required": ["amount", "currency"],
            "properties": {
                "amount": {"type": "integer", "description": "Minor units (cents)."},
                "currency": {"type": "string", "default": "EUR"},
            },
        },
        "Contact": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "address": {"$ref": "#/components/schemas/Address"},
            },
        },
    }
    for noun in NOUNS:
        schemas[noun.capitalize()] = {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "description": f"The {noun}'s display name."},
                "state": {"type": "string", "enum": STATUSES},
                "owner": {"$ref": "#/components/schemas/Contact"},
                "total": {"$ref": "#/components/schemas/Money"},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Free labels."},
                "lines": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
                    },
                },
            },
        }
    paths: dict[str, Any] = {}
    for i in range(n):
        noun, verb = NOUNS[i % len(NOUNS)], VERBS[(i // len(NOUNS)) % len(VERBS)]
        op_id = f"{verb}_{noun}s" if i < len(NOUNS) * len(VERBS) else f"{verb}_{noun}s_{i}"
        record = {"$ref": f"#/components/schemas/{noun.capitalize()}"}
        op: dict[str, Any] = {
            "operationId": op_id,
            "description": _description(verb, noun, i),
            "parameters": [
                {"name": "region", "in": "query", "schema": {"type": "string"}, "description": "Region code."},
                {"name": "status", "in": "query", "schema": {"type": "string", "enum": STATUSES}},
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                    "description": "Records per page.",
                },
            ],
            "responses": {
                "200": {
                    "description": f"The {noun}s.",
                    "content": {"application/json": {"schema": {"type": "array", "items": record}}},
                }
            },
        }
        if i % 7:  # every seventh has only a description: its summary is the description's first sentence
            op["summary"] = f"{verb.capitalize()} {noun}s by region and status (op {i})."
        if verb in ("create", "update"):
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": record}}}
        paths[f"/{noun}s/{verb}/{i}"] = {"post" if verb in ("create", "update") else "get": op}
    return {
        "openapi": "3.1.0",
        "info": {"title": "crm", "version": "1"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def expected_operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}


# --- walking api_docs as the agent -----------------------------------------------------------------------


@pytest.fixture
def api(sqlite_db):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), keys


def register(client: TestClient, admin: str, doc: dict[str, Any], name: str = "crm") -> Any:
    body = {"name": name, "description": "Customer records.", "openapi": doc, "base_url": BASE_URL}
    return client.post("/v1/apps", json={**body, "allowed_networks": LOOPBACK_NETWORKS}, headers=bearer(admin))


def start_episode(client: TestClient, admin: str, tokenizer: Any, apps: list[str]) -> Episode:
    """The episode the runner would start for a free task on `apps` (its world, its limits)."""
    from agentloop.agent.runner import prepare_world

    task = client.post("/v1/tasks", json={"instruction": "Read the docs.", "apps": apps}, headers=bearer(admin))
    assert task.status_code == 202, task.text
    settings = get_settings()
    with get_sessionmaker()() as s:
        prepared = prepare_world(s.get(Task, task.json()["id"]), settings)
    # as many turns and as much context as a full walk of the docs takes; the observation cap is the setting's
    limits = Limits.from_settings(settings, max_turns=10_000, max_context_tokens=10**8)
    return Episode(prepared.world, ChatFormat(tokenizer), "Read the docs.", limits, key="walk")


class Agent:
    """Makes calls in an episode turn by turn, as a policy would, and reads back what the episode shows."""

    def __init__(self, ep: Episode, tokenizer: Any) -> None:
        self.ep, self.tokenizer = ep, tokenizer
        eos = tokenizer.eos_token_id
        self.eos = int(eos[0] if isinstance(eos, list) else eos)
        self.most_tokens = 0

    def turn(self, app: str, api: str, **args: Any) -> Turn:
        text = render_action(ToolCall(app, api, args))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.ep.advance(Generation([*ids, self.eos], None, "stop", text))

    def call(self, app: str, api: str, **args: Any) -> Any:
        """The call's result, asserting the agent saw all of it, within the cap."""
        turn = self.turn(app, api, **args)
        tokens = len(self.tokenizer.encode(turn.observation, add_special_tokens=False))
        self.most_tokens = max(self.most_tokens, tokens)
        assert "[Output truncated" not in turn.observation, turn.observation[-300:]
        assert tokens <= self.ep.limits.observation_max_tokens
        assert turn.error_kind is None, turn.observation
        head, body = turn.observation.split("\n", 1)
        assert head == f"{app}.{api} returned:"
        return json.loads(body)

    def list_all(self, app: str, **args: Any) -> list[str]:
        """Every line list_apis gives for `app`, page after page, going on as each page's `next` says."""
        lines: list[str] = []
        page_index = 0
        while True:
            page = self.call("api_docs", "list_apis", app_name=app, page_index=page_index, **args)
            lines += page["apis"]
            go_on = re.search(r"page_index=(\d+)", page["next"])
            if go_on is None:
                assert page["next"].startswith("None")
                return lines
            assert int(go_on.group(1)) == page_index + 1
            page_index += 1


def arguments(op: dict[str, Any], doc: dict[str, Any]) -> dict[str, bool]:
    """name -> required, of an operation's arguments: its parameters and its body record's properties."""
    args = {p["name"]: bool(p.get("required", False)) for p in op["parameters"]}
    if "requestBody" in op:
        record = doc["components"]["schemas"][op["requestBody"]["content"]["application/json"]["schema"]["$ref"][21:]]
        args.update({name: name in record["required"] for name in record["properties"]})
    return args


def test_every_operation_of_a_200_operation_app_is_listed_and_documented_within_the_cap(api, tokenizer):
    client, keys = api
    doc = big_document(200)
    resp = register(client, keys.operator, doc)
    assert resp.status_code == 201, resp.text
    assert resp.json()["apis"] == 200
    ops = expected_operations(doc)
    agent = Agent(start_episode(client, keys.tenant_a_admin, tokenizer, ["crm"]), tokenizer)

    first = agent.call("api_docs", "list_apis", app_name="crm")
    assert first["page"] == "APIs 1-10 of 200" and len(first["apis"]) == 10
    assert agent.most_tokens <= agent.ep.limits.observation_max_tokens // 2  # the default page: well within
    lines = agent.list_all("crm")
    names = [line.split(": ", 1)[0] for line in lines]
    assert names == list(ops)  # all 200, each once, in the document's order
    for line in lines:
        name, summary = line.split(": ", 1)
        op = ops[name]
        assert summary == op.get("summary", op["description"].split("\n")[0])

    for name, op in ops.items():
        shown = agent.call("api_docs", "show_api_doc", app_name="crm", api_name=name)
        assert "shortened" not in shown
        assert shown["description"] == op["description"]  # the description, not the summary, and all of it
        assert shown["returns"].startswith(op["responses"]["200"]["description"])
        params = {p["name"]: p for p in shown["parameters"]}
        assert {n: p["required"] for n, p in params.items()} == arguments(op, doc)
        assert params["status"]["enum"] == STATUSES
        assert params["limit"]["default"] == 20 and params["limit"]["maximum"] == 100
        assert params["region"]["description"] == "Region code."
        if "requestBody" in op:  # the shared components, written out compactly with their own docs
            owner = params["owner"]["schema"]
            assert owner.startswith("{name?: string, email?: string<email>, address?: {street: string (Street")
            assert "'FR'|'DE'|'IT'|'ES'|'PT' (ISO code.)} (A postal address.)}" in owner
            assert params["total"]["schema"] == "{amount: integer (Minor units (cents).), currency: string = 'EUR'}"
            assert params["lines"]["schema"] == "[{sku?: string, quantity?: integer}]"
            assert params["tags"]["schema"] == "[string]"
    assert len(agent.ep.turns) == 1 + 20 + 200


def test_a_query_narrows_the_list(api, tokenizer):
    client, keys = api
    doc = big_document(200)
    assert register(client, keys.operator, doc).status_code == 201
    ops = expected_operations(doc)
    agent = Agent(start_episode(client, keys.tenant_a_admin, tokenizer, ["crm"]), tokenizer)

    def matching(*words: str) -> list[str]:
        text = {n: f"{n} {op.get('summary', '')} {op['description']}".lower() for n, op in ops.items()}
        return [n for n in ops if all(w in text[n] for w in words)]

    limited = matching("rate", "limit")  # words of the descriptions only
    assert 10 < len(limited) < 200
    page = agent.call("api_docs", "list_apis", app_name="crm", query="Rate LIMIT")
    assert page["query"] == "Rate LIMIT"
    assert page["page"] == f"APIs 1-10 of the {len(limited)} matching the query (200 in all)"
    assert "page_index=1 and the same query" in page["next"]
    assert [line.split(": ")[0] for line in agent.list_all("crm", query="Rate LIMIT")] == limited
    # every word must match, in the name, the summary or the description
    narrower = matching("rate", "limit", "export")
    assert 0 < len(narrower) < len(limited)
    assert [line.split(": ")[0] for line in agent.list_all("crm", query="rate limit export")] == narrower
    invoices = agent.list_all("crm", query="invoice")
    assert [line.split(": ")[0] for line in invoices] == [n for n in ops if "invoice" in n] == matching("invoice")
    assert invoices[0] == "list_invoices: List invoices by region and status (op 1)."
    none = agent.call("api_docs", "list_apis", app_name="crm", query="spaceship")
    assert none["apis"] == [] and "No API of crm matches 'spaceship'" in none["page"]
    past = agent.call("api_docs", "list_apis", app_name="crm", page_index=25)
    assert past["apis"] == [] and "pages 0-19" in past["page"]
    # the REST listing of the app's docs is the full documentation, nested schemas included
    listed = client.get("/v1/apps/crm/apis", headers=bearer(keys.tenant_a_client)).json()
    create = next(d for d in listed if d["api"] == "create_customers")
    assert {p["name"]: p["schema"] for p in create["parameters"]}["lines"] == "[{sku?: string, quantity?: integer}]"


@pytest.mark.parametrize(
    ("summary", "largest_page_fits"),
    [
        (" ".join(["Lists every customer invoice of a region and quarter, with totals and taxes."] * 8), True),
        # other scripts cost more tokens: 20 such lines need a smaller page_limit, as the truncation note says
        ("顧客の請求書を地域と四半期ごとに一覧表示し、合計と税額を示します。" * 4, False),
    ],
)
def test_the_default_list_page_fits_well_within_the_cap_whatever_the_lines(tokenizer, summary, largest_page_fits):
    spec = AppSpec(name="ledger", description="Ledgers.", login=False)
    for i in range(30):
        name = f"export_customer_invoices_by_region_and_quarter_with_taxes_{i:06d}"  # 64 characters, the most
        spec.apis[name] = Api("ledger", name, summary, {"type": "object", "properties": {}}, "", lambda _ctx: None)
    world = BUILTIN.new_world(0, [])
    world.attach(spec)
    agent = Agent(Episode(world, ChatFormat(tokenizer), "Read the docs.", Limits(), key="k"), tokenizer)
    cap = agent.ep.limits.observation_max_tokens
    assert len(agent.call("api_docs", "list_apis", app_name="ledger")["apis"]) == 10
    assert agent.most_tokens <= cap * 2 // 3  # a third of the cap to spare, with the longest names there are
    if largest_page_fits:
        assert len(agent.call("api_docs", "list_apis", app_name="ledger", page_limit=20)["apis"]) == 20
    else:
        cut = agent.turn("api_docs", "list_apis", app_name="ledger", page_limit=20).observation
        assert cut.endswith("Ask for less: a smaller page_limit or a narrower query (and page_index for the rest).]")


# --- documentation too large to show whole -------------------------------------------------------------

LONG_TEXT = " ".join(f"Rule {i} of the import explains one more case of the format in detail." for i in range(80))


def large_document() -> dict[str, Any]:
    """Two operations whose docs cannot be shown whole: a long description, many parameters with long
    descriptions and large enums, a body nested 20 levels deep; and one with 400 parameters."""
    nested: dict[str, Any] = {"type": "string", "description": "The innermost value."}
    for depth in range(20):
        nested = {
            "type": "object",
            "description": f"Level {depth}.",
            "properties": {f"level_{depth}": nested, "note": {"type": "string", "description": "A note. " * 10}},
        }
    filters = [
        {
            "name": f"filter_{i}",
            "in": "query",
            "required": i < 3,
            "schema": {"type": "string", "enum": [f"value_{j}" for j in range(40)]},
            "description": f"Filter {i}: " + "keeps the records whose field has this value. " * 4,
        }
        for i in range(40)
    ]
    body = {
        "type": "object",
        "properties": {"payload": nested, "country": {"type": "string", "enum": [f"C{i:03d}" for i in range(300)]}},
    }
    columns = [{"name": f"column_{i:03d}", "in": "query", "schema": {"type": "integer"}} for i in range(400)]
    return {
        "openapi": "3.1.0",
        "info": {"title": "importer", "version": "1"},
        "paths": {
            "/import": {
                "post": {
                    "operationId": "import_records",
                    "description": LONG_TEXT,
                    "parameters": filters,
                    "requestBody": {"content": {"application/json": {"schema": body}}},
                    "responses": {"200": {"description": "The import's report."}},
                }
            },
            "/wide": {
                "get": {"operationId": "wide_report", "summary": "One column a parameter.", "parameters": columns}
            },
        },
    }


def parameter_names(doc: dict[str, Any]) -> list[str]:
    """Names of the parameters a doc shows, whether as objects or one line each."""
    return [p["name"] if isinstance(p, dict) else p.split(":", 1)[0].rstrip("?") for p in doc["parameters"]]


def test_a_very_large_doc_is_shortened_to_fit_and_says_what_was_cut(api, tokenizer):
    client, keys = api
    assert register(client, keys.operator, large_document(), name="importer").status_code == 201
    agent = Agent(start_episode(client, keys.tenant_a_admin, tokenizer, ["importer"]), tokenizer)

    shown = agent.call("api_docs", "show_api_doc", app_name="importer", api_name="import_records")
    note = shown["shortened"]
    assert list(shown)[:3] == ["app", "api", "shortened"]  # the note comes before what it is about
    assert note.startswith("Shortened to fit (… marks a cut): the description, to ")
    assert "the descriptions of 41 parameters" in note and "the schemas of 42 parameters" in note
    assert shown["description"].endswith("…") and LONG_TEXT.startswith(shown["description"][:-1])
    assert len(shown["description"]) >= 300  # shortened, not dropped
    # every parameter is still there, with whether it is required
    assert parameter_names(shown) == [f"filter_{i}" for i in range(40)] + ["payload", "country"]
    assert all(p.startswith(f"filter_{i}: ") for i, p in enumerate(shown["parameters"][:3]))
    assert all("?: " in p for p in shown["parameters"][3:])
    assert json_size(shown) <= DOC_MAX_SIZE

    wide = agent.call("api_docs", "show_api_doc", app_name="importer", api_name="wide_report")
    kept = parameter_names(wide)
    assert 0 < len(kept) < 400 and kept == [f"column_{i:03d}" for i in range(len(kept))]
    assert f"{400 - len(kept)} parameters left out: column_{len(kept):03d}, " in wide["shortened"]


def test_doc_parts_are_written_compactly():
    node = "(recursive: the schema of #/components/schemas/Node)"
    schema = {
        "type": "object",
        "required": ["tree"],
        "properties": {
            "tree": {"type": "object", "properties": {"children": {"type": "array", "items": {"description": node}}}},
            "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "Or nothing."},
            "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
            "when": {"type": "string", "format": "date-time"},
            "deep": {"type": ["object", "null"], "properties": {"x": {"type": "integer", "default": 3}}},
        },
    }
    api = Api("a", "b", "Does b.", schema, "", lambda _ctx: None)
    params = {p["name"]: p for p in fitted_api_doc(api)["parameters"]}
    assert params["tree"]["required"] and params["tree"]["schema"] == f"{{children?: [{node}]}}"
    assert params["maybe"]["type"] == "string|null" and params["maybe"]["schema"] == "string|null"
    assert params["maybe"]["description"] == "Or nothing."
    assert params["labels"]["schema"] == "{[key]: integer}"
    assert params["when"] == {"name": "when", "type": "string", "required": False, "format": "date-time"}
    assert params["deep"]["schema"] == "{x?: integer = 3}|null"
    # sizes are estimated tokens: a short word is one, a CJK character two (as is the "…")
    assert clip("word " * 40, 10) == "word " * 7 + "word…"
    assert clip("Lists the invoices of a customer.", 5) == "Lists the…"  # not inside a word
    assert clip("日本語の説明" * 10, 30) == "日本語の説明日本語の説明日本…"
    assert one_line("Lists the rows.  It pages.\n" + "More. " * 40) == "Lists the rows."
    assert one_line("Short\nand whole.") == "Short and whole."


def test_a_huge_response_schema_is_outlined_without_being_expanded():
    levels = 24  # A0 expands to 2**24 leaves
    schemas: dict[str, Any] = {
        f"A{i}": {
            "type": "object",
            "properties": {side: {"$ref": f"#/components/schemas/A{i + 1}"} for side in ("left", "right")},
        }
        for i in range(levels)
    }
    schemas[f"A{levels}"] = {"type": "string"}
    tree = {
        "description": "The tree.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/A0"}}},
    }
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "paths": {"/tree": {"get": {"operationId": "tree", "responses": {"200": tree}}}},
        "components": {"schemas": schemas},
    }
    started = time.process_time()
    (op,) = parse_document(doc)
    assert time.process_time() - started < 1.0
    assert op.returns.startswith("The tree. {left?: {left?: {left?: ") and op.returns.endswith("…")
    assert text_size(op.returns) <= 4 + RETURNS_SCHEMA_SIZE


# --- argument schemas that are not valid JSON Schema ----------------------------------------------------


def widget_document(size_schema: dict[str, Any], openapi: str = "3.1.0") -> dict[str, Any]:
    ok = {"operationId": "list_widgets", "responses": {"200": {"description": "The widgets."}}}
    body = {"type": "object", "properties": {"name": {"type": "string"}, "size": size_schema}}
    create = {
        "operationId": "create_widget",
        "requestBody": {"content": {"application/json": {"schema": body}}},
        "responses": {"200": {"description": "The widget."}},
    }
    return {
        "openapi": openapi,
        "info": {"title": "widgets", "version": "1"},
        "paths": {"/widgets": {"get": ok, "post": create}},
    }


def app_rows() -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(App))


@pytest.mark.parametrize(
    ("openapi", "size_schema", "problem"),
    [
        ("3.1.0", {"type": "strng"}, "'strng' is not valid under any of the given schemas, at properties.size.type"),
        ("3.1.0", {"type": "integer", "minimum": "ten"}, "'ten' is not of type 'number', at properties.size.minimum"),
        # 2020-12 (OpenAPI 3.1) wants a number; OpenAPI 3.0's draft 4 a boolean, next to a minimum
        ("3.1.0", {"type": "integer", "exclusiveMinimum": True}, "True is not of type 'number'"),
        ("3.0.3", {"type": "integer", "exclusiveMinimum": True}, "'minimum' is a dependency of 'exclusiveMinimum'"),
        ("3.0.3", {"type": "string", "pattern": "(unclosed"}, "'(unclosed' is not a 'regex'"),
    ],
)
def test_an_invalid_argument_schema_is_refused_naming_the_operation(api, openapi, size_schema, problem):
    client, keys = api
    resp = register(client, keys.operator, widget_document(size_schema, openapi), name="widgets")
    assert resp.status_code == 422, resp.text
    message = resp.json()["error"]["message"]
    assert message.startswith("operation create_widget: the schema of the request body is not valid JSON Schema")
    assert problem in message
    assert app_rows() == 0


def test_openapi_3_0_schemas_are_checked_and_validated_as_draft_4(api):
    client, keys = api
    doc = widget_document({"type": "integer", "minimum": 0, "exclusiveMinimum": True}, "3.0.3")
    assert register(client, keys.operator, doc, name="widgets").status_code == 201
    with get_sessionmaker()() as s:
        from agentloop.store import apps as app_store

        spec = app_store.to_external(s.scalars(sa.select(App)).one(), "unused").spec()
    with pytest.raises(ApiError, match=r"Invalid size for widgets\.create_widget: 0 is less than or equal to"):
        spec.apis["create_widget"].validate({"name": "w", "size": 0})


def test_a_stored_invalid_schema_is_an_error_observation_and_the_episode_goes_on(api, tokenizer):
    """An app stored before registration checked schemas: calling the broken operation is an error the
    agent reads; its docs still show; the episode carries on to the end."""
    client, keys = api
    assert register(client, keys.operator, widget_document({"type": "integer"}), name="widgets").status_code == 201
    with get_sessionmaker()() as s:
        row = s.scalars(sa.select(App)).one()
        create = next(op for op in row.operations["operations"] if op["operation_id"] == "create_widget")
        create["body_schema"]["properties"]["size"] = {"type": "strng"}
        flag_modified(row, "operations")
        s.commit()
    ep = start_episode(client, keys.tenant_a_admin, tokenizer, ["widgets"])
    policy = ScriptedPolicy(tokenizer)
    policy.plan_actions(
        "walk",
        [
            ToolCall("widgets", "create_widget", {"name": "w", "size": 3}),
            ToolCall("api_docs", "show_api_doc", {"app_name": "widgets", "api_name": "create_widget"}),
            ToolCall("api_docs", "list_apis", {"app_name": "widgets"}),
            ToolCall("supervisor", "complete_task", {}),
        ],
    )
    run_episodes(policy, [ep])
    assert ep.finish_reason == "completed" and len(ep.turns) == 4
    broken = ep.turns[0]
    assert broken.error_kind == "api_error"
    assert (
        "widgets.create_widget cannot be called: the app's schema of its arguments is not valid" in broken.observation
    )
    assert "'strng' is not valid under any of the given schemas, at properties.size.type" in broken.observation
    assert [t.error_kind for t in ep.turns[1:]] == [None, None, None]
    assert '"size?: strng' not in ep.turns[1].observation and '"name": "size"' in ep.turns[1].observation


def test_operations_stored_in_an_older_format_are_resolved_again(api):
    """Rows stored before operations kept their summary and schema draft are resolved from their document."""
    from agentloop.store.apps import OPERATIONS_FORMAT

    client, keys = api
    doc = widget_document({"type": "integer"})
    doc["paths"]["/widgets"]["get"].update(summary="List the widgets.", description="Every widget, oldest first.")
    assert register(client, keys.operator, doc, name="widgets").status_code == 201
    with get_sessionmaker()() as s:
        row = s.scalars(sa.select(App)).one()
        old = [
            {k: v for k, v in op.items() if k not in ("summary", "schema_dialect")}
            for op in row.operations["operations"]
        ]
        row.operations = {"format": 1, "operations": old}
        s.commit()
    docs = client.get("/v1/apps/widgets/apis", headers=bearer(keys.tenant_a_client))
    assert docs.status_code == 200, docs.text
    assert next(d for d in docs.json() if d["api"] == "list_widgets")["description"] == "Every widget, oldest first."
    with get_sessionmaker()() as s:
        stored = s.scalars(sa.select(App)).one().operations
        assert stored["format"] == OPERATIONS_FORMAT == 2
        assert stored["operations"][0]["summary"] == "List the widgets."


def test_the_prompt_indexes_a_200_operation_app_within_its_budget(api, tokenizer):
    """The task's message lists every app with its APIs; an app too large to index whole is cut to the
    budget, by name where parameters do not fit, and says how many more list_apis has."""
    client, keys = api
    assert register(client, keys.operator, big_document(200)).status_code == 201
    ep = start_episode(client, keys.tenant_a_admin, tokenizer, ["crm"])
    message = tokenizer.decode(ep.prompt_token_ids).rsplit("Apps you can use:\n", 1)[1]
    (index,) = [line for line in message.splitlines() if line.startswith("  APIs: ") and "more)" in line]
    assert text_size(index.removeprefix("  APIs: ")) <= INDEX_SIZE
    shown = index.removeprefix("  APIs: ").split(", ")
    more = int(re.fullmatch(r"… \((\d+) more\)", shown[-1]).group(1))
    names = [part.split("(")[0] for part in shown[:-1]]
    assert names == list(expected_operations(big_document(200)))[: len(names)] and len(names) + more == 200


def index_app() -> AppSpec:
    app = AppSpec(name="crm", description="Customer records.", login=True)

    def find(ctx: Any, query: str, limit: int = 10) -> list[Any]:
        return []

    def show(ctx: Any, customer_id: int) -> dict[str, Any]:
        return {}

    def count(ctx: Any) -> int:
        return 0

    app.api("Find customers.", params={"query": {"type": "string"}, "limit": {"type": "integer"}}, required=["query"])(
        find
    )
    app.api("One customer.", params={"customer_id": {"type": "integer"}}, required=["customer_id"])(show)
    app.api("How many customers.")(count)
    return app


def test_an_api_index_names_parameters_marks_the_optional_ones_and_leaves_out_the_access_token():
    apis = list(index_app().apis.values())
    assert api_index(apis) == "find(query, limit?), show(customer_id), count()"
    assert "access_token" in apis[0].parameters["properties"]  # the API takes it; the index does not say so


def test_an_api_index_over_its_budget_drops_parameters_before_it_drops_apis():
    apis = list(index_app().apis.values())
    full = api_index(apis, None)
    assert api_index(apis, text_size(full)) == full
    assert api_index(apis, text_size(full) - 1) == "find(query, limit?), show(customer_id), count"  # first come first
    assert api_index(apis, text_size("find, show, count")) == "find, show, count"
    longer = [*apis, replace(apis[2], name="count_customers_by_region_and_segment")]
    assert api_index(longer, text_size("find, show, count, … (1 more)")) == "find, show, count, … (1 more)"
    assert api_index(apis, 1) == "… (3 more)"
    hidden = replace(apis[1], hidden=True)
    assert api_index([apis[0], hidden, apis[2]]) == "find(query, limit?), count()"
