"""REST: the happy paths, and every kind of bad input getting a clear 4xx that writes nothing."""

import json

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.apps.builtin import BUILTIN
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import Reward, Task, TaskStatus
from tests.factories import bearer, make_keys

TASK = {"task_ref": "wallet_balance-1"}


@pytest.fixture
def env(sqlite_db):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    client = TestClient(create_app())
    return client, keys


def count_rows(model=Task) -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(model))


def create(client, key, body=None, **headers):
    return client.post("/v1/tasks", json=body or TASK, headers={**bearer(key), **headers})


def test_create_get_and_dispatch(env):
    client, keys = env
    resp = create(client, keys.tenant_a_client)
    assert resp.status_code == 202, resp.text
    task = resp.json()
    assert task["status"] == "queued" and task["instruction"] == BUILTIN.task("wallet_balance-1").instruction
    assert task["apps"] == ["wallet"] and resp.headers["Location"] == f"/v1/tasks/{task['id']}"
    got = client.get(f"/v1/tasks/{task['id']}", headers=bearer(keys.tenant_a_client)).json()
    assert got["id"] == task["id"]
    with session_scope() as s:
        assert s.get(Task, task["id"]).dispatched_at is not None  # published after the commit


def test_free_instruction_over_named_apps(env):
    client, keys = env
    body = {"instruction": "Tidy my notes.", "apps": ["notes", "notes"], "seed": 4, "metadata": {"k": "v"}}
    task = create(client, keys.tenant_a_client, body).json()
    assert task["apps"] == ["notes"] and task["task_ref"] is None and task["metadata"] == {"k": "v"}


def test_idempotency_key_replays_and_rejects_a_different_body(env):
    client, keys = env
    first = create(client, keys.tenant_a_client, **{"Idempotency-Key": "abc"})
    again = create(client, keys.tenant_a_client, **{"Idempotency-Key": "abc"})
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    other = create(client, keys.tenant_a_client, {"task_ref": "wallet_balance-2"}, **{"Idempotency-Key": "abc"})
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert count_rows() == 1
    # keys are per tenant
    assert create(client, keys.tenant_b_client, **{"Idempotency-Key": "abc"}).json()["id"] != first.json()["id"]


@pytest.mark.parametrize(
    ("body", "status", "code", "needle"),
    [
        ('{"task_ref": "wallet_balance-1",', 400, "invalid_json", "not valid JSON"),
        ("[1, 2]", 422, "invalid_request", "body"),
        ({"instruction": "x", "apps": ["bank"]}, 422, "invalid_request", "unknown app(s) 'bank'"),
        ({"task_ref": "no_such_task-1"}, 422, "invalid_request", "unknown task_ref"),
        ({"task_ref": "wallet_balance-1", "world": "mars"}, 422, "invalid_request", "unknown world"),
        ({"task_ref": "wallet_balance-1", "instruction": "x"}, 422, "invalid_request", "leave out"),
        ({"instruction": "x"}, 422, "invalid_request", "needs `apps`"),
        ({"task_ref": "wallet_balance-1", "colour": "red"}, 422, "invalid_request", "colour"),
        ({"task_ref": "wallet_balance-1", "seed": -1}, 422, "invalid_request", "seed"),
    ],
)
def test_bad_task_bodies_get_clear_errors_and_write_nothing(env, body, status, code, needle):
    client, keys = env
    content = body if isinstance(body, str) else json.dumps(body)
    resp = client.post(
        "/v1/tasks", content=content, headers={**bearer(keys.tenant_a_client), "Content-Type": "application/json"}
    )
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code
    assert needle in resp.json()["error"]["message"]
    assert count_rows() == 0


def test_oversized_bodies_are_refused_with_or_without_content_length(env, configure_env):
    configure_env(MAX_BODY_BYTES=2048)
    client = TestClient(create_app())
    _, keys = env
    big = json.dumps({"instruction": "x" * 5000, "apps": ["notes"]}).encode()
    resp = client.post(
        "/v1/tasks", content=big, headers={**bearer(keys.tenant_a_client), "Content-Type": "application/json"}
    )
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "payload_too_large"

    def chunks():
        for i in range(0, len(big), 512):
            yield big[i : i + 512]

    resp = client.post(
        "/v1/tasks", content=chunks(), headers={**bearer(keys.tenant_a_client), "Content-Type": "application/json"}
    )
    assert "content-length" not in {k.lower() for k in resp.request.headers}
    assert resp.status_code == 413
    assert count_rows() == 0


@pytest.mark.parametrize("header", [None, "Bearer al_wrong", "Basic dXNlcjpwYXNz", "Bearer "])
def test_missing_or_wrong_keys_are_401(env, header):
    client, _ = env
    headers = {"Authorization": header} if header else {}
    for method, path in [("post", "/v1/tasks"), ("get", "/v1/tasks"), ("get", "/v1/apps")]:
        resp = client.request(method, path, json=TASK, headers=headers)
        assert resp.status_code == 401, (method, path)
        assert resp.headers["WWW-Authenticate"] == "Bearer"
        assert resp.json()["error"]["code"] == "unauthenticated"
    assert count_rows() == 0


def test_revoked_key_is_refused(env):
    from agentloop.api.auth import hash_key
    from agentloop.store.models import ApiKey, utcnow

    client, keys = env
    with session_scope() as s:
        s.execute(
            sa.update(ApiKey).where(ApiKey.key_hash == hash_key(keys.tenant_b_client)).values(revoked_at=utcnow())
        )
    assert create(client, keys.tenant_b_client).status_code == 401


def test_a_tenant_never_sees_another_tenants_task(env):
    client, keys = env
    task_id = create(client, keys.tenant_a_client).json()["id"]
    other = bearer(keys.tenant_b_client)
    for method, path, body in [
        ("get", f"/v1/tasks/{task_id}", None),
        ("get", f"/v1/tasks/{task_id}/steps", None),
        ("get", f"/v1/tasks/{task_id}/events", None),
        ("post", f"/v1/tasks/{task_id}/cancel", None),
        ("post", f"/v1/tasks/{task_id}/feedback", {"reward": 1.0}),
    ]:
        resp = client.request(method, path, json=body, headers=other)
        assert resp.status_code == 404, (path, resp.text)
        assert resp.json()["error"]["code"] == "not_found"
    assert client.get("/v1/tasks", headers=other).json()["items"] == []
    with session_scope() as s:
        task = s.get(Task, task_id)
        assert task.status == TaskStatus.QUEUED and not task.cancel_requested
    assert count_rows(Reward) == 0


def test_list_is_paged_newest_first_and_filters_by_status(env):
    client, keys = env
    ids = [
        create(client, keys.tenant_a_client, {"task_ref": f"wallet_balance-{i % 3 + 1}"}).json()["id"] for i in range(5)
    ]
    client.post(f"/v1/tasks/{ids[0]}/cancel", headers=bearer(keys.tenant_a_client))
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/tasks", params=params, headers=bearer(keys.tenant_a_client)).json()
        seen += [t["id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    cancelled = client.get("/v1/tasks", params={"status": "cancelled"}, headers=bearer(keys.tenant_a_client)).json()
    assert [t["id"] for t in cancelled["items"]] == [ids[0]]
    bad = client.get("/v1/tasks", params={"status": "lost"}, headers=bearer(keys.tenant_a_client))
    assert bad.status_code == 422 and "unknown status" in bad.json()["error"]["message"]
    bad = client.get("/v1/tasks", params={"cursor": "%%%"}, headers=bearer(keys.tenant_a_client))
    assert bad.status_code == 422 and "cursor" in bad.json()["error"]["message"]


def test_cancel_queued_then_conflict(env):
    client, keys = env
    task_id = create(client, keys.tenant_a_client).json()["id"]
    resp = client.post(f"/v1/tasks/{task_id}/cancel", headers=bearer(keys.tenant_a_client))
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    again = client.post(f"/v1/tasks/{task_id}/cancel", headers=bearer(keys.tenant_a_client))
    assert again.status_code == 409 and "already ended" in again.json()["error"]["message"]


def test_cancel_running_asks_the_worker_to_stop(env):
    client, keys = env
    task_id = create(client, keys.tenant_a_client).json()["id"]
    with session_scope() as s:
        s.get(Task, task_id).status = TaskStatus.RUNNING
    resp = client.post(f"/v1/tasks/{task_id}/cancel", headers=bearer(keys.tenant_a_client)).json()
    assert resp["status"] == "running" and resp["cancel_requested"] is True


def test_feedback_only_for_ended_tasks_and_validated(env):
    client, keys = env
    task_id = create(client, keys.tenant_a_client).json()["id"]
    url, auth = f"/v1/tasks/{task_id}/feedback", bearer(keys.tenant_a_client)
    assert client.post(url, json={"reward": 1.0}, headers=auth).status_code == 409
    with session_scope() as s:
        s.get(Task, task_id).status = TaskStatus.FINISHED
    assert client.post(url, json={"reward": 1.5}, headers=auth).status_code == 422
    assert client.post(url, json={"score": 1}, headers=auth).status_code == 422
    assert count_rows(Reward) == 0
    resp = client.post(url, json={"reward": 0.75, "comment": "close"}, headers=auth)
    assert resp.status_code == 201 and resp.json()["reward"] == 0.75
    with session_scope() as s:
        (reward,) = s.scalars(sa.select(Reward)).all()
        assert (reward.source, reward.value, reward.comment) == ("client", 0.75, "close")


def test_steps_of_a_task_not_started_yet(env):
    client, keys = env
    task_id = create(client, keys.tenant_a_client).json()["id"]
    page = client.get(f"/v1/tasks/{task_id}/steps", headers=bearer(keys.tenant_a_client)).json()
    assert page == {"episode": None, "items": []}


def test_apps_and_their_docs(env):
    client, keys = env
    apps = {a["name"]: a for a in client.get("/v1/apps", headers=bearer(keys.tenant_a_client)).json()}
    assert {"api_docs", "supervisor", "notes", "wallet"} <= set(apps)
    assert apps["wallet"]["apis"] >= 8
    docs = client.get("/v1/apps/wallet/apis", headers=bearer(keys.tenant_a_client)).json()
    send = next(d for d in docs if d["api"] == "send_money")
    assert {p["name"] for p in send["parameters"]} == {"access_token", "receiver_email", "amount", "note"}
    missing = client.get("/v1/apps/bank/apis", headers=bearer(keys.tenant_a_client))
    assert missing.status_code == 404 and "bank" in missing.json()["error"]["message"]


def test_health_ready_and_metrics(env):
    client, keys = env
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"database": "ok", "migrations": "ok", "broker": "ok"}
    create(client, keys.tenant_a_client)
    assert client.get("/metrics", headers=bearer(keys.tenant_a_client)).status_code == 403
    assert client.get("/metrics", headers=bearer(keys.tenant_a_admin)).status_code == 403  # the operator's
    metrics = client.get("/metrics", headers=bearer(keys.operator)).text
    assert 'agentloop_tasks{status="queued"} 1.0' in metrics
    # by route template and status, and the time to each response's start
    assert 'agentloop_http_requests_total{method="POST",route="/v1/tasks",status="202"}' in metrics
    assert 'agentloop_http_requests_total{method="GET",route="/metrics",status="403"}' in metrics
    assert 'agentloop_http_request_seconds_count{method="POST",route="/v1/tasks"}' in metrics


def test_readyz_reports_an_unmigrated_database(tmp_path, configure_env):
    configure_env(DATABASE_URL=f"sqlite:///{tmp_path / 'empty.db'}")
    resp = TestClient(create_app()).get("/readyz")
    assert resp.status_code == 503 and "agentloop migrate" in resp.json()["checks"]["migrations"]


def test_unknown_route_is_a_json_404(env):
    client, _ = env
    resp = client.get("/v1/nothing")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


def test_twenty_parallel_posts_with_one_idempotency_key_make_one_task(db_url):
    """Served by uvicorn, posted from 20 threads at once, on SQLite and PostgreSQL."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from tests.apps.loopback_app import serve_app

    with get_sessionmaker()() as s:
        keys = make_keys(s)
    headers = {**bearer(keys.tenant_a_client), "Idempotency-Key": "once"}
    with serve_app(create_app()) as base, ThreadPoolExecutor(20) as pool:
        answers = list(
            pool.map(lambda _: httpx.post(f"{base}/v1/tasks", json=TASK, headers=headers, timeout=30), range(20))
        )
    assert [r.status_code for r in answers] == [202] * 20, [r.text for r in answers if r.status_code != 202]
    assert len({r.json()["id"] for r in answers}) == 1
    assert count_rows() == 1
