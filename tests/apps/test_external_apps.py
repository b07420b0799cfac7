"""External apps over OpenAPI, against a real HTTP app served on loopback: registration and its
safety checks, calls (and every way a call can go wrong), and use as an evaluation environment."""

import copy

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.agent.actions import render_action
from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.prompt import ChatFormat
from agentloop.api.app import create_app
from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.external import ExternalApp
from agentloop.apps.openapi import AppRegistrationError, parse_document
from agentloop.apps.remote_http import HttpLimits
from agentloop.apps.tasks import ToolCall
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import App
from tests.apps.loopback_app import API_KEY, LOOPBACK_NETWORKS, serve_loopback_app
from tests.factories import bearer, make_keys


@pytest.fixture(scope="module")
def loopback():
    with serve_loopback_app() as served:
        yield served


@pytest.fixture
def api(sqlite_db):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), keys


def registration(base_url, doc, **extra):
    return {
        "name": "todolite",
        "description": "A to-do list.",
        "openapi": doc,
        "base_url": base_url,
        "auth_header": {"name": "X-Api-Key", "value": API_KEY},
        **extra,
    }


def app_rows() -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(App))


def test_document_checks(loopback):
    _, doc, _ = loopback
    ops = {o.operation_id: o for o in parse_document(doc, ("X-Api-Key",))}
    assert {"list_items", "add_item", "agentloop_reset"} <= set(ops)
    # headers the service sets itself are not arguments
    assert ops["list_items"].arguments_schema()["properties"] == {}
    assert ops["add_item"].arguments_schema()["required"] == ["name"]
    for broken, needle in [
        ({"paths": {}}, "OpenAPI 3"),
        ({"openapi": "3.1.0", "paths": {}}, 'no "paths"'),
        ({"openapi": "3.1.0", "paths": {"/x": {"get": {"summary": "no id"}}}}, "operationId"),
        ({"openapi": "3.1.0", "paths": {"/x/{id}": {"get": {"operationId": "x"}}}}, "path parameter 'id'"),
        (
            {"openapi": "3.1.0", "paths": {"/x": {"get": {"operationId": "x", "parameters": [{"$ref": "#/nope"}]}}}},
            "points nowhere",
        ),
    ]:
        with pytest.raises(AppRegistrationError, match=needle):
            parse_document(broken)


def test_register_list_and_docs(api, loopback):
    client, keys = api
    base_url, doc, _ = loopback
    resp = client.post(
        "/v1/apps", json=registration(base_url, doc, allowed_networks=LOOPBACK_NETWORKS), headers=bearer(keys.operator)
    )
    assert resp.status_code == 201, resp.text
    assert resp.json()["resettable"] is True and resp.json()["apis"] == 7
    apps = {a["name"]: a for a in client.get("/v1/apps", headers=bearer(keys.tenant_a_client)).json()}
    assert apps["todolite"]["kind"] == "openapi" and "notes" in apps
    docs = client.get("/v1/apps/todolite/apis", headers=bearer(keys.tenant_a_client)).json()
    assert {d["api"] for d in docs} == {"list_items", "add_item", "slow_report", "moved", "garbage", "nested", "huge"}
    # another tenant does not see it
    assert "todolite" not in {a["name"] for a in client.get("/v1/apps", headers=bearer(keys.tenant_b_client)).json()}
    with get_sessionmaker()() as s:
        row = s.scalars(sa.select(App)).one()
        assert API_KEY not in (row.auth_header_encrypted or "")  # stored encrypted


@pytest.mark.parametrize(
    ("base_url", "key", "extra", "status", "needle"),
    [
        ("http://127.0.0.1:{port}", "tenant_a_admin", {}, 422, "127.0.0.1 (loopback)"),
        ("http://169.254.169.254/", "tenant_a_admin", {}, 422, "169.254.169.254"),
        ("http://10.0.0.7/api", "tenant_a_admin", {}, 422, "10.0.0.7"),
        ("http://localhost:{port}", "tenant_a_admin", {}, 422, "loopback"),
        ("http://127.0.0.1:{port}", "tenant_a_admin", {"allowed_networks": LOOPBACK_NETWORKS}, 403, "operator key"),
        ("http://127.0.0.1:{port}", "operator", {"allow_private": True}, 422, "replaced by allowed_networks"),
        ("ftp://example.com/", "tenant_a_admin", {}, 422, "http(s) URL"),
        ("http://user:pw@example.com/", "tenant_a_admin", {}, 422, "credentials"),
        ("http://example.com:99999/", "tenant_a_admin", {}, 422, "port must be a number from 1 to 65535"),
        ("http://example.com:0/", "tenant_a_admin", {}, 422, "port must be a number from 1 to 65535"),
        ("http://example.com:http/", "tenant_a_admin", {}, 422, "port must be a number from 1 to 65535"),
    ],
)
def test_unsafe_or_bad_registrations_are_refused(api, loopback, base_url, key, extra, status, needle):
    client, keys = api
    url, doc, _ = loopback
    port = url.rsplit(":", 1)[1]
    resp = client.post(
        "/v1/apps", json=registration(base_url.format(port=port), doc, **extra), headers=bearer(getattr(keys, key))
    )
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["error"]["message"]
    assert app_rows() == 0


def test_malformed_document_duplicate_and_builtin_names(api, loopback):
    client, keys = api
    base_url, doc, _ = loopback
    admin = bearer(keys.operator)
    bad = client.post(
        "/v1/apps", json=registration(base_url, {"swagger": "2.0"}, allowed_networks=LOOPBACK_NETWORKS), headers=admin
    )
    assert bad.status_code == 422 and "OpenAPI 3" in bad.json()["error"]["message"]
    assert (
        client.post(
            "/v1/apps", json=registration(base_url, doc, allowed_networks=LOOPBACK_NETWORKS), headers=admin
        ).status_code
        == 201
    )
    dup = client.post("/v1/apps", json=registration(base_url, doc, allowed_networks=LOOPBACK_NETWORKS), headers=admin)
    assert dup.status_code == 409 and "already registered" in dup.json()["error"]["message"]
    taken = client.post(
        "/v1/apps",
        json={**registration(base_url, doc, allowed_networks=LOOPBACK_NETWORKS), "name": "notes"},
        headers=admin,
    )
    assert taken.status_code == 409 and "built-in" in taken.json()["error"]["message"]
    assert app_rows() == 1
    assert client.delete("/v1/apps/todolite", headers=admin).status_code == 204
    assert app_rows() == 0


def episode_over(app: ExternalApp, tokenizer, calls: list[ToolCall]):
    from agentloop.policy.scripted import ScriptedPolicy

    world = BUILTIN.new_world(0, [])
    world.attach(app.spec())
    ep = Episode(world, ChatFormat(tokenizer), "use my list", Limits(max_turns=len(calls) + 1), key="k")
    policy = ScriptedPolicy(tokenizer)
    policy.plan("k", [render_action(c) for c in calls])
    run_episodes(policy, [ep])
    return ep


def test_misbehaving_app_yields_error_observations_not_a_crash(loopback, tokenizer):
    base_url, doc, _ = loopback
    app = ExternalApp.build(
        "todolite",
        "",
        doc,
        base_url,
        allowed_networks=LOOPBACK_NETWORKS,
        auth_header=("X-Api-Key", API_KEY),
        limits=HttpLimits(connect_s=2, total_s=1.0, max_bytes=1_000_000),
    )
    ep = episode_over(
        app,
        tokenizer,
        [
            ToolCall("todolite", "add_item", {"name": "pears"}),
            ToolCall("todolite", "slow_report", {}),
            ToolCall("todolite", "moved", {}),
            ToolCall("todolite", "garbage", {}),
            ToolCall("todolite", "nested", {}),
            ToolCall("todolite", "huge", {}),
            ToolCall("todolite", "add_item", {}),
            ToolCall("todolite", "list_items", {}),
        ],
    )
    obs = [t.observation for t in ep.turns]
    assert '"count": 1' in obs[0]
    assert "did not answer within 1 s" in obs[1]
    assert "redirect" in obs[2] and "not followed" in obs[2]
    assert "claims to be JSON but is not" in obs[3]
    assert "nested too deeply" in obs[4]
    assert "larger than 1000000 bytes" in obs[5]
    assert "422" in obs[6] and "name" in obs[6]  # checked against the schema before any request
    assert "pears" in obs[7]
    assert ep.finish_reason == "completed"


def test_wrong_auth_header_is_an_observation(loopback, tokenizer):
    base_url, doc, _ = loopback
    app = ExternalApp.build(
        "todolite", "", doc, base_url, allowed_networks=LOOPBACK_NETWORKS, auth_header=("X-Api-Key", "wrong")
    )
    ep = episode_over(app, tokenizer, [ToolCall("todolite", "list_items", {})])
    assert "401" in ep.turns[0].observation and "X-Api-Key" in ep.turns[0].observation


def test_private_address_refused_at_call_time_too(loopback):
    base_url, doc, _ = loopback
    app = ExternalApp.build(
        "todolite",
        "",
        doc,
        base_url,
    )
    with pytest.raises(ApiError, match=r"refused to call 127\.0\.0\.1"):
        app.spec().apis["list_items"].handler(None)


def test_reset_and_evaluate_run_in_their_own_episode(loopback):
    base_url, doc, calls = loopback
    app = ExternalApp.build(
        "todolite", "", doc, base_url, allowed_networks=LOOPBACK_NETWORKS, auth_header=("X-Api-Key", API_KEY)
    )
    first, second = app.fork(), app.fork()
    e1, e2 = first.environment(), second.environment()
    assert {t["task_ref"] for t in e1.tasks()} == {"add-apple", "add-two"}
    ep1, ep2 = e1.reset("add-apple"), e2.reset("add-two")
    assert ep1 != ep2
    first.spec().apis["add_item"].handler(None, name="apple")
    second.spec().apis["add_item"].handler(None, name="bread")
    assert e1.evaluate("add-apple", None) == (2, 2)
    assert e2.evaluate("add-two", None) == (1, 3)  # milk is missing, so the count is off too
    assert ("add-apple", ep1) in calls.evaluations and ("add-two", ep2) in calls.evaluations


def test_served_task_on_a_resettable_app(api, loopback, tokenizer):
    """POST a task naming the app's task; the runner resets the app, the agent works, the app evaluates."""
    from agentloop.agent.runner import run_served_task
    from agentloop.policy.scripted import ScriptedPolicy
    from agentloop.settings import get_settings
    from agentloop.store.models import Reward, Task

    client, keys = api
    base_url, doc, calls = loopback
    admin = bearer(keys.operator)
    assert (
        client.post(
            "/v1/apps", json=registration(base_url, doc, allowed_networks=LOOPBACK_NETWORKS), headers=admin
        ).status_code
        == 201
    )
    unknown = client.post("/v1/tasks", json={"task_ref": "todolite:nope"}, headers=admin)
    assert unknown.status_code == 422 and "offers no task 'nope'" in unknown.json()["error"]["message"]
    task = client.post("/v1/tasks", json={"task_ref": "todolite:add-two"}, headers=admin).json()
    assert task["instruction"] == "Add the items bread and milk to my list." and task["apps"] == ["todolite"]

    policy = ScriptedPolicy(tokenizer)
    policy.plan(task["id"], [render_action(ToolCall("todolite", "add_item", {"name": n})) for n in ("bread", "milk")])
    resets_before = len(calls.resets)
    assert run_served_task(task["id"], "test-worker", policy, get_settings()) == "finished"
    assert calls.resets[resets_before:] == ["add-two"]
    with get_sessionmaker()() as s:
        row = s.get(Task, task["id"])
        assert (row.reward, row.success) == (1.0, True)
        reward = s.scalars(sa.select(Reward).where(Reward.task_id == task["id"])).one()
        assert reward.details["passed"] == 3

    # a free instruction cannot use an app that is an environment: its episodes start from its tasks
    # (tests/apps/test_app_outages.py: one that is not an environment can be used)
    free = client.post(
        "/v1/tasks", json={"instruction": "List my items.", "apps": ["todolite", "notes"]}, headers=admin
    )
    assert free.status_code == 422 and "'todolite:<task>'" in free.json()["error"]["message"]


def test_eval_command_on_an_external_app(api, loopback, tmp_path, tiny_model_dir, configure_env):
    from agentloop.agent.eval_runs import run_eval_command
    from agentloop.settings import get_settings
    from agentloop.store.models import EvalRun

    configure_env(MODEL=tiny_model_dir)
    client, keys = api
    base_url, doc, calls = loopback
    client.post(
        "/v1/apps",
        json=registration(base_url, copy.deepcopy(doc), allowed_networks=LOOPBACK_NETWORKS),
        headers=bearer(keys.operator),
    )
    refs = tmp_path / "refs.txt"
    refs.write_text("add-apple\nadd-two\n")
    before = len(calls.resets)
    summary = run_eval_command(
        get_settings(),
        world="builtin",
        split=None,
        policy="random",
        k=2,
        limit=None,
        app_name="todolite",
        tenant=None,
        task_refs=refs,
        max_turns=3,
        max_new_tokens=None,
        temperature=0.0,
        batch_size=4,
    )
    assert summary["episodes"] == 4 and summary["tasks"] == 2
    assert sorted(calls.resets[before:]) == ["add-apple", "add-apple", "add-two", "add-two"]
    episodes = [e for _, e in calls.evaluations[-4:]]
    assert len(set(episodes)) == 4  # each episode evaluated in its own reset copy
    with get_sessionmaker()() as s:
        run = s.get(EvalRun, summary["eval_run"])
        assert run.status == "finished" and run.app == "todolite" and run.metrics["episodes"] == 4
    refs.write_text("add-apple\nmissing\n")
    with pytest.raises(ValueError, match="does not offer task"):
        run_eval_command(
            get_settings(),
            world="builtin",
            split=None,
            policy="random",
            k=1,
            limit=None,
            app_name="todolite",
            tenant=None,
            task_refs=refs,
            max_turns=2,
            max_new_tokens=None,
            temperature=0.0,
            batch_size=4,
        )
