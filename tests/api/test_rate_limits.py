"""Request rates per key and per tenant (REST and gRPC: 429 / RESOURCE_EXHAUSTED with Retry-After, nothing
done), kept in Redis when there is one and shared by every API process; a Redis outage is a 503 with the
reason; quotas on tasks queued or running and on registered apps per tenant."""

import asyncio

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.api.auth import Principal
from agentloop.api.errors import RateLimited
from agentloop.api.rate_limits import Limiter, _Config
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.settings import Settings
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import App, Task, TaskStatus
from tests.apps.loopback_app import LOOPBACK_NETWORKS
from tests.factories import bearer, make_keys
from tests.grpc.conftest import auth

TASK = {"task_ref": "wallet_balance-1"}


@pytest.fixture
def limited(sqlite_db, configure_env):
    configure_env(RATE_LIMIT_PER_KEY="3/minute", RATE_LIMIT_PER_TENANT="5/minute")
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), keys


def rows(model=Task) -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(model))


def test_a_key_over_its_rate_is_429_with_retry_after_and_nothing_is_done(limited):
    client, keys = limited
    a = bearer(keys.tenant_a_client)
    assert [client.get("/v1/tasks", headers=a).status_code for _ in range(3)] == [200] * 3
    resp = client.post("/v1/tasks", json=TASK, headers=a)
    assert resp.status_code == 429
    assert 1 <= int(resp.headers["retry-after"]) <= 60
    assert resp.json()["error"]["code"] == "rate_limited"
    assert "this API key's rate limit (3 per 1 minute) is reached; retry in" in resp.json()["error"]["message"]
    assert rows() == 0
    # another key of the same tenant has its own rate (the tenant's, 5, is not spent yet)
    assert client.get("/v1/tasks", headers=bearer(keys.tenant_a_admin)).status_code == 200


def test_a_tenants_keys_share_its_rate_and_other_tenants_do_not(limited):
    client, keys = limited
    answers = [client.get("/v1/tasks", headers=bearer(k)) for k in [keys.tenant_a_client] * 3]
    answers += [client.get("/v1/tasks", headers=bearer(k)) for k in [keys.tenant_a_admin] * 3]
    # the tenant's 5 spent by its two keys together; the admin key has spent 3 of its own
    assert [r.status_code for r in answers] == [200, 200, 200, 200, 200, 429]
    assert "this tenant's rate limit (5 per 1 minute) is reached" in answers[-1].json()["error"]["message"]
    assert client.get("/v1/tasks", headers=bearer(keys.tenant_b_client)).status_code == 200
    # requests without a valid key are 401 and spend nothing
    assert client.get("/v1/tasks", headers=bearer("nope")).status_code == 401


def test_the_grpc_api_has_the_same_rates(sqlite_db, configure_env):
    configure_env(RATE_LIMIT_PER_KEY="2/minute")
    from tests.grpc.conftest import Api, ServerThread

    with get_sessionmaker()() as s:
        keys = make_keys(s)
    server = ServerThread()
    api = Api(server, keys)
    try:

        async def scenario() -> grpc.aio.AioRpcError:
            async with api.connect() as c:
                key = auth(keys.tenant_a_client)
                for _ in range(2):
                    await c.agent.ListTasks(pb.ListTasksRequest(), metadata=key)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await c.agent.SubmitTask(pb.SubmitTaskRequest(task_ref="wallet_balance-1"), metadata=key)
                return info.value

        error = asyncio.run(scenario())
    finally:
        server.close()
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailer = dict(error.trailing_metadata())
    assert trailer["agentloop-error-code"] == "rate_limited" and 1 <= int(trailer["retry-after"]) <= 60
    assert rows() == 0


def principal(key_id: str, tenant_id: str) -> Principal:
    return Principal(tenant_id=tenant_id, tenant="t", role="client", key_id=key_id)


def test_in_redis_the_windows_are_shared_by_every_api_process(redis_url):
    import uuid

    config = _Config(redis_url, "3/minute", "")
    first, second = Limiter(config), Limiter(config)  # two API processes' limiters on one Redis
    caller = principal(str(uuid.uuid4()), str(uuid.uuid4()))
    first.admit(caller)
    second.admit(caller)
    first.admit(caller)
    with pytest.raises(RateLimited):
        second.admit(caller)


def test_a_redis_outage_is_a_503_with_the_reason(sqlite_db, configure_env):
    configure_env(REDIS_URL="redis://127.0.0.1:1/0")
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    resp = TestClient(create_app()).post("/v1/tasks", json=TASK, headers=bearer(keys.tenant_a_client))
    assert resp.status_code == 503
    assert resp.json()["error"]["message"].startswith("the rate limiter's store is unavailable (")
    assert rows() == 0


def test_a_bad_rate_setting_is_refused():
    with pytest.raises(ValueError, match="AGENTLOOP_RATE_LIMIT_PER_KEY must look like '600/minute'"):
        Settings(rate_limit_per_key="lots")


def test_a_tenant_at_its_quota_of_active_tasks_waits_for_one_to_end(sqlite_db, configure_env):
    configure_env(MAX_ACTIVE_TASKS_PER_TENANT=2)
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    client = TestClient(create_app())
    a = bearer(keys.tenant_a_client)
    first = client.post("/v1/tasks", json=TASK, headers={**a, "Idempotency-Key": "one"})
    assert first.status_code == 202
    assert client.post("/v1/tasks", json=TASK, headers=a).status_code == 202
    resp = client.post("/v1/tasks", json=TASK, headers=a)
    assert (resp.status_code, resp.headers["retry-after"]) == (429, "5")
    assert resp.json()["error"]["code"] == "quota_exceeded"
    assert "has 2 tasks queued or running, its quota (AGENTLOOP_MAX_ACTIVE_TASKS_PER_TENANT = 2)" in resp.text
    assert rows() == 2
    # a replay of a task it has is not a new task: answered as before
    replay = client.post("/v1/tasks", json=TASK, headers={**a, "Idempotency-Key": "one"})
    assert replay.status_code == 202 and replay.json()["id"] == first.json()["id"]
    assert client.post("/v1/tasks", json=TASK, headers=bearer(keys.tenant_b_client)).status_code == 202
    with session_scope() as s:
        s.get(Task, first.json()["id"]).status = TaskStatus.FINISHED
    assert client.post("/v1/tasks", json=TASK, headers=a).status_code == 202


def test_a_tenant_at_its_quota_of_apps_deletes_one_first(sqlite_db, configure_env):
    from tests.apps.loopback_app import serve_loopback_app

    configure_env(MAX_APPS_PER_TENANT=1)
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    client = TestClient(create_app())
    op = bearer(keys.operator)
    with serve_loopback_app() as (base_url, doc, _):

        def register(name: str):
            body = {"name": name, "openapi": doc, "base_url": base_url, "allowed_networks": LOOPBACK_NETWORKS}
            return client.post("/v1/apps", json=body, headers=op)

        assert register("first").status_code == 201
        resp = register("second")
        assert resp.status_code == 429 and resp.json()["error"]["code"] == "quota_exceeded"
        assert "has registered 1 apps, its quota (AGENTLOOP_MAX_APPS_PER_TENANT = 1)" in resp.text
        assert rows(App) == 1
        assert client.delete("/v1/apps/first", headers=op).status_code == 204
        assert register("second").status_code == 201


def test_a_refused_request_counts_in_none_of_its_windows(redis_url):
    """All of a request's windows are checked, then counted, in one script: refused by its tenant's window, it
    spends nothing of its key's either (a second process's limiter, with no tenant limit, sees the key's window)."""
    import uuid

    both = Limiter(_Config(redis_url, "3/minute", "2/minute"))
    key_only = Limiter(_Config(redis_url, "3/minute", ""))
    caller = principal(str(uuid.uuid4()), str(uuid.uuid4()))
    both.admit(caller)
    both.admit(caller)
    with pytest.raises(RateLimited, match=r"this tenant's rate limit \(2 per 1 minute\) is reached; retry in"):
        both.admit(caller)
    key_only.admit(caller)  # the key's third: the refused request did not spend it
    with pytest.raises(RateLimited, match=r"this API key's rate limit \(3 per 1 minute\) is reached"):
        key_only.admit(caller)


def test_rest_and_grpc_count_in_the_same_redis_windows(sqlite_db, configure_env, redis_url):
    """One key's requests through REST and gRPC are counted together in Redis, and REST's refusal names the
    window; another key of the tenant is not refused."""
    configure_env(REDIS_URL=redis_url, RATE_LIMIT_PER_KEY="4/minute", RATE_LIMIT_PER_TENANT="")
    from tests.grpc.conftest import Api, ServerThread

    with get_sessionmaker()() as s:
        keys = make_keys(s)
    client = TestClient(create_app())
    a = bearer(keys.tenant_a_client)
    assert [client.get("/v1/tasks", headers=a).status_code for _ in range(2)] == [200, 200]
    server = ServerThread()
    api = Api(server, keys)
    try:

        async def two_calls() -> None:
            async with api.connect() as c:
                for _ in range(2):
                    await c.agent.ListTasks(pb.ListTasksRequest(), metadata=auth(keys.tenant_a_client))

        asyncio.run(two_calls())
    finally:
        server.close()
    resp = client.get("/v1/tasks", headers=a)
    assert resp.status_code == 429, resp.text
    assert "this API key's rate limit (4 per 1 minute) is reached" in resp.json()["error"]["message"]
    assert client.get("/v1/tasks", headers=bearer(keys.tenant_a_admin)).status_code == 200
